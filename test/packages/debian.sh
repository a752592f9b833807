#!/usr/bin/env bash
# The relay's service files and the Debian packages, on this machine:
#
# 1. `cmake --install` into a scratch prefix puts the relay, the systemd
#    unit template, its example env file and its sysusers.d entry where
#    they belong; the unit has the keys the exit-code contract needs and
#    passes `systemd-analyze verify`; the example names every setting.
#    So is the man page pg_outbox_relay(1).
# 2. debian/control(.in), debian/changelog and META.json name one
#    maintainer. `make deb` builds postgresql-15-pg-outbox and
#    pg-outbox-relay; lintian finds no error in them (its warnings are
#    shown); the relay's package holds the man page.
# 3. Holding the install lock (see with_install_lock in scripts/lib.sh):
#    installs both, checks what `dpkg -L` lists, the installed unit and
#    `man pg_outbox_relay`, runs the demo on the installed extension and
#    relay, purges both and puts back the files they replaced (a `make
#    install` of the extension).
#
# Prints an "ok" or "not ok" line per check and ends with
# "N passed, N failed". PACKAGES_TEST_DEMO=0 skips the demo.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh

VERSION=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" pg_outbox.control)
DEB_DIR=build/deb
EXT_PKG=postgresql-15-pg-outbox
RELAY_PKG=pg-outbox-relay
RELAY_USER=pg_outbox_relay

# Records a check's outcome: result NAME STATUS [LOG].
result() {
	local name=$1 status=$2 log=${3:-}
	if [ "$status" -eq 0 ]; then
		echo "ok - $name" | tee -a "$WORK/results"
	else
		echo "not ok - $name" | tee -a "$WORK/results"
		[ -z "$log" ] || sed 's/^/    /' "$log"
	fi
}

# Runs a check: check NAME COMMAND [ARG ...]; its output is shown on failure.
check() {
	local name=$1 status=0
	shift
	"$@" >"$WORK/check.log" 2>&1 || status=$?
	result "$name" "$status" "$WORK/check.log"
}

# Prints "Section.Key=value" for every setting of a unit file.
unit_settings() {
	awk '/^[[:space:]]*[#;]/ || /^[[:space:]]*$/ { next }
	     /^\[.*\]$/ { section = substr($0, 2, length($0) - 2); next }
	     { i = index($0, "="); print section "." substr($0, 1, i - 1) "=" substr($0, i + 1) }' "$1"
}

# The keys a relay unit must have: unit_keys FILE RELAY_BINARY.
unit_keys() {
	local unit=$1 relay=$2 settings want missing=0
	settings=$(unit_settings "$unit")
	for want in \
		"Unit.Documentation=man:pg_outbox_relay(1)" \
		"Service.Type=simple" \
		"Service.User=$RELAY_USER" \
		"Service.Environment=PG_OUTBOX_MODE=publish" \
		"Service.Environment=PG_OUTBOX_GROUP=%i" \
		"Service.EnvironmentFile=/etc/pg_outbox/relay-%i.env" \
		"Service.ExecStart=$relay \${PG_OUTBOX_MODE}" \
		"Service.Restart=on-failure" \
		"Service.RestartPreventExitStatus=2" \
		"Service.NoNewPrivileges=yes" \
		"Service.ProtectSystem=strict" \
		"Service.ProtectHome=yes" \
		"Service.PrivateTmp=yes" \
		"Install.WantedBy=multi-user.target"; do
		if ! grep -qxF "$want" <<<"$settings"; then
			echo "$unit: missing $want"
			missing=1
		fi
	done
	# Exit 2 must stay a failure that is not restarted.
	if grep -E '^Service\.(SuccessExitStatus|RestartForceExitStatus)=' <<<"$settings" | grep -qw 2; then
		echo "$unit: exit status 2 is made a success or forced to restart"
		missing=1
	fi
	return "$missing"
}

