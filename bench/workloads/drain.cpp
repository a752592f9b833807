// The "drain" workload: BENCH_EVENTS waiting events published by
// pg_outbox_relay, in xid8 and in commit order, beside the bare pipelined
// XADD ceiling, the naive status-column relay and a PgQ consumer; the
// relay's peak RSS and the CPU per event of PostgreSQL, the relay and Redis.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "../bench.hpp"

namespace pg_outbox::bench {

namespace {

struct Drained {
    double eps = 0;
    double rss_kb = 0;
    double cpu[3] = {0, 0, 0};  // µs per event: PostgreSQL, relay, Redis
};

double peak_rss_kb(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6));
    return 0;
}

// Drains group from the beginning with pg_outbox_relay.
Drained drain_relay(Context& ctx, const std::string& group, long long events) {
    ctx.flush_redis();
    ctx.psql("drain", {"SELECT outbox_rewind('" + group + "', 'beginning'); UPDATE outbox.groups SET streams = '{}'"});
    ctx.settle("drain");
    auto pids = ctx.pg_processes();
    pids.push_back(ctx.redis->pid());
    const auto cpu0 = Context::cpu_snapshot(pids);
    const double t0 = epoch_now();
    auto relay = ctx.spawn({ctx.relay, "publish", "--pg", ctx.conninfo("drain"), "--redis", ctx.redis_address(),
                            "--group", group, "--batch-size", "1000", "--log-level", "warn"},
                           "relay.log");
    ctx.wait_streams(events);
    const double t1 = epoch_now();
    const auto pg1 = Context::cpu_snapshot(ctx.pg_processes());
    const auto redis1 = Context::cpu_snapshot({ctx.redis->pid()});
    const auto relay1 = Context::cpu_snapshot({relay->pid()});
    Drained d;
    d.rss_kb = peak_rss_kb(relay->pid());
    Context::stop(relay);
    d.eps = rounded(static_cast<double>(events) / (t1 - t0), 0);
    int i = 0;
    for (const auto* part : {&pg1, &relay1, &redis1})
        d.cpu[i++] = rounded(Context::cpu_between(cpu0, *part) * 1e6 / static_cast<double>(events), 2);
    return d;
}

}  // namespace

