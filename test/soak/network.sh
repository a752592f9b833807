# shellcheck shell=bash disable=SC2034 # sets variables soak.sh and scripts/lib.sh read
# The soak test's network mode (SOAK_MODE=network), sourced by soak.sh:
# the test's own hosts, the faults it makes between them, and what it
# records of each fault for the report (test/soak/network_report.cpp).
#
# The hosts are network namespaces: "db" runs PostgreSQL and Redis;
# relay1, relay2 and consumer (both consume workers) each have one of
# their own, joined to db by two veth pairs, one that carries PostgreSQL
# and one that carries Redis, so that each path can be cut alone:
#
#   relay1    10.250.1.2 -- 10.250.1.1  db, PostgreSQL
#             10.251.1.2 -- 10.251.1.1  db, Redis
#   relay2    10.250.2.2 -- 10.250.2.1
#             10.251.2.2 -- 10.251.2.1
#   consumer  10.250.3.2 -- 10.250.3.1
#             10.251.3.2 -- 10.251.3.1
#
# These addresses exist only inside these namespaces (IPv6 is off there,
# so no link-local address either); the root namespace gets no interface
# and no address. The soak itself (writers, psql, redis-cli) reaches
# PostgreSQL and Redis through their Unix sockets, which no fault touches.
# Every namespace and interface is named with NETP ("pgox<PID of the
# soak's shell>-"), and the teardown deletes those names only.
#
# A fault is made in the db namespace on the db end of one path:
#   blackhole  iptables DROP of every packet in and out (no RST, no ICMP)
#   reset      iptables REJECT --reject-with tcp-reset of TCP in and out
#   link-down  ip link set down
# on relay<->PostgreSQL or relay<->Redis of the leading relay (the other
# relay standing by, or stopped for the time of the fault),
# consumer<->PostgreSQL or consumer<->Redis (both workers). tc netem is
# not used.

NETP=pgox$$-
NET_HOSTS=(relay1 relay2 consumer)
NET_KINDS=(blackhole reset link-down)
NET_PATHS=(relay-pg relay-redis consumer-pg consumer-redis)
IPT=iptables

net_index() {
	case $1 in
	relay1) echo 1 ;;
	relay2) echo 2 ;;
	consumer) echo 3 ;;
	esac
}
# The host a relay or worker runs on.
net_host_of() {
	case $1 in
	relay*) echo "$1" ;;
	*) echo consumer ;;
	esac
}
# The address of the db end of a host's link: net_db_addr HOST pg|redis.
net_db_addr() {
	local o=250
	[ "$2" = pg ] || o=251
	echo "10.$o.$(net_index "$1").1"
}
# The interfaces of a host's link: net_dev HOST pg|redis [db|host].
net_dev() {
	local side=d
	[ "${3:-db}" = db ] || side=h
	echo "$NETP$side$(net_index "$1")${2:0:1}"
}
# Runs a command in a host's namespace: net_exec HOST COMMAND [ARG ...].
net_exec() {
	local host=$1
	shift
	ip netns exec "$NETP$host" "$@"
}

# Prints why this machine cannot run the network mode, or nothing when
# it can: it needs root, ip and iptables, and a kernel that lets it make
# a namespace, a veth pair and an iptables rule. Tries both iptables
# back ends (nf_tables first, then legacy) and keeps the one that works.
net_unavailable() {
	local ns=${NETP}probe err ipt
	if [ "$(id -u)" -ne 0 ]; then
		echo "it runs as $(id -un), not root"
		return
	fi
	command -v ip >/dev/null || { echo "ip (Debian package iproute2) is not installed"; return; }
	command -v iptables >/dev/null || { echo "iptables (Debian package iptables) is not installed"; return; }
	if ! err=$(ip netns add "$ns" 2>&1); then
		echo "ip netns add failed (no CAP_SYS_ADMIN or CAP_NET_ADMIN?): $err"
		return
	fi
	if ! err=$(ip -n "$ns" link add "${NETP}p0" type veth peer name "${NETP}p1" 2>&1); then
		ip netns del "$ns" 2>/dev/null || true
		echo "ip link add ... type veth failed: $err"
		return
	fi
	err=
	for ipt in iptables iptables-legacy; do
		command -v "$ipt" >/dev/null || continue
		if err=$(ip netns exec "$ns" "$ipt" -w -I INPUT -i "${NETP}p0" -j DROP 2>&1); then
			IPT=$ipt
			err=
			break
		fi
	done
	ip netns del "$ns" 2>/dev/null || true
	[ -z "$err" ] || echo "iptables cannot add a rule in a network namespace: $err"
}