# systemd-analyze verify and security on a copy of the template named as
# an instance (a template alone is not a unit systemd can load).
unit_verify() {
	local unit=$1 dir
	dir=$(mktemp -d "$WORK/verify.XXXXXX")
	cp "$unit" "$dir/pg_outbox_relay@billing.service"
	# verify prints problems (unknown keys, a missing binary) on stderr,
	# some without failing: any output is a failure.
	systemd-analyze verify "$dir/pg_outbox_relay@billing.service" >"$dir/out" 2>&1 || { cat "$dir/out"; return 1; }
	if [ -s "$dir/out" ]; then
		cat "$dir/out"
		return 1
	fi
	# "OK" is an exposure below 2.0 (of 10).
	systemd-analyze security --offline=true --threshold=20 "$dir/pg_outbox_relay@billing.service" >"$dir/out" 2>&1 ||
		{ grep -E 'Overall|✗' "$dir/out"; return 1; }
	grep Overall "$dir/out"
}

# The example env file names every environment variable the relay reads.
env_example_complete() {
	local example=$1 names var missing=0
	names=$(grep -o 'envname("PG_OUTBOX_[A-Z_]*")' relay/src/config.cpp | sed 's/.*("\(.*\)")/\1/' | sort -u)
	for var in $names PG_OUTBOX_MODE; do
		if ! grep -qE "^#?$var=" "$example"; then
			echo "$example: no $var"
			missing=1
		fi
	done
	return "$missing"
}

# cmake --install into a scratch prefix.
cmake_install_layout() {
	local root=$WORK/cmake-install prefix=/opt/pg_outbox
	build_relay pg_outbox_relay pg_outbox_check pg_outbox_relay_man >/dev/null
	DESTDIR=$root cmake --install build --prefix "$prefix" >/dev/null
	local f
	for f in bin/pg_outbox_relay bin/pg_outbox_check lib/systemd/system/pg_outbox_relay@.service \
		lib/sysusers.d/pg_outbox_relay.conf share/doc/pg_outbox/examples/relay.env \
		share/man/man1/pg_outbox_relay.1 share/man/man1/pg_outbox_check.1; do
		[ -f "$root$prefix/$f" ] || { echo "cmake --install did not install $prefix/$f"; return 1; }
	done
	# The unit names the binary where the install put it.
	unit_keys "$root$prefix/lib/systemd/system/pg_outbox_relay@.service" "$prefix/bin/pg_outbox_relay"
}

# Verifies the cmake-installed unit with the binary at the path it names.
cmake_unit_verify() {
	local root=$WORK/cmake-install prefix=/opt/pg_outbox unit
	unit=$WORK/pg_outbox_relay@.service
	sed "s#^ExecStart=$prefix/bin/pg_outbox_relay #ExecStart=$root$prefix/bin/pg_outbox_relay #" \
		"$root$prefix/lib/systemd/system/pg_outbox_relay@.service" >"$unit"
	grep -q "^ExecStart=$root" "$unit" || { echo "ExecStart not found in the installed unit"; return 1; }
	# Documentation=man:pg_outbox_relay(1): verify runs man, which finds
	# the page cmake --install put there.
	MANPATH="$root$prefix/share/man" unit_verify "$unit"
}

