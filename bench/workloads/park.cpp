// The "park" workload: what one failing key costs the others. 4 workers
// with --pool read a 4-shard group of BENCH_PARK entries over 1,000 keys
// (k0 to k999) with a one-row handler that raises for key k0 while
// bench_fail holds a row. Each round measures, on the same streams:
// healthy (bench_fail empty) and parked (k0 fails from its first entry:
// dead-lettered at once with --max-deliveries 1, and every later k0 entry
// parked), for two streams: k0 one key among 1,000, and k0 a tenth of the
// entries. The figure is the entries/s of the keys other than k0, on the
// server's clock; the ratio parked / healthy is the target (≥ 0.9).
// bench/README.md ("Park") tells the whole method.
#include <cstdio>

#include "../bench.hpp"

namespace pg_outbox::bench {

namespace {

const char* const kHandler = "SELECT bench_apply($1, $2, $3, $5)";

struct Park {
    Context& ctx;
    int count;

    // Entries/s of the keys other than k0, from the end of the first
    // transaction to the last apply, on the server's clock.
    double healthy_rate() {
        return std::stod(ctx.value("sink", R"(
		WITH a AS (SELECT * FROM bench_applied WHERE key <> 'k0'),
		     f AS (SELECT max(applied_at) AS t FROM a WHERE tx_at = (SELECT min(tx_at) FROM a))
		SELECT coalesce((SELECT round(count(*) / extract(epoch FROM max(a.applied_at) - f.t))
		  FROM a, f WHERE a.applied_at > f.t GROUP BY f.t), 0))"));
    }
    void reset(bool fail) {
        ctx.psql("sink", {"TRUNCATE bench_applied, bench_fail, outbox.inbox, outbox.dead_letters, outbox.parked_keys, "
                          "outbox.parked_entries",
                          fail ? "INSERT INTO bench_fail VALUES (true)" : "SELECT 1", "CHECKPOINT"});
    }
    // One run over the streams of set ("even" or "hot"), healthy or with
    // k0 failing: entries/s of the other keys, and the entries parked.
    std::pair<double, long long> run(const std::string& set, bool fail, long long others, const std::string& group) {
        reset(fail);
        // Group "even" publishes topic c, "hot" topic h.
        const std::string topic = set == "even" ? "c" : "h";
        std::vector<std::unique_ptr<testing::Process>> consumers;
        for (int k = 1; k <= 4; ++k)
            consumers.push_back(ctx.spawn(
                {ctx.relay, "consume", "--pg", ctx.conninfo("sink"), "--redis", ctx.redis_address(), "--consumer",
                 "bench", "--group", group, "--worker", "w" + std::to_string(k), "--stream", set + ":" + topic + ":{shard}",
                 "--shards", "4", "--pool", "--pool-renew", "1s", "--on-failure", "park-key", "--max-deliveries", "1",
                 "--handler", kHandler, "--batch-size", "100", "--block", "100ms", "--log-level", "warn"},
                "park_" + std::to_string(k) + ".log"));
        const bool done = ctx.run({ctx.self, "wait-rows", "--pg", ctx.conninfo("sink"), "--sql",
                                   "SELECT count(*) FROM bench_applied WHERE key <> 'k0'", "--count",
                                   std::to_string(others), "--timeout", "900"})
                              .ok();
        Context::stop_all(consumers);
        if (!done) std::fprintf(stderr, "   %s %s: not every entry of the other keys applied\n", set.c_str(),
                                fail ? "parked" : "healthy");
        return {healthy_rate(), std::stoll(ctx.value("sink", "SELECT count(*) FROM outbox.parked_entries"))};
    }
};

}  // namespace

void workload_park(Context& ctx) {
    Park p{ctx, knob_int("PARK", 100000)};
    const std::string N = std::to_string(p.count);
    Context::say("park: " + N + " entries a round over 1,000 keys, 4 shards, 4 workers --pool: the other keys' "
                 "entries/s with no failure and with k0 failing and parked, k0 one key in 1,000 and a tenth of the "
                 "entries");
    ctx.flush_redis();
    ctx.psql("postgres", {"CREATE DATABASE src", "CREATE DATABASE sink"});
    // Two groups of 4 shards over one outbox: "even" publishes topic c (k0
    // is one key among 1,000), "hot" topic h (k0 a tenth of the entries).
    ctx.psql("src", {"CREATE EXTENSION pg_outbox",
                     "SELECT outbox_group_create('even', ARRAY['c'], 'beginning', shards => 4)",
                     "SELECT outbox_group_create('hot', ARRAY['h'], 'beginning', shards => 4)"});
    ctx.psql("sink", {"CREATE EXTENSION pg_outbox", "SELECT inbox_consumer_create('bench', current_user::regrole)",
                      "CREATE TABLE bench_fail (on_ boolean)",
                      "CREATE TABLE bench_applied (event_id uuid PRIMARY KEY, topic text NOT NULL, key text NOT NULL,\n"
                      "\t\t\tbody jsonb NOT NULL, tx_at timestamptz NOT NULL DEFAULT now(),\n"
                      "\t\t\tapplied_at timestamptz NOT NULL DEFAULT clock_timestamp())",
                      "CREATE FUNCTION bench_apply(topic text, key text, body jsonb, id uuid) RETURNS void\n"
                      "LANGUAGE plpgsql AS $$\n"
                      "BEGIN\n"
                      "\tIF key = 'k0' AND EXISTS (SELECT FROM bench_fail) THEN\n"
                      "\t\tRAISE EXCEPTION 'account k0 is frozen';\n"
                      "\tEND IF;\n"
                      "\tINSERT INTO bench_applied (event_id, topic, key, body) VALUES (id, topic, key, body);\n"
                      "END $$"});
    const std::string body =
        "jsonb_build_object('order_id', i, 'customer', 'customer-000000001', 'amount', 12345, 'currency', 'EUR', "
        "'note', 'lorem ipsum dolor sit amet, consectetur adipiscing elit')";
    ctx.psql("src", {"SELECT count(*) FROM outbox_emit_many('c', (SELECT array_agg('k' || (i % 1000)) FROM "
                     "generate_series(1, " + N + ") i), (SELECT array_agg(" + body + ") FROM generate_series(1, " +
                     N + ") i))",
                     "SELECT count(*) FROM outbox_emit_many('h', (SELECT array_agg(CASE WHEN i % 10 = 0 THEN 'k0' "
                     "ELSE 'k' || (1 + i % 999) END) FROM generate_series(1, " + N + ") i), (SELECT array_agg(" +
                     body + ") FROM generate_series(1, " + N + ") i))"});
    {
        std::vector<std::unique_ptr<testing::Process>> relays;
        for (const std::string g : {"even", "hot"})
            for (int k = 0; k < 4; ++k)
                relays.push_back(ctx.spawn({ctx.relay, "publish", "--pg", ctx.conninfo("src"), "--redis",
                                            ctx.redis_address(), "--group", g + "/" + std::to_string(k), "--stream",
                                            g + ":{topic}:{shard}", "--batch-size", "1000", "--log-level", "warn"},
                                           "relay_" + g + std::to_string(k) + ".log"));
        for (const char* pattern : {"even:*", "hot:*"})
            ctx.must({ctx.self, "wait-entries", "--redis", ctx.redis_address(), "--pattern", pattern, "--count", N,
                      "--timeout", "600"});
        Context::stop_all(relays);
    }
    const long long even_others = std::stoll(ctx.value("src", "SELECT count(*) FROM outbox.event WHERE topic = 'c' "
                                                              "AND key <> 'k0'"));
    const long long hot_others = std::stoll(ctx.value("src", "SELECT count(*) FROM outbox.event WHERE topic = 'h' "
                                                             "AND key <> 'k0'"));
    std::vector<double> even_ok, even_parked, even_ratio, hot_ok, hot_parked, hot_ratio;
    std::vector<double> even_n, hot_n;
    for (int r = 1; r <= ctx.rounds; ++r) {
        // Healthy first in odd rounds, parked first in even ones: a drift
        // of the machine favours neither.
        auto pair = [&](const std::string& set, long long others, std::vector<double>& ok, std::vector<double>& bad,
                        std::vector<double>& ratio, std::vector<double>& parked) {
            std::pair<double, long long> a, b;
            const std::string g = set + "-r" + std::to_string(r);
            if (r % 2) {
                a = p.run(set, false, others, g + "-ok");
                b = p.run(set, true, others, g + "-parked");
            } else {
                b = p.run(set, true, others, g + "-parked");
                a = p.run(set, false, others, g + "-ok");
            }
            ok.push_back(a.first);
            bad.push_back(b.first);
            ratio.push_back(a.first > 0 ? b.first / a.first : 0);
            parked.push_back(static_cast<double>(b.second));
            std::printf("   round %d, %s: other keys' entries/s healthy %.0f, k0 parked %.0f (%lld entries parked)\n",
                        r, set.c_str(), a.first, b.first, b.second);
            std::fflush(stdout);
        };
        pair("even", even_others, even_ok, even_parked, even_ratio, even_n);
        pair("hot", hot_others, hot_ok, hot_parked, hot_ratio, hot_n);
    }
    const std::string h = "park, " + N + " entries, 4 shards, 4 workers --pool, batch 100";
    ctx.row(h + ", k0 one key of 1,000: other keys, no failure (entries/s) | " + stats(even_ok) + " |");
    ctx.row(h + ", k0 one key of 1,000: other keys, k0 failing and parked (entries/s) | " + stats(even_parked) + " |");
    ctx.row(h + ", k0 one key of 1,000: entries of k0 parked | " + stats(even_n) + " |");
    ctx.row(h + ", k0 one key of 1,000: parked / no failure | " + stats(even_ratio) + " | ≥ 0.9");
    ctx.row(h + ", k0 a tenth of the entries: other keys, no failure (entries/s) | " + stats(hot_ok) + " |");
    ctx.row(h + ", k0 a tenth of the entries: other keys, k0 failing and parked (entries/s) | " + stats(hot_parked) +
            " |");
    ctx.row(h + ", k0 a tenth of the entries: entries of k0 parked | " + stats(hot_n) + " |");
    ctx.row(h + ", k0 a tenth of the entries: parked / no failure | " + stats(hot_ratio) + " | ≥ 0.9");
    ctx.flush_redis();
    ctx.psql("postgres", {"DROP DATABASE src", "DROP DATABASE sink"});
}

}  // namespace pg_outbox::bench
