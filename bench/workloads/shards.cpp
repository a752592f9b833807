// The "shards" workload: BENCH_EVENTS waiting events drained by one relay
// per shard (1, 2, 4) into one Redis; the heap rows one batch of shard 0
// reads with 1, 4 and 16 shards.
#include <cstdio>
#include <sstream>

#include "../bench.hpp"

namespace pg_outbox::bench {

void workload_shards(Context& ctx) {
    const long long events = ctx.events;
    const std::string n_events = std::to_string(events);
    Context::say("shards: " + n_events +
                 " waiting events drained by one relay per shard (1, 2, 4) into one Redis; rows read per batch with "
                 "1, 4, 16 shards");
    ctx.psql("postgres", {"CREATE DATABASE shards"});
    ctx.psql("shards", {"CREATE EXTENSION pg_outbox"});
    for (int n : {1, 2, 4, 16})
        ctx.psql("shards", {"SELECT outbox_group_create('d" + std::to_string(n) +
                            "', start_at => 'beginning', ordering => 'xid8', shards => " + std::to_string(n) + ")"});
    ctx.load_events("shards", events);
    ctx.psql("shards", {"VACUUM ANALYZE outbox.event"});
    // Heap rows a batch of shard 0 reads (index scans of this transaction)
    // and its time, with the cursor at the start of a backlog of events.
    ctx.psql("shards", {R"(
	CREATE FUNCTION batch_reads(g text, OUT events bigint, OUT rows_read bigint, OUT ms numeric) LANGUAGE plpgsql AS $$
	DECLARE
		before bigint;
		t0 timestamptz;
	BEGIN
		SELECT coalesce(sum(idx_tup_fetch), 0) INTO before FROM pg_stat_xact_user_tables
		 WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass);
		t0 := clock_timestamp();
		SELECT count(*) INTO events FROM outbox_fetch(g, 1000);
		ms := round((extract(epoch FROM clock_timestamp() - t0) * 1000)::numeric, 3);
		SELECT coalesce(sum(idx_tup_fetch), 0) - before INTO rows_read FROM pg_stat_xact_user_tables
		 WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox.event'::regclass);
	END
	$$)"});
    // Per round: events, rows read, ms for 1, 4, 16 shards.
    std::vector<std::vector<double>> reads;
    for (int r = 1; r <= ctx.rounds; ++r) {
        std::vector<double> line;
        std::string text;
        for (const char* g : {"d1", "d4/0", "d16/0"}) {
            const std::string v = ctx.value(
                "shards", std::string("SELECT events || ' ' || rows_read || ' ' || ms FROM batch_reads('") + g + "')");
            std::istringstream in(v);
            double x;
            while (in >> x) line.push_back(x);
            text += " " + v;
        }
        reads.push_back(line);
        std::printf("   round %d: events, rows read, ms of one batch (1, 4, 16 shards):%s\n", r, text.c_str());
    }
    // Drains group dN with a relay per shard, in parallel: events/s, and
    // CPU microseconds per event of PostgreSQL, the relays and Redis.
    std::vector<std::vector<double>> drains;
    for (int r = 1; r <= ctx.rounds; ++r) {
        std::vector<double> line;
        std::string text;
        for (int n : {1, 2, 4}) {
            const std::string group = "d" + std::to_string(n);
            ctx.flush_redis();
            ctx.rewind_shards("shards", group);
            ctx.settle("shards");
            auto pids = ctx.pg_processes();
            pids.push_back(ctx.redis->pid());
            const auto cpu0 = Context::cpu_snapshot(pids);
            const double t0 = epoch_now();
            auto relays = ctx.start_shard_relays("shards", group, n, ctx.redis_address());
            ctx.wait_streams(events);
            const double t1 = epoch_now();
            const auto pg1 = Context::cpu_snapshot(ctx.pg_processes());
            const auto redis1 = Context::cpu_snapshot({ctx.redis->pid()});
            std::vector<pid_t> relay_pids;
            for (const auto& p : relays) relay_pids.push_back(p->pid());
            const auto relay1 = Context::cpu_snapshot(relay_pids);
            Context::stop_all(relays);
            line.push_back(rounded(static_cast<double>(events) / (t1 - t0), 0));
            for (const auto* part : {&pg1, &relay1, &redis1})
                line.push_back(rounded(Context::cpu_between(cpu0, *part) * 1e6 / static_cast<double>(events), 2));
        }
        for (std::size_t i = 0; i < line.size(); ++i) text += " " + fixed(line[i], i % 4 ? 2 : 0);
        drains.push_back(line);
        std::printf("   round %d: events/s and CPU µs per event (PostgreSQL, relays, Redis) with 1, 2, 4 shards:%s\n", r,
                    text.c_str());
    }
    ctx.flush_redis();
    auto col = [](const std::vector<std::vector<double>>& rows, std::size_t i) {
        std::vector<double> v;
        for (const auto& l : rows) v.push_back(l[i]);
        return stats(v);
    };
    std::size_t c = 1;
    for (int n : {1, 4, 16}) {
        const std::string ns = std::to_string(n);
        ctx.row("shards: one batch of 1000 at a " + n_events + "-event backlog, " + ns +
                " shard(s): heap rows read | " + col(reads, c) + " | ≤ 1000");
        ctx.row("shards: one batch, " + ns + " shard(s) (ms) | " + col(reads, c + 1) + " |");
        c += 3;
    }
    c = 0;
    for (int n : {1, 2, 4}) {
        const std::string ns = std::to_string(n);
        std::vector<double> ratio;
        for (const auto& l : drains) ratio.push_back(l[c] / l[0]);
        ctx.row("shards: drain " + n_events + " events with " + ns + " relay(s), one per shard, one Redis (events/s) | " +
                col(drains, c) + " |");
        ctx.row("shards: drain with " + ns + " shard(s) / with 1 | " + stats(ratio) + " |");
        ctx.row("shards, " + ns + " shard(s): CPU per event of PostgreSQL, relays, Redis (µs) | " + col(drains, c + 1) +
                ", " + col(drains, c + 2) + ", " + col(drains, c + 3) + " |");
        c += 4;
    }
    ctx.drop_database("shards");
}

}  // namespace pg_outbox::bench