# Makes the namespaces and veth pairs described above.
net_setup() {
	local h i kind dev peer o
	for h in db "${NET_HOSTS[@]}"; do
		ip netns add "$NETP$h"
		net_exec "$h" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
			>/dev/null 2>&1 || true
		ip -n "$NETP$h" link set lo up
	done
	for h in "${NET_HOSTS[@]}"; do
		i=$(net_index "$h")
		for kind in pg redis; do
			o=250
			[ "$kind" = pg ] || o=251
			dev=$(net_dev "$h" "$kind")
			peer=$(net_dev "$h" "$kind" host)
			ip link add "$dev" netns "${NETP}db" type veth peer name "$peer" netns "$NETP$h"
			ip -n "${NETP}db" addr add "10.$o.$i.1/24" dev "$dev"
			ip -n "$NETP$h" addr add "10.$o.$i.2/24" dev "$peer"
			ip -n "${NETP}db" link set "$dev" up
			ip -n "$NETP$h" link set "$peer" up
		done
	done
}

# Deletes this run's namespaces (and with them their interfaces and
# iptables rules), after killing, by PID, whatever of this run still
# runs in them; then any interface of this run's left in the root
# namespace (by a setup cut short). Others' names are never touched.
net_teardown() {
	local ns pid dev
	for ns in $(ip netns list 2>/dev/null | awk -v p="$NETP" 'index($1, p) == 1 { print $1 }'); do
		for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
		ip netns del "$ns" 2>/dev/null || true
	done
	for dev in $(ip -o link show 2>/dev/null | awk -F': ' -v p="$NETP" '{ sub(/@.*/, "", $2) } index($2, p) == 1 { print $2 }'); do
		ip link del "$dev" 2>/dev/null || true
	done
}

# PostgreSQL in the db namespace, listening on the db end of each host's
# PostgreSQL link (and its Unix socket), with an hba file that lets those
# hosts in. Server-side keepalives end the sessions of clients a fault
# cut off, which would otherwise hold connection slots for hours.
net_pg_start() {
	local h addrs=()
	for h in "${NET_HOSTS[@]}"; do addrs+=("$(net_db_addr "$h" pg)"); done
	mkdir -p "$WORK/pg"
	printf '%s\n' "local all all trust" "host all all 10.250.0.0/16 trust" >"$WORK/pg_hba.conf"
	PG_NETNS=${NETP}db
	pg_start "$WORK/pg" "$PG_PORT" "$@" "listen_addresses = '$(IFS=,; echo "${addrs[*]}")'" \
		"hba_file = '$WORK/pg_hba.conf'" "tcp_keepalives_idle = 10" "tcp_keepalives_interval = 5" \
		"tcp_keepalives_count = 3"
}

# Redis in the db namespace, listening on the db end of each host's Redis
# link and on a Unix socket (where the kit sees it answer). Sets REDIS_PID.
net_redis_start() {
	local h addrs=() out
	for h in "${NET_HOSTS[@]}"; do addrs+=("$(net_db_addr "$h" redis)"); done
	out=$(net_exec db "$(testkit_path)" start redis --dir "$WORK/redis" --port "$REDIS_PORT" -- \
		--bind "${addrs[@]}" --protected-mode no --unixsocket "$WORK/redis/redis.sock" --unixsocketperm 700) || {
		echo "redis-server did not start in namespace ${NETP}db" >&2
		return 1
	}
	REDIS_PID=$(sed -n 's/^REDIS_PID=//p' <<<"$out")
}

# The iptables rules of a fault in the db namespace: net_rules -I|-D KIND DEV.
net_rules() {
	local op=$1 kind=$2 dev=$3 ipt=(ip netns exec "${NETP}db" "$IPT" -w)
	case $kind in
	blackhole)
		"${ipt[@]}" "$op" INPUT -i "$dev" -j DROP
		"${ipt[@]}" "$op" OUTPUT -o "$dev" -j DROP
		;;
	reset)
		# Not the resets these rules send: a reset that the OUTPUT rule
		# caught would never reach the client.
		"${ipt[@]}" "$op" INPUT -i "$dev" -p tcp -j REJECT --reject-with tcp-reset
		"${ipt[@]}" "$op" OUTPUT -o "$dev" -p tcp ! --tcp-flags RST RST -j REJECT --reject-with tcp-reset
		;;
	esac
}
net_cut() {
	case $1 in
	link-down) ip -n "${NETP}db" link set "$2" down ;;
	*) net_rules -I "$1" "$2" ;;
	esac
}
net_heal() {
	case $1 in
	link-down) ip -n "${NETP}db" link set "$2" up ;;
	*) net_rules -D "$1" "$2" ;;
	esac
}

