# Shared helpers of pg_outbox's scripts (sourced, not run).

# Debian packages that building, testing and the demo need.
PG_OUTBOX_PACKAGES=(
	make gcc g++ cmake pkg-config
	postgresql-15 postgresql-server-dev-15 postgresql-common libpq-dev libipc-run-perl
	redis-server libhiredis-dev
	libgtest-dev libcli11-dev libspdlog-dev libfmt-dev libcpp-httplib-dev nlohmann-json3-dev
)

# Prints a progress line.
say() {
	printf '==> %s\n' "$*"
}

# Runs a command as root: directly when root, else through sudo.
as_root() {
	if [ "$(id -u)" -eq 0 ]; then
		"$@"
	else
		sudo "$@"
	fi
}

# Installs the packages above that are missing (apt-get; sudo when not root).
ensure_packages() {
	local missing=() p
	for p in "${PG_OUTBOX_PACKAGES[@]}" "$@"; do
		if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
			missing+=("$p")
		fi
	done
	if [ "${#missing[@]}" -gt 0 ]; then
		say "installing ${missing[*]}"
		as_root apt-get update -qq
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
	PG_BINDIR=$(pg_config --bindir)
	export PG_BINDIR
}

# Builds and installs the extension into the local PostgreSQL 15.
build_extension() {
	say "building the extension"
	make -s PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config >/dev/null
	as_root make -s PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config install >/dev/null
}
