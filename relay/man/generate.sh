#!/bin/sh
# Makes the man page pg_outbox_relay(1) with help2man from the relay's own
# --help, so that the page and the options cannot disagree:
#
#   generate.sh HELP2MAN RELAY INCLUDE CHANGELOG OUTPUT
#
# NAME, SYNOPSIS and OPTIONS (the options of every mode) come from
# `RELAY --help`; a section per mode that --help lists under
# "Subcommands:" (PUBLISH OPTIONS, CONSUME OPTIONS) from `RELAY MODE
# --help`, put into the page as help2man formats it for a program of its
# own; the rest from the hand-written INCLUDE.
#
# The page's date is SOURCE_DATE_EPOCH when it is set (dpkg-buildpackage
# sets it from debian/changelog), else the date of the newest entry of
# CHANGELOG (debian/changelog), so that a build makes the same page
# whenever and wherever it runs. No path of the build goes into the page.
set -eu

if [ $# -ne 5 ]; then
	echo "usage: $0 HELP2MAN RELAY INCLUDE CHANGELOG OUTPUT" >&2
	exit 2
fi
help2man=$1 relay=$2 include=$3 changelog=$4 output=$5

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	trailer=$(sed -n 's/^ -- .*>  \(.*\)$/\1/p' "$changelog" | head -n 1)
	if [ -z "$trailer" ]; then
		echo "$0: no dated entry in $changelog: set SOURCE_DATE_EPOCH" >&2
		exit 1
	fi
	SOURCE_DATE_EPOCH=$(date -u -d "$trailer" +%s)
fi
export SOURCE_DATE_EPOCH

work=$output.work
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# The relay's --version prints the bare version, which help2man takes as
# the version of the program named by the file it runs.
version=$("$relay" --version)
case $version in
'' | *[!0-9A-Za-z.~+-]*)
	echo "$0: '$relay --version' printed '$version', not a version" >&2
	exit 1
	;;
esac

# The modes, as --help lists them: "Subcommands:", then a line per mode
# ("  NAME  description"), up to the next blank line.
modes=$("$relay" --help | awk '/^Subcommands:/ { in_list = 1; next }
	in_list && /^[[:space:]]*$/ { in_list = 0 }
	in_list && /^  [a-z]/ { print $1 }')
if [ -z "$modes" ]; then
	echo "$0: '$relay --help' lists no mode under \"Subcommands:\"" >&2
	exit 1
fi

# For each mode, help2man runs a script that calls the relay with the
# mode; the section OPTIONS of that page becomes MODE OPTIONS here, after
# the mode's description (the first line of its --help).
modes_include=$work/modes.h2m
: >"$modes_include"
for mode in $modes; do
	wrapper=$work/pg_outbox_relay-$mode
	printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$relay" "$mode" >"$wrapper"
	chmod +x "$wrapper"
	"$help2man" --no-info --section=1 --version-string="$version" \
		--output="$work/$mode.1" "$wrapper"
	section=$(printf '%s OPTIONS' "$mode" | tr '[:lower:]' '[:upper:]')
	{
		printf '[%s]\n' "$section"
		printf '.B pg_outbox_relay\n.RI [ OPTIONS ]\n.B %s\n.RI [ "%s" ]\n.PP\n' "$mode" "$section"
		# The first line of the mode's --help is its description: a
		# sentence here.
		"$relay" "$mode" --help | head -n 1 | awk '{
			print toupper(substr($0, 1, 1)) substr($0, 2) ($0 ~ /[.]$/ ? "" : ".") }' |
			sed 's/-/\\-/g; s/^[.'"'"']/\\\&&/'
		awk '/^\.SH / { in_options = ($2 == "OPTIONS"); next } in_options' "$work/$mode.1"
	} >>"$modes_include"
	if ! grep -q '^\.TP' "$modes_include"; then
		echo "$0: help2man found no option in '$relay $mode --help'" >&2
		exit 1
	fi
done

"$help2man" --no-info --section=1 \
	--name="relay between pg_outbox feeds and Redis Streams" \
	--include="$modes_include" --include="$include" \
	--output="$output.tmp" "$relay"
mv "$output.tmp" "$output"
