// The "bloat" workload: BENCH_BLOAT events through emit, publish and
// retention, vs the naive outbox (a status column) with its DELETE
// cleanup: dead tuples and sizes afterwards.
#include <cstdio>
#include <sstream>

#include "../bench.hpp"

namespace pg_outbox::bench {

void workload_bloat(Context& ctx) {
    const std::string n = std::to_string(knob_int("BLOAT", 1000000));
    Context::say("bloat: " + n + " events through emit, publish and retention, vs the naive outbox with its DELETE cleanup");
    ctx.flush_redis();
    ctx.psql("postgres", {"CREATE DATABASE bloat"});
    ctx.psql("bloat", {"CREATE EXTENSION pg_outbox",
                       "SELECT outbox_group_create('b', start_at => 'beginning', ordering => 'commit')"});
    // Small partitions, so that retention can act on this much traffic: the
    // (empty) wide ones made at install make way for them.
    ctx.psql("bloat", {"UPDATE outbox.config SET partition_width = 200, premake = 4, retention = '0'",
                       "SELECT outbox_drop_empty_partitions()", "SELECT count(*) FROM outbox_maintain()"});
    ctx.psql("bloat", {R"(CREATE TABLE naive_outbox (id bigserial PRIMARY KEY, event_id uuid, topic text, key text, payload jsonb,
		headers jsonb, created_at timestamptz DEFAULT now(), status text NOT NULL DEFAULT 'new', updated_at timestamptz);
		CREATE INDEX naive_outbox_new ON naive_outbox (id) WHERE status = 'new';)"});
    // The same traffic into both: 1000 events a transaction, maintenance
    // running as a relay would run it.
    ctx.psql("bloat", {R"(
	DO $$
	BEGIN
		FOR c IN 0 .. ()" + n + R"( - 1) / 1000 LOOP
			PERFORM count(*) FROM outbox_emit_many('t', NULL,
				(SELECT array_agg(jsonb_build_object('i', c * 1000 + i, 'note', 'lorem ipsum dolor sit amet, consectetur adipiscing elit'))
				   FROM generate_series(1, 1000) i));
			INSERT INTO naive_outbox (event_id, topic, payload)
				SELECT gen_random_uuid(), 't', jsonb_build_object('i', c * 1000 + i, 'note', 'lorem ipsum dolor sit amet, consectetur adipiscing elit')
				  FROM generate_series(1, 1000) i;
			COMMIT;
			IF c % 50 = 0 THEN
				PERFORM count(*) FROM outbox_maintain();
				COMMIT;
			END IF;
		END LOOP;
	END
	$$)"});
    auto relay = ctx.spawn({ctx.relay, "publish", "--pg", ctx.conninfo("bloat"), "--redis", ctx.redis_address(),
                            "--group", "b", "--log-level", "warn", "--maintain-interval", "0"},
                           "relay.log");
    ctx.wait_streams(std::stoll(n));
    Context::stop(relay);
    ctx.must({ctx.self, "naive-relay", "--pg", ctx.conninfo("bloat"), "--redis", ctx.redis_address()});
    // Time passes (other transactions move the horizon past the last
    // partition), then retention for pg_outbox; the naive outbox's own
    // cleanup: DELETE what was sent.
    ctx.psql("bloat", {"DO $$ BEGIN FOR i IN 1 .. 1000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$"});
    ctx.psql("bloat", {"SELECT count(*) FROM outbox_maintain()", "SELECT count(*) FROM outbox_maintain()"});
    ctx.psql("bloat", {"DELETE FROM naive_outbox WHERE status = 'sent'", "SELECT pg_stat_force_next_flush()"});
    nap(1);
    std::istringstream o(ctx.value("bloat", R"(
		SELECT coalesce(sum(s.n_dead_tup), 0) || ' ' || coalesce(sum(pg_total_relation_size(s.relid)), 0) || ' ' || coalesce(sum(s.n_live_tup), 0)
		  FROM pg_stat_user_tables s
		 WHERE s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass))"));
    std::istringstream naive(ctx.value(
        "bloat", "SELECT n_dead_tup || ' ' || pg_total_relation_size(relid) FROM pg_stat_user_tables WHERE relname = 'naive_outbox'"));
    std::string o_dead, o_size, o_rows, n_dead, n_size;
    o >> o_dead >> o_size >> o_rows;
    naive >> n_dead >> n_size;
    std::printf("   pg_outbox: %s dead tuples, %s bytes, %s live rows; naive: %s dead tuples, %s bytes\n", o_dead.c_str(),
                o_size.c_str(), o_rows.c_str(), n_dead.c_str(), n_size.c_str());
    ctx.row("bloat after " + n + " events and retention: pg_outbox event table dead tuples | " + o_dead + " | 0");
    ctx.row("bloat: pg_outbox event table size, retained partitions only (MB) | " +
            fixed(std::stod(o_size) / 1048576, 1) + " |");
    ctx.row("bloat: naive outbox dead tuples after its DELETE cleanup, before VACUUM | " + n_dead + " |");
    ctx.row("bloat: naive outbox size (MB) | " + fixed(std::stod(n_size) / 1048576, 1) + " |");
    ctx.drop_database("bloat");
}

}  // namespace pg_outbox::bench