# What dpkg -L must list for each package.
packaged_files() {
	dpkg -L "$EXT_PKG" >"$WORK/ext.list"
	dpkg -L "$RELAY_PKG" >"$WORK/relay.list"
	local f missing=0
	for f in /usr/lib/postgresql/15/lib/pg_outbox.so \
		/usr/share/postgresql/15/extension/pg_outbox.control \
		"/usr/share/postgresql/15/extension/pg_outbox--$VERSION.sql" \
		/usr/share/doc/$EXT_PKG/copyright; do
		grep -qxF "$f" "$WORK/ext.list" || { echo "$EXT_PKG lacks $f"; missing=1; }
	done
	# The scripts of the updates and of the released versions, named from
	# their sources (the upgrade scripts to this version are built from
	# sql/upgrade/, the others frozen in sql/released/).
	for f in sql/upgrade/*--*.sql sql/released/pg_outbox--*.sql; do
		[ -e "$f" ] || continue
		f=$(basename "$f")
		f=pg_outbox--${f#pg_outbox--}
		grep -qxF "/usr/share/postgresql/15/extension/$f" "$WORK/ext.list" ||
			{ echo "$EXT_PKG lacks the script $f"; missing=1; }
	done
	for f in /usr/bin/pg_outbox_relay /usr/bin/pg_outbox_check \
		/usr/share/man/man1/pg_outbox_relay.1.gz /usr/share/man/man1/pg_outbox_check.1.gz \
		/lib/systemd/system/pg_outbox_relay@.service \
		/usr/lib/sysusers.d/pg_outbox_relay.conf \
		/usr/share/doc/$RELAY_PKG/examples/relay.env \
		/etc/pg_outbox; do
		grep -qxF "$f" "$WORK/relay.list" || { echo "$RELAY_PKG lacks $f"; missing=1; }
	done
	# The extension holds no relay, the relay no extension.
	if grep -q pg_outbox_relay "$WORK/ext.list" || grep -q '/usr/share/postgresql/' "$WORK/relay.list"; then
		echo "a file is in the wrong package"
		missing=1
	fi
	# Every listed file is there.
	while read -r f; do
		[ -e "$f" ] || { echo "listed but missing: $f"; missing=1; }
	done < <(cat "$WORK/ext.list" "$WORK/relay.list")
	return "$missing"
}

# The installed relay reports the control file's version and the
# extension PostgreSQL loads comes from the package.
installed_versions() {
	/usr/bin/pg_outbox_relay --version | grep -qx "$VERSION" || { /usr/bin/pg_outbox_relay --version; return 1; }
	dpkg -S /usr/share/postgresql/15/extension/pg_outbox.control | grep -q "^$EXT_PKG:"
	dpkg-query -W -f='${Version}\n' "$EXT_PKG" "$RELAY_PKG" | grep -vqx "$VERSION" && return 1
	return 0
}

# `man pg_outbox_relay` finds the package's page and renders it without a
# warning, with a section per mode.
installed_man_page() {
	local page err
	page=$(man -w pg_outbox_relay) || return 1
	eq_path "$page" /usr/share/man/man1/pg_outbox_relay.1.gz || return 1
	err=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings pg_outbox_relay 2>&1 >"$WORK/man.txt")
	[ -z "$err" ] || { echo "$err"; return 1; }
	grep -q '^PUBLISH OPTIONS$' "$WORK/man.txt" && grep -q '^CONSUME OPTIONS$' "$WORK/man.txt" ||
		{ echo "no PUBLISH OPTIONS or CONSUME OPTIONS in man pg_outbox_relay"; return 1; }
}

eq_path() {
	[ "$1" = "$2" ] || { echo "man -w pg_outbox_relay: $1, not $2"; return 1; }
}

relay_user() {
	getent passwd "$RELAY_USER" | grep -q ':/usr/sbin/nologin$' || { getent passwd "$RELAY_USER"; return 1; }
}

removed() {
	local p
	for p in "$EXT_PKG" "$RELAY_PKG"; do
		if dpkg-query -W -f='${db:Status-Status}\n' "$p" 2>/dev/null | grep -qv '^not-installed$'; then
			echo "$p is still known to dpkg"
			return 1
		fi
	done
	[ ! -e /usr/bin/pg_outbox_relay ] && [ ! -e /lib/systemd/system/pg_outbox_relay@.service ]
}

# Puts back what the packages replaced and removes the user they created.
restore_machine() {
	if [ -s "$WORK/backup.tar" ]; then
		as_root tar -xpf "$WORK/backup.tar" -C /
	fi
	if [ ! -e "$WORK/user-existed" ] && getent passwd "$RELAY_USER" >/dev/null; then
		as_root userdel "$RELAY_USER" 2>/dev/null || true
	fi
	if [ ! -e "$WORK/group-existed" ] && getent group "$RELAY_USER" >/dev/null; then
		as_root groupdel "$RELAY_USER" 2>/dev/null || true
	fi
}

# Files on the machine that installing the packages would replace.
back_up_replaced_files() {
	local deb
	: >"$WORK/replaced"
	for deb in "$@"; do
		dpkg-deb --fsys-tarfile "$deb" | tar -tvf - | awk '$1 !~ /^d/ { print $6 }' | sed 's#^\./#/#' |
			while read -r f; do
				if [ -e "$f" ] || [ -L "$f" ]; then echo "${f#/}"; fi
			done >>"$WORK/replaced"
	done
	: >"$WORK/backup.tar"
	if [ -s "$WORK/replaced" ]; then
		tar -cpf "$WORK/backup.tar" -C / -T "$WORK/replaced"
	fi
}

# The part that changes the machine; runs holding the install lock.
installed_phase() {
	local debs=("$DEB_DIR/${EXT_PKG}_${VERSION}_"*.deb "$DEB_DIR/${RELAY_PKG}_${VERSION}_"*.deb) status
	for p in "$EXT_PKG" "$RELAY_PKG"; do
		if dpkg-query -W -f='${db:Status-Status}\n' "$p" 2>/dev/null | grep -qv '^not-installed$'; then
			result "$p was not installed before (the test leaves installed packages alone)" 1
			return
		fi
	done
	! getent passwd "$RELAY_USER" >/dev/null || touch "$WORK/user-existed"
	! getent group "$RELAY_USER" >/dev/null || touch "$WORK/group-existed"
	back_up_replaced_files "${debs[@]}"
	trap 'purge_packages >/dev/null 2>&1 || true; restore_machine' EXIT

	status=0
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		-o DPkg::Lock::Timeout=300 "${debs[@]/#/./}" >"$WORK/install.log" 2>&1 || status=$?
	result "the packages install (apt-get install ./${EXT_PKG}_*.deb ./${RELAY_PKG}_*.deb)" "$status" "$WORK/install.log"
	if [ "$status" -eq 0 ]; then
		check "dpkg -L lists the extension, the relay, the unit and the example env file" packaged_files
		check "the installed relay and extension are version $VERSION" installed_versions
		check "the package created the user $RELAY_USER (systemd-sysusers)" relay_user
		check "man pg_outbox_relay renders the installed page without a warning" installed_man_page
		check "the installed unit has the keys of the exit-code contract" \
			unit_keys /lib/systemd/system/pg_outbox_relay@.service /usr/bin/pg_outbox_relay
		if command -v systemd-analyze >/dev/null; then
			check "systemd-analyze verify and security accept the installed unit" \
				unit_verify /lib/systemd/system/pg_outbox_relay@.service
		fi
		if [ "${PACKAGES_TEST_DEMO:-1}" != 0 ]; then
			check "the demo passes on the installed extension and relay" \
				env PG_OUTBOX_SKIP_BUILD=1 PG_OUTBOX_RELAY=/usr/bin/pg_outbox_relay ./scripts/demo.sh
			tail -n 1 "$WORK/results" | grep -q '^ok ' &&
				grep -E '^==> relay:|^(injection|relay dies|consumer|new entry|same event|\(end\))|^demo:' "$WORK/check.log" | cut -c 1-150 || true
		fi
	fi
	check "dpkg --purge removes both packages" purge_packages
	check "the packages are gone" removed
	trap - EXIT
	restore_machine
	check "the files the packages replaced are back" restored
}

purge_packages() {
	as_root dpkg --purge "$RELAY_PKG" "$EXT_PKG"
}

restored() {
	local f missing=0
	while read -r f; do
		[ -e "/$f" ] || { echo "not restored: /$f"; missing=1; }
	done <"$WORK/replaced"
	return "$missing"
}

# The maintainer of debian/control and control.in, of every entry of
# debian/changelog and of META.json: one identity.
one_maintainer() {
	local want f got status=0
	want=$(sed -n 's/^Maintainer: //p' debian/control.in)
	[ -n "$want" ] || { echo "debian/control.in has no Maintainer"; return 1; }
	got=$(sed -n 's/^Maintainer: //p' debian/control)
	[ "$got" = "$want" ] || { echo "debian/control: $got, debian/control.in: $want"; status=1; }
	while read -r got; do
		[ "$got" = "$want" ] || { echo "debian/changelog: $got, debian/control.in: $want"; status=1; }
	done < <(sed -n 's/^ -- \(.*>\)  .*/\1/p' debian/changelog)
	got=$(python3 -c 'import json, sys; print("\n".join(json.load(open("META.json"))["maintainer"]))')
	[ "$got" = "$want" ] || { echo "META.json: $got, debian/control.in: $want"; status=1; }
	return "$status"
}