void workload_drain(Context& ctx) {
    const long long events = ctx.events;
    const std::string n = std::to_string(events);
    Context::say("drain: " + n + " waiting events, " + std::to_string(ctx.rounds) + " rounds");
    ctx.psql("postgres", {"CREATE DATABASE drain"});
    ctx.psql("drain", {"CREATE EXTENSION pg_outbox",
                       "SELECT outbox_group_create('drain', start_at => 'beginning', ordering => 'xid8')",
                       "SELECT outbox_group_create('drain_commit', start_at => 'beginning', ordering => 'commit')"});
    ctx.load_events("drain", events);
    // PgQ: the same events in a queue, a tick every 1000 (batches as large
    // as the others'), one consumer per round.
    ctx.psql("drain", {"CREATE EXTENSION pgq", "SELECT pgq.create_queue('bench')"});
    for (int r = 1; r <= ctx.rounds; ++r)
        ctx.psql("drain", {"SELECT pgq.register_consumer('bench', 'round" + std::to_string(r) + "')"});
    ctx.psql("drain", {"CREATE TABLE pgq_source AS SELECT row_number() OVER (ORDER BY txid, seq) AS n, key, "
                       "payload::text AS payload FROM outbox.event",
                       "CREATE INDEX ON pgq_source (n)"});
    ctx.psql("drain", {R"(
	DO $$
	DECLARE
		tick bigint;
	BEGIN
		FOR c IN 0 .. ()" + n + R"( - 1) / 1000 LOOP
			PERFORM pgq.insert_event('bench', s.key, s.payload)
			   FROM pgq_source s WHERE s.n > c * 1000 AND s.n <= (c + 1) * 1000 ORDER BY s.n;
			COMMIT;
			-- A tick after each 1000: what pgqd does on a busy queue.
			tick := pgq.ticker('bench');
			COMMIT;
		END LOOP;
	END
	$$)",
                       "DROP TABLE pgq_source"});
    ctx.psql("drain", {R"(
		CREATE TABLE naive_template AS
			SELECT row_number() OVER (ORDER BY txid, seq) AS id, event_id, topic, key, payload, headers, created_at
			  FROM outbox.event;
		CREATE TABLE naive_outbox (id bigint PRIMARY KEY, event_id uuid, topic text, key text, payload jsonb,
			headers jsonb, created_at timestamptz, status text NOT NULL DEFAULT 'new', updated_at timestamptz);
		CREATE INDEX naive_outbox_new ON naive_outbox (id) WHERE status = 'new';)",
                       "VACUUM ANALYZE"});
    // Per round: 0 relay, 1 ceiling, 2 naive, 3 rss, 4 pgq, 5 commit order,
    // 6-8 xid8 CPU, 9-11 commit CPU, 12 Redis CPU under the ceiling.
    std::vector<std::vector<double>> rounds;
    for (int r = 1; r <= ctx.rounds; ++r) {
        // The ceiling between the two orders, so that each ratio is to a
        // ceiling measured right beside it: this machine's speed drifts.
        const Drained x = drain_relay(ctx, "drain", events);
        // the ceiling: bare pipelined XADD of the same entries
        ctx.flush_redis();
        ctx.settle("drain");
        const auto c0 = Context::cpu_snapshot({ctx.redis->pid()});
        const double ceiling_eps = std::stod(result(
            ctx.must({ctx.self, "xadd-ceiling", "--pg", ctx.conninfo("drain"), "--redis", ctx.redis_address()}),
            "events_per_second"));
        const auto c1 = Context::cpu_snapshot({ctx.redis->pid()});
        const double ceiling_cpu = rounded(Context::cpu_between(c0, c1) * 1e6 / static_cast<double>(events), 2);
        const Drained c = drain_relay(ctx, "drain_commit", events);
        // the naive status-column relay
        ctx.flush_redis();
        ctx.psql("drain", {"TRUNCATE naive_outbox; INSERT INTO naive_outbox (id, event_id, topic, key, payload, "
                           "headers, created_at)\n\t\t\tSELECT * FROM naive_template",
                           "ANALYZE naive_outbox"});
        ctx.settle("drain");
        const double naive_eps = std::stod(result(
            ctx.must({ctx.self, "naive-relay", "--pg", ctx.conninfo("drain"), "--redis", ctx.redis_address()}),
            "events_per_second"));
        ctx.flush_redis();
        ctx.settle("drain");
        const double pgq_eps = std::stod(result(ctx.must({ctx.self, "pgq-relay", "--pg", ctx.conninfo("drain"),
                                                          "--redis", ctx.redis_address(), "--consumer",
                                                          "round" + std::to_string(r)}),
                                                "events_per_second"));
        rounds.push_back({x.eps, ceiling_eps, naive_eps, x.rss_kb, pgq_eps, c.eps, x.cpu[0], x.cpu[1], x.cpu[2],
                          c.cpu[0], c.cpu[1], c.cpu[2], ceiling_cpu});
        std::printf("   round %d: relay %.0f/s (commit order %.0f/s), XADD ceiling %g/s, naive relay %g/s, PgQ "
                    "consumer %g/s, relay peak RSS %.0f kB\n",
                    r, x.eps, c.eps, ceiling_eps, naive_eps, pgq_eps, x.rss_kb);
        std::printf("   CPU µs per event (PostgreSQL, relay, Redis): xid8 order %.2f %.2f %.2f; commit order %.2f "
                    "%.2f %.2f; Redis under the bare XADD %.2f\n",
                    x.cpu[0], x.cpu[1], x.cpu[2], c.cpu[0], c.cpu[1], c.cpu[2], ceiling_cpu);
    }
    ctx.flush_redis();
    auto col = [&](int i) {
        std::vector<double> v;
        for (const auto& l : rounds) v.push_back(l[i]);
        return stats(v);
    };
    auto ratio = [&](int a, int b, double scale = 1) {
        std::vector<double> v;
        for (const auto& l : rounds) v.push_back(l[a] / (b < 0 ? scale : l[b]));
        return stats(v);
    };
    ctx.row("drain " + n + " events: pg_outbox_relay, xid8 order (events/s) | " + col(0) + " |");
    ctx.row("drain: pg_outbox_relay, commit order (events/s) | " + col(5) + " |");
    ctx.row("drain: bare pipelined XADD, the ceiling (events/s) | " + col(1) + " |");
    ctx.row("drain: naive status-column relay (events/s) | " + col(2) + " |");
    ctx.row("drain: PgQ consumer, batches of 1000 (events/s) | " + col(4) + " |");
    ctx.row("drain: relay / ceiling | " + ratio(0, 1) + " | ≥ 0.9");
    ctx.row("drain: relay / naive | " + ratio(0, 2) + " | ≥ 3");
    ctx.row("drain: relay / PgQ consumer | " + ratio(0, 4) + " |");
    ctx.row("drain: relay in commit order / ceiling | " + ratio(5, 1) + " | ≥ 0.9");
    int c = 6;
    for (const char* order : {"xid8", "commit"})
        for (const char* part : {"PostgreSQL (all processes)", "pg_outbox_relay", "Redis"})
            ctx.row(std::string("drain, ") + order + " order: CPU of " + part + " per event (µs) | " + col(c++) + " |");
    ctx.row("drain: CPU of Redis per event under the bare pipelined XADD (µs) | " + col(12) + " |");
    ctx.row("drain: relay in commit order / in xid8 order | " + ratio(5, 0) + " |");
    ctx.row("relay peak RSS during drain (MB) | " + ratio(3, -1, 1024) + " | < 64");
    ctx.drop_database("drain");
}

}  // namespace pg_outbox::bench