# The relay that leads the group (by the address its session comes
# from), or nothing.
net_leader() {
	case $(db soak -c "SELECT host(a.client_addr) FROM outbox.groups g JOIN pg_stat_activity a ON a.pid = g.leader_pid
					   WHERE g.name = 'soak' AND g.lease_until > now()" 2>/dev/null) in
	10.250.1.2) echo relay1 ;;
	10.250.2.2) echo relay2 ;;
	esac
}
# What the relays published (entries in the streams), and what the
# workers applied (the projection's sequence): each only grows.
net_published() {
	printf 'XLEN %s\n' "${STREAMS[@]}" | redis | awk '{ s += $1 } END { print s + 0 }'
}
net_applied() {
	db sink -c "SELECT last_value FROM projection_seq_seq"
}
now() {
	date +%s.%N
}

# One fault, the NUMBER-th: its kind, path and standby are in a rotation
# that makes every kind on every path within 12 faults, and with a
# standby and without one within 24 (shifted by the seed: NET_SHIFT and
# NET_STANDBY_SHIFT); it lasts 5 s
# to FAULT_MAX. Right after the heal it emits an event, so that there is
# something to publish and apply even when the writers pause, and waits
# (at most NET_RESUME_WAIT seconds) until the streams or the projection
# grow. Records a line for the report in NET_RESULTS:
#   kind path standby seconds cut heal resumed cut-logs standby-log relay-logs
# (times in epoch seconds; resumed: when the first apply after the heal
# happened (the projection's applied_at), "log" when the relays' logs say
# when they published first after it, "-" when nothing resumed; logs
# comma-separated, "-" for none), and says what it did on stdout (the
# faults log).
net_fault() {
	local n=$1 kind path standby=- d host other='' dev counter procs=() logs=() p at_heal t_cut t_heal t_res='' i
	kind=${NET_KINDS[(n + NET_SHIFT) % ${#NET_KINDS[@]}]}
	path=${NET_PATHS[(n + NET_SHIFT / 3) % ${#NET_PATHS[@]}]}
	d=$((5 + RANDOM % (FAULT_MAX - 4)))
	case $path in
	relay-*)
		if ! wait_for 30 '[ -n "$(net_leader)" ]'; then
			echo "no relay led within 30 s; no fault"
			return 0
		fi
		host=$(net_leader)
		other=relay1
		[ "$host" = relay2 ] || other=relay2
		standby=with
		if [ $(((n + n / 12 + NET_STANDBY_SHIFT) % 2)) = 1 ]; then
			standby=without
			stop_pid "${PIDS[$other]}"
		fi
		procs=("$host")
		counter=net_published
		;;
	consumer-*)
		host=consumer
		procs=("${WORKERS[@]}")
		counter=net_applied
		;;
	esac
	for p in "${procs[@]}"; do logs+=("$WORK/$p.log"); done
	dev=$(net_dev "$host" "${path#*-}")
	local what=${path/-pg/<->PostgreSQL}
	what=${what/-redis/<->Redis}
	case $standby in
	with) echo "$kind $what, a standby relay running" ;;
	without) echo "$kind $what, no standby relay" ;;
	*) echo "$kind $what" ;;
	esac
	# The times are taken when the rules are in place, and when they are
	# gone.
	net_cut "$kind" "$dev"
	t_cut=$(now)
	sleep "$d"
	at_heal=$($counter)
	net_heal "$kind" "$dev"
	t_heal=$(now)
	db soak -c "SELECT outbox_emit('t0', 'heal', jsonb_build_object('n', nextval('soak_n')))" >/dev/null
	t_res=-
	for i in $(seq 1 $((NET_RESUME_WAIT * 10))); do
		if [ "$($counter)" -gt "$at_heal" ]; then
			t_res=log
			break
		fi
		sleep 0.1
	done
	if [ "$counter" = net_applied ] && [ "$t_res" = log ]; then
		t_res=$(db sink -c "SELECT extract(epoch FROM min(applied_at)) FROM projection WHERE applied_at > to_timestamp($t_heal)")
	fi
	local standby_log=- relay_logs=-
	[ "$standby" != with ] || standby_log=$WORK/$other.log
	[ "$counter" != net_published ] || relay_logs=$WORK/relay1.log,$WORK/relay2.log
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$kind" "$path" "$standby" "$d" "$t_cut" "$t_heal" "$t_res" \
		"$(IFS=,; echo "${logs[*]}")" "$standby_log" "$relay_logs" >>"$NET_RESULTS"
	[ -z "$other" ] || [ "$standby" != without ] || start "$other"
}