# lintian on what make deb built (the .changes names the .debs and the
# .buildinfo): a failure on an error; its other findings are shown.
lintian_packages() {
	local changes status=0
	changes=$(ls "$DEB_DIR"/pg-outbox_"${VERSION}"_*.changes) || return 1
	lintian --fail-on error --display-info --tag-display-limit 0 "$changes" >"$WORK/lintian.log" 2>&1 || status=$?
	result "lintian finds no error in the packages" "$status" "$WORK/lintian.log"
	if [ "$status" -eq 0 ] && grep -q '^[WIP]: ' "$WORK/lintian.log"; then
		grep '^[WIP]: ' "$WORK/lintian.log" | sed 's/^/# lintian: /'
	fi
}

# The relay's package holds the man pages.
man_pages_packaged() {
	local page missing=0
	dpkg -c "$DEB_DIR/${RELAY_PKG}_${VERSION}_"*.deb >"$WORK/relay.contents" || return 1
	for page in pg_outbox_relay pg_outbox_check; do
		grep -q " \./usr/share/man/man1/$page\.1\.gz\$" "$WORK/relay.contents" ||
			{ echo "${RELAY_PKG} has no usr/share/man/man1/$page.1.gz"; missing=1; }
	done
	return "$missing"
}

if [ "${1:-}" = --installed ]; then
	installed_phase
	exit 0
