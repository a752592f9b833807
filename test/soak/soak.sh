#!/usr/bin/env bash
# pg_outbox soak test: a fault-injecting workload, then a history checker.
#
# 16 writers emit numbered events on random keys (with aborted
# transactions, rolled-back savepoints, long transactions, two-phase
# commits and bulk emits), two relays publish one group, two consume
# workers apply the streams through the inbox into a projection. Faults
# come at random moments: relays and workers killed and restarted, the
# active relay stopped and continued, the leading relay hung for three
# leases (the standby takes over; the old leader is fenced off), Redis
# killed and restarted from its AOF, Redis unreachable, PostgreSQL
# restarted, a stream trimmed below entries nobody read, maintenance runs. Then everything is brought back,
# drained, and the history (what committed, what is in the streams, what
# was applied, what was dead-lettered) goes to pg_outbox_check.
#
#   SOAK_SECONDS=120   how long the faults and the workload run
#   SOAK_SEED          seed of the fault schedule (default: random, printed)
#   SOAK_ORDERING      commit (default: pg_outbox preloaded, a commit-ordered
#                      group, no two-phase commits) or xid8
#   SOAK_ENGINE        c (default: CREATE EXTENSION pg_outbox) or sql
#                      (CREATE EXTENSION pg_outbox_sql, nothing preloaded:
#                      the relays wait on LISTEN/NOTIFY and maintenance is
#                      theirs, as on a managed service)
#   SOAK_MODE          single (default: the above, one Redis) or
#                      sharded-cluster: the group has 4 shards, published
#                      by one relay per shard (two for shards 0 and 1) to a
#                      Redis Cluster of 3 masters and 3 replicas without
#                      AOF, and applied by one worker per shard (its three
#                      streams under one hash tag, so per-key order holds);
#                      the faults are relays killed, stopped and hung,
#                      PostgreSQL restarted, a master killed (its replica
#                      takes over, a tail of its streams may be lost; it
#                      comes back as a replica), slots resharded and a
#                      stream's slot migrated while the writers run. The
#                      checker also checks that each event is in its
#                      shard's stream and that each key's events applied
#                      in feed order; or
#                      network: PostgreSQL and Redis on a host of their
#                      own behind veth pairs, each relay and the consumer
#                      on theirs (network namespaces the test makes, see
#                      test/soak/network.cpp; root only, else skipped with
#                      exit status 77), and the faults are network faults
#                      (blackhole, reset, link down) on one path at a
#                      time, with a standby relay and without; the soak
#                      then also reports how long each cut took to be
#                      noticed and how long after each heal publishing or
#                      applying resumed (pg_outbox_soak_network)
#   SOAK_PARK=1        the workers consume with --on-failure park-key
#                      and --max-deliveries 3, writers also emit on ten hot
#                      keys, and a fault makes the handler fail for one of
#                      them for 5 to 15 s: its first failing entry is tried
#                      again, then dead-lettered, and its later entries are
#                      parked meanwhile. At the end the handler is fixed,
#                      every dead key is redriven (inbox_redrive), and the
#                      run fails if a key is left parked or a handler's
#                      dead letter was not redriven; the history gains
#                      parked.tsv, with which the checker also counts a
#                      dead letter passed over by a later event of its
#                      key as a key order violation
#   SOAK_FAULT_MAX     network mode: the longest fault in seconds (5 to
#                      120; default a sixth of SOAK_SECONDS within that)
#   SOAK_PG_OPTIONS    network mode: conninfo keywords added to the
#                      relays' and workers' --pg (say tcp_user_timeout=...)
#
# Everything runs on throwaway servers on loopback (in network mode on
# addresses inside the test's own namespaces), stopped by PID. The soak
# itself is a program (pg_outbox_soak: test/soak/soak.cpp, faults.cpp,
# network.cpp, on the test kit); this script installs the packages,
# builds the extension and the programs, and runs it. KEEP=1 keeps its
# workspace (logs, history) also when it passes.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh

ensure_packages
build_extension
build_relay pg_outbox_relay pg_outbox_check pg_outbox_soak_network pg_outbox_soak
exec build/test/soak/pg_outbox_soak
