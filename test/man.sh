#!/usr/bin/env bash
# Checks the man page pg_outbox_relay(1) against the relay it documents:
#
#   test/man.sh [RELAY [PAGE [CHECK_PAGE]]]
#
# (default: build/relay/pg_outbox_relay and build/relay/man/pg_outbox_relay.1,
# made by `cmake --build build --target pg_outbox_relay_man`, and
# build/test/soak/pg_outbox_check.1, the history checker's). The page
# renders without a warning (as lintian renders it); every option of
# --help, and of each mode's --help, is an item of OPTIONS and of that
# mode's section, and the page has no other; ENVIRONMENT names every
# variable of --help and of relay/systemd/relay.env and no other; EXIT
# STATUS has the codes of the documentation's "Exit codes"; the page
# holds no path of the build, and making it again gives the same bytes.
# pg_outbox_check(1), written by hand, renders without a warning too.
# Prints an "ok"/"not ok" line per check, then "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
. test/ops/tap.bash

RELAY=${1:-build/relay/pg_outbox_relay}
PAGE=${2:-build/relay/man/pg_outbox_relay.1}
CHECK_PAGE=${3:-build/test/soak/pg_outbox_check.1}
HELP2MAN=${HELP2MAN:-help2man}
for f in "$RELAY" "$PAGE" "$CHECK_PAGE"; do
	[ -e "$f" ] || { echo "# $f not found: build the relay and its man page first" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/pg_outbox_man.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# The page as text, wide enough that no option is broken across lines.
MANWIDTH=200 LC_ALL=C.UTF-8 MANROFFSEQ='' man -E ascii -l "$PAGE" 2>/dev/null | col -bx >"$WORK/page.txt"

# No warning from man (the command lintian runs) or groff: renders_cleanly
# PAGE.
renders_cleanly() {
	local err
	err=$(LC_ALL=C.UTF-8 MANROFFSEQ='' MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$1" 2>&1 >/dev/null)
	[ -z "$err" ] || { echo "# man: $err" >&2; return 1; }
	err=$(groff -ww -man -z "$1" 2>&1)
	[ -z "$err" ] || { echo "# groff: $err" >&2; return 1; }
	[ -n "$(man -l "$1" 2>/dev/null)" ] || { echo "# $1 renders empty" >&2; return 1; }
}
check "pg_outbox_relay(1) renders without a warning (man --warnings, groff -ww)" renders_cleanly "$PAGE"
check "pg_outbox_check(1) renders without a warning" renders_cleanly "$CHECK_PAGE"

# whatis and apropos read the NAME line: whatis_entry PAGE NAME.
whatis_entry() {
	local out
	out=$(lexgrog "$1") || { echo "# $out" >&2; return 1; }
	grep -q "\"$2 - ." <<<"$out" || { echo "# $out" >&2; return 1; }
}
check "lexgrog reads pg_outbox_relay(1)'s NAME line" whatis_entry "$PAGE" pg_outbox_relay
check "lexgrog reads pg_outbox_check(1)'s NAME line" whatis_entry "$CHECK_PAGE" pg_outbox_check

# The body of a section of the rendered page (its heading at column 0).
section() {
	awk -v want="$1" '/^[^ ]/ { inside = ($0 == want); next } inside' "$WORK/page.txt"
}

# The option names of a --help text or of a section's items: the first
# word of each line indented as an item ("  --pg TEXT" in --help, seven
# spaces in the page), split at commas, without a flag's "{false}".
help_options() {
	sed -n 's/^  \(-[^ ]*\).*/\1/p' | tr ',' '\n' | sed 's/{.*//' | sort -u
}
page_options() {
	sed -n 's/^       \(-[^ ]*\).*/\1/p' | tr ',' '\n' | sed 's/{.*//' | sort -u
}

# The options of a --help and those of a section are the same.
same_options() {
	local title=$1 diff
	shift
	"$RELAY" "$@" --help | help_options >"$WORK/help.list"
	section "$title" | page_options >"$WORK/page.list"
	[ -s "$WORK/help.list" ] || { echo "# '$*' --help lists no option" >&2; return 1; }
	diff=$(diff "$WORK/help.list" "$WORK/page.list") ||
		{ echo "# --help (<) and $title (>) differ:" >&2; echo "$diff" | sed 's/^/# /' >&2; return 1; }
}

modes=$("$RELAY" --help | awk '/^Subcommands:/ { in_list = 1; next }
	in_list && /^[[:space:]]*$/ { in_list = 0 }
	in_list && /^  [a-z]/ { print $1 }')
check "--help lists the modes" test -n "$modes"
check "OPTIONS has every option of --help, and no other" same_options OPTIONS
for mode in $modes; do
	title=$(tr '[:lower:]' '[:upper:]' <<<"$mode")" OPTIONS"
	check "$title has every option of '$mode --help', and no other" same_options "$title" "$mode"
done

# ENVIRONMENT: the variables named by --help and by the example env file.
environment_complete() {
	local mode diff
	{
		"$RELAY" --help
		for mode in $modes; do "$RELAY" "$mode" --help; done
	} | grep -o 'Env:PG_OUTBOX_[A-Z_]*' | sed 's/^Env://' >"$WORK/env.want"
	grep -oE '^#?PG_OUTBOX_[A-Z_]+=' relay/systemd/relay.env | tr -d '#=' >>"$WORK/env.want"
	sort -u -o "$WORK/env.want" "$WORK/env.want"
	section ENVIRONMENT | sed -n 's/^ \{7\}\(PG_OUTBOX_[A-Z_]*\).*/\1/p' | sort -u >"$WORK/env.page"
	diff=$(diff "$WORK/env.want" "$WORK/env.page") ||
		{ echo "# --help and relay.env (<), ENVIRONMENT (>) differ:" >&2; echo "$diff" | sed 's/^/# /' >&2; return 1; }
}
check "ENVIRONMENT names every variable of --help and relay.env, and no other" environment_complete

# EXIT STATUS: the codes of the table under the documentation's "Exit
# codes" heading (docs/relay.md, else the README).
exit_codes() {
	local doc diff
	for doc in docs/relay.md README.md; do
		[ -f "$doc" ] && grep -q '^#\+ Exit codes$' "$doc" && break
		doc=
	done
	[ -n "$doc" ] || { echo "# no \"Exit codes\" heading in docs/relay.md or README.md" >&2; return 1; }
	awk '/^#+ Exit codes$/ { inside = 1; next } inside && /^#/ { exit }
		inside && /^\| `[0-9]+` \|/ { print substr($2, 2, length($2) - 2) }' "$doc" >"$WORK/codes.doc"
	section "EXIT STATUS" | sed -n 's/^ \{7\}\([0-9][0-9]*\) .*/\1/p' >"$WORK/codes.page"
	[ -s "$WORK/codes.doc" ] || { echo "# no exit code found in $doc" >&2; return 1; }
	diff=$(diff "$WORK/codes.doc" "$WORK/codes.page") ||
		{ echo "# $doc (<) and EXIT STATUS (>) differ:" >&2; echo "$diff" | sed 's/^/# /' >&2; return 1; }
}
check "EXIT STATUS has the codes of the documentation's \"Exit codes\"" exit_codes

# The title line: the relay's version, and the month of debian/changelog's
# newest entry (the date of the version), not of the build.
title_line() {
	local trailer want got
	trailer=$(sed -n 's/^ -- .*>  \(.*\)$/\1/p' debian/changelog | head -n 1)
	want=".TH PG_OUTBOX_RELAY \"1\" \"$(LC_ALL=C date -u -d "$trailer" '+%B %Y')\" \"pg_outbox_relay $("$RELAY" --version)\" \"User Commands\""
	got=$(grep '^\.TH ' "$PAGE")
	eq "$got" "$want"
}
check "the title has the relay's version and the changelog's date" title_line

no_build_paths() {
	local p hits=0
	for p in "$PWD" "$(cd "$(dirname "$RELAY")" && pwd)" "$(cd "$(dirname "$PAGE")" && pwd)" /tmp/ "${HOME:-/root}"; do
		if grep -qF "$p" "$PAGE"; then
			echo "# the page holds $p" >&2
			hits=1
		fi
	done
	return "$hits"
}
check "the page holds no path of the build" no_build_paths

# Made again elsewhere, at another time, the page is the same.
reproducible() {
	(unset SOURCE_DATE_EPOCH
		relay/man/generate.sh "$HELP2MAN" "$RELAY" relay/man/pg_outbox_relay.h2m debian/changelog "$WORK/again.1") ||
		return 1
	cmp "$PAGE" "$WORK/again.1" || { diff "$PAGE" "$WORK/again.1" | head -n 20 | sed 's/^/# /' >&2; return 1; }
}
check "generate.sh makes the same page again" reproducible

finish
