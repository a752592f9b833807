# Shared helpers of pg_outbox's scripts (sourced, not run).

# Debian packages that building, testing and the demo need (help2man and
# man-db: the relay's man page and test/man.sh; mkdocs, python3-pymdownx
# and chromium: make docs and the site's test, test/docs_site.py).
PG_OUTBOX_PACKAGES=(
	make gcc g++ cmake pkg-config
	postgresql-15 postgresql-server-dev-15 postgresql-common libpq-dev libipc-run-perl
	redis-server redis-tools libhiredis-dev
	libgtest-dev libcli11-dev libspdlog-dev libfmt-dev libcpp-httplib-dev nlohmann-json3-dev
	help2man man-db
	iproute2 iptables
	mkdocs python3-pymdownx chromium
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

# Installs the packages above that are missing (apt-get; sudo when not root),
# holding the install lock (with_install_lock below).
ensure_packages() {
	local missing=() p
	for p in "${PG_OUTBOX_PACKAGES[@]}" "$@"; do
		if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
			missing+=("$p")
		fi
	done
	if [ "${#missing[@]}" -gt 0 ]; then
		say "installing ${missing[*]}"
		local sudo=
		[ "$(id -u)" -eq 0 ] || sudo=sudo
		with_install_lock $sudo apt-get update -qq
		with_install_lock $sudo env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
	PG_BINDIR=$(pg_config --bindir)
	export PG_BINDIR
}

# PostgreSQL's programs: the system's, or with PG_OUTBOX_DESTDIR those of
# a copy of its tree there (cp -a /usr/lib/postgresql/15 and
# /usr/share/postgresql/15 under it), into which build_extension installs:
# benchmarks and relay tests of one checkout then never use another's
# extension. PostgreSQL finds its libraries and extensions relative to its
# programs.
if [ -n "${PG_OUTBOX_DESTDIR:-}" ]; then
	PG_OUTBOX_PG_BIN="$PG_OUTBOX_DESTDIR/usr/lib/postgresql/15/bin"
	export PG_OUTBOX_PG_BIN
fi
PG_BIN=${PG_OUTBOX_PG_BIN:-/usr/lib/postgresql/15/bin}

# Builds and installs the extension into the local PostgreSQL 15.
build_extension() {
	say "building the extension"
	make -s PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config >/dev/null
	as_root make -s PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config install ${PG_OUTBOX_DESTDIR:+DESTDIR="$PG_OUTBOX_DESTDIR"} >/dev/null
}

# Runs a PostgreSQL binary, as the "postgres" user when root (PostgreSQL
# refuses to run as root).
pg_run() {
	local bin=$1
	shift
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- "$PG_BIN/$bin" "$@"
	else
		"$PG_BIN/$bin" "$@"
	fi
}

# The test kit's program (test/kit/cli.cpp), which starts and stops every
# throwaway server of the scripts as the relay's tests do: PG_OUTBOX_TESTKIT,
# else build/test/kit/pg_outbox_testkit, built first when missing (the
# packages of ensure_packages are all it needs).
testkit() {
	"$(testkit_path)" "$@"
}

# The path of the kit's program, built when missing.
testkit_path() {
	local kit=${PG_OUTBOX_TESTKIT:-$PWD/build/test/kit/pg_outbox_testkit}
	[ -x "$kit" ] || build_relay >&2
	echo "$kit"
}

# Prints a TCP port on 127.0.0.1 that nothing listens on, below the
# kernel's ephemeral range: a port in that range may be the local end of
# any outgoing connection, and a server could then not bind it.
free_port() {
	testkit free-port
}

# Starts a throwaway PostgreSQL cluster (initdb, pg_ctl start; as the
# "postgres" user when root): pg_start DIR PORT [setting ...]. Sets
# PG_PID; the caller stops it with pg_stop (or stop_servers).
pg_start() {
	local dir=$1 port=$2 out
	shift 2
	out=$("$(testkit_path)" start pg --dir "$dir" --port "$port" -- "$@") || return 1
	PG_PID=$(sed -n 's/^PG_PID=//p' <<<"$out")
}

# Stops a process by PID and waits until it is gone: stop_pid PID [SIGNAL].
stop_pid() {
	local pid=$1 sig=${2:-TERM} i
	[ -n "$pid" ] || return 0
	kill "-$sig" "$pid" 2>/dev/null || return 0
	for i in $(seq 1 600); do
		kill -0 "$pid" 2>/dev/null || return 0
		# A zombie has ended: a server the kit started is no child of ours.
		[ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
}

# Fast shutdown of the cluster started by pg_start.
pg_stop() {
	stop_pid "$1" INT
}

# Starts a throwaway Redis (no persistence unless the options say so; a
# later option overrides): redis_start DIR PORT [option ...]. Sets
# REDIS_PID.
redis_start() {
	local dir=$1 port=$2 out
	shift 2
	out=$(testkit start redis --dir "$dir" --port "$port" -- "$@") || return 1
	REDIS_PID=$(sed -n 's/^REDIS_PID=//p' <<<"$out")
}

# Makes a script's throwaway workspace: WORK (/tmp/pg_outbox_NAME.*), and
# free loopback ports for PostgreSQL and Redis.
throwaway_workspace() {
	WORK=$(mktemp -d "/tmp/pg_outbox_$1.XXXXXX")
	chmod 755 "$WORK"
	PG_PORT=$(free_port)
	REDIS_PORT=$(free_port)
	REDIS_PID=
}

# Stops every server the kit started in the workspace, by PID: Redis
# (continued first, in case it was stopped) and PostgreSQL's from its
# postmaster.pid, so that it is found after a restart too.
stop_servers() {
	[ -z "${WORK:-}" ] || testkit stop --dir "$WORK"
}

# Builds the relay (and the benchmark helpers), and the test kit's program
# that starts the scripts' servers, into build/: build_relay [TARGET ...].
build_relay() {
	say "building the relay"
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build build -j"$(nproc)" --target pg_outbox_testkit "$@" >/dev/null
}

# Runs a command while holding the lock on system-wide installs of
# pg_outbox (PG_OUTBOX_INSTALL_LOCK, default /tmp/pg_outbox_ext.lock): the
# extension's files under PostgreSQL's directories are shared by every
# build and package on the machine. A caller that already holds the lock
# (flock FILE make test) keeps it; taking it again would wait forever. The
# command does not inherit the lock's descriptor (flock -o), so servers it
# leaves behind cannot keep the lock.
with_install_lock() {
	local lock=${PG_OUTBOX_INSTALL_LOCK:-/tmp/pg_outbox_ext.lock}
	if install_lock_held "$lock"; then
		"$@"
	else
		flock -o "$lock" "$@"
	fi
}

# True when the lock file is flock()ed by this process or one of its
# ancestors (/proc/locks names the process that took a lock).
install_lock_held() {
	local lock=$1 inode holders pid=$$
	[ -e "$lock" ] || return 1
	inode=$(stat -c %i "$lock")
	holders=$(awk -v ino="$inode" '$2 == "FLOCK" { n = split($6, f, ":"); if (f[n] == ino) print $5 }' /proc/locks)
	[ -n "$holders" ] || return 1
	while [ -n "$pid" ] && [ "$pid" -gt 1 ]; do
		if grep -qx "$pid" <<<"$holders"; then
			return 0
		fi
		pid=$(awk '/^PPid:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
	done
	return 1
}

# Waits until a condition (a shell command) holds, for at most $1 seconds.
wait_for() {
	local seconds=$1 i
	shift
	for i in $(seq 1 $((seconds * 10))); do
		if eval "$@"; then return 0; fi
		sleep 0.1
	done
	return 1
}

# Starts a throwaway Redis Cluster of MASTERS masters, each with REPLICAS
# replicas, on free loopback ports (node i in DIR/node<i>, node timeout
# 2 s): redis_cluster_start DIR MASTERS REPLICAS [option ...]. Sets
# REDIS_CLUSTER_PIDS (every node's PID), REDIS_CLUSTER_PORTS (their ports,
# masters first as created) and REDIS_CLUSTER_URL
# (redis+cluster://127.0.0.1:PORT,... for the relay). The caller stops
# them with redis_cluster_stop.
redis_cluster_start() {
	local dir=$1 masters=$2 replicas=$3 out
	shift 3
	out=$(testkit start cluster --dir "$dir" --masters "$masters" --replicas "$replicas" -- "$@") || return 1
	eval "$out"
	REDIS_CLUSTER_DIR=$dir
}

# Stops every node started by redis_cluster_start, by PID.
redis_cluster_stop() {
	[ -z "${REDIS_CLUSTER_DIR:-}" ] || testkit stop --dir "$REDIS_CLUSTER_DIR"
	REDIS_CLUSTER_PIDS=()
}

# Runs ctest in build/ with the arguments, then prints its summary line
# ("N% tests passed, N tests failed out of N") again, last, after the
# label times and the failed tests ctest prints after it; returns
# ctest's status.
ctest_summarized() {
	local log rc=0
	log=$(mktemp)
	(cd build && ctest "$@") | tee "$log" || rc=$?
	grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1 || true
	rm -f "$log"
	return "$rc"
}
