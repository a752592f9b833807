#!/usr/bin/env bash
# Builds the Debian packages (make deb): postgresql-15-pg-outbox (the
# extension) and pg-outbox-relay (the relay, its systemd unit template and
# example env file), into build/deb/.
#
# The build runs in a copy of the tree (build/deb/pg-outbox-VERSION), so
# that it neither uses nor leaves build products in the tree. Build
# dependencies (debian/control) are installed with apt-get when missing,
# holding the install lock (with_install_lock in scripts/lib.sh).
# DEB_BUILD_OPTIONS=nocheck skips the extension's tests (and their build
# dependencies) during the build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

make -s checkver >/dev/null
version=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" pg_outbox.control)
out=build/deb
src=$out/pg-outbox-$version

if [[ " ${DEB_BUILD_OPTIONS:-} " == *" nocheck "* ]]; then
	export DEB_BUILD_PROFILES="${DEB_BUILD_PROFILES:+$DEB_BUILD_PROFILES }nocheck"
fi

say "copying the tree to $src"
rm -rf "$out"
mkdir -p "$src"
tar -cf - --exclude=./build --exclude=./.git --exclude='./obj-*' . | tar -xf - -C "$src"

ensure_packages dpkg-dev
if ! (cd "$src" && dpkg-checkbuilddeps) >/dev/null 2>&1; then
	say "installing the build dependencies (holding the install lock)"
	sudo=
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	with_install_lock $sudo apt-get update -qq
	with_install_lock $sudo env DEBIAN_FRONTEND=noninteractive apt-get build-dep -y -qq --no-install-recommends \
		${DEB_BUILD_PROFILES:+-P "${DEB_BUILD_PROFILES// /,}"} "$PWD/$src" >/dev/null
fi

say "dpkg-buildpackage -us -uc -b (DEB_BUILD_OPTIONS=${DEB_BUILD_OPTIONS:-})"
(cd "$src" && dpkg-buildpackage -us -uc -b -j"$(nproc)")
rm -rf "$src"
say "packages in $out:"
ls -1 "$out"/*.deb