fi

WORK=$(mktemp -d /tmp/pg_outbox_packages.XXXXXX)
chmod 755 "$WORK"
export WORK
trap 'rm -rf "$WORK"' EXIT
: >"$WORK/results"

ensure_packages lintian
say "the relay's cmake --install and its systemd unit"
check "cmake --install puts the relay, the man pages, the unit, its env example and user where they belong" cmake_install_layout
check "the example env file names every setting the relay reads" env_example_complete relay/systemd/relay.env
if ! command -v systemd-analyze >/dev/null; then
	ensure_packages systemd
fi
if command -v systemd-analyze >/dev/null; then
	check "systemd-analyze verify and security accept the unit (cmake --install)" cmake_unit_verify
else
	echo "# systemd-analyze cannot run here: the unit was checked by its keys only"
fi

check "debian/control(.in), debian/changelog and META.json name one maintainer" one_maintainer
say "make deb (DEB_BUILD_OPTIONS=nocheck: the extension's tests run in make test)"
check "make deb builds ${EXT_PKG} and ${RELAY_PKG} $VERSION" \
	env DEB_BUILD_OPTIONS="nocheck ${DEB_BUILD_OPTIONS:-}" ./scripts/deb.sh
if ls "$DEB_DIR/${EXT_PKG}_${VERSION}_"*.deb "$DEB_DIR/${RELAY_PKG}_${VERSION}_"*.deb >/dev/null 2>&1; then
	lintian_packages
	check "${RELAY_PKG} holds the man pages pg_outbox_relay(1) and pg_outbox_check(1) (dpkg -c)" man_pages_packaged
	say "installing the packages, the demo on them, removing them (holding the install lock)"
	with_install_lock "$0" --installed
fi

passed=$(grep -c '^ok ' "$WORK/results" || true)
failed=$(grep -c '^not ok ' "$WORK/results" || true)
echo "${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
