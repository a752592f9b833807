// The "consume" workload: BENCH_CONSUME entries a round applied by
// pg_outbox_relay consume with a one-row handler, for each batch size of
// BENCH_CONSUME_BATCHES (one worker, one stream) and each worker count of
// BENCH_CONSUME_WORKERS (--pool over a 4-shard group), beside a consumer
// written by hand (handler per entry, and set-based) and the bare
// XREADGROUP + XACK loop; the latency emit -> applied with publish and
// consume running together at BENCH_CONSUME_RATES; pgbench -S beside each
// consumer. bench/README.md ("Consume") tells the whole method.
#include <cstdio>
#include <map>
#include <sstream>

#include "../bench.hpp"

namespace pg_outbox::bench {

namespace {

const char* const kHandler = "INSERT INTO bench_applied (event_id, topic, body) VALUES ($5, $1, $3)";
// The hand-written consumer's set-based variant: the dedupe insert and the
// same handler's effect in one statement a batch, over arrays of the
// batch's fields in the stream's order.
const char* const kSetSql =
    "WITH b AS (SELECT * FROM unnest($1, $2, $3, $4, $5) WITH ORDINALITY AS b (event_id, topic, key, payload, headers, n)),\n"
    "\t\tfresh AS (INSERT INTO bench_dedupe (event_id) SELECT event_id FROM b ON CONFLICT DO NOTHING RETURNING event_id)\n"
    "\t\tINSERT INTO bench_applied (event_id, topic, body) SELECT b.event_id, b.topic, b.payload FROM b JOIN fresh USING "
    "(event_id) ORDER BY b.n";

struct Consume {
    Context& ctx;
    int count;
    int seconds;

    // The server's next transaction id; pg_current_snapshot() takes none.
    double xid_next() { return std::stod(ctx.value("sink", "SELECT pg_snapshot_xmax(pg_current_snapshot())")); }
    // Entries/s between the end of the first transaction and the last
    // apply, on the server's clock: neither consumer's start-up counts.
    double applied_rate() {
        return std::stod(ctx.value("sink", R"(
		WITH f AS (SELECT max(applied_at) AS t FROM bench_applied WHERE tx_at = (SELECT min(tx_at) FROM bench_applied))
		SELECT coalesce((SELECT round(count(*) / extract(epoch FROM max(a.applied_at) - f.t))
		  FROM bench_applied a, f WHERE a.applied_at > f.t GROUP BY f.t), 0))"));
    }
    // Empty tables and no checkpoint due. No VACUUM: after TRUNCATE a
    // table has never been vacuumed and the planner assumes it holds rows
    // (10 pages); a VACUUM of the empty table would record 0 rows, and
    // plans made then (the relay's session starts on it) would scan the
    // growing inbox in full for each entry, which no steady state has.
    void reset() { ctx.psql("sink", {"TRUNCATE bench_applied, bench_dedupe, outbox.inbox", "CHECKPOINT"}); }
    // Until bench_applied holds n rows (at most timeout s), a count every
    // 200 ms: the times measured are the server's, the poll only ends the run.
    bool wait_applied(long long n, int timeout = 600) {
        return ctx
            .run({ctx.self, "wait-rows", "--pg", ctx.conninfo("sink"), "--sql", "SELECT count(*) FROM bench_applied",
                  "--count", std::to_string(n), "--timeout", std::to_string(timeout)})
            .ok();
    }

    // One measured run of consumer who (hand, set, ours, bare) over the
    // streams of set (one or four), batch, n workers, consumer group:
    // entries/s and transaction ids per 10k (bare: entries/s, 0).
    std::pair<double, double> run(const std::string& who, const std::string& set, int batch, int n,
                                  const std::string& group) {
        std::vector<std::string> streams, flags;
        if (set == "one") {
            streams = {"--stream", "one:c"};
            flags = {"--stream", "one:c"};
        } else {
            streams = {"--stream", "four:c:0", "--stream", "four:c:1", "--stream", "four:c:2", "--stream", "four:c:3"};
            flags = {"--stream", "four:c:{shard}", "--shards", "4", "--pool", "--pool-renew", "1s"};
        }
        if (who == "bare") {
            std::vector<std::string> argv{ctx.self, "hand-consume", "--bare", "--redis", ctx.redis_address(), "--group",
                                          group};
            argv.insert(argv.end(), streams.begin(), streams.end());
            argv.insert(argv.end(), {"--batch", std::to_string(batch), "--workers", std::to_string(n)});
            return {std::stod(result(ctx.must(argv), "events_per_second")), 0};
        }
        reset();
        const double x0 = xid_next();
        if (who == "hand" || who == "set") {
            std::vector<std::string> argv{ctx.self,  "hand-consume", "--pg", ctx.conninfo("sink"), "--redis",
                                          ctx.redis_address(), "--group", group};
            argv.insert(argv.end(), streams.begin(), streams.end());
            argv.insert(argv.end(), {"--batch", std::to_string(batch), "--workers", std::to_string(n)});
            if (who == "hand")
                argv.insert(argv.end(), {"--handler", kHandler});
            else
                argv.insert(argv.end(), {"--set-sql", kSetSql});
            ctx.must(argv);
        } else {
            std::vector<std::unique_ptr<testing::Process>> consumers;
            for (int k = 1; k <= n; ++k) {
                std::vector<std::string> argv{ctx.relay, "consume",  "--pg",    ctx.conninfo("sink"), "--redis",
                                              ctx.redis_address(), "--consumer", "bench", "--group", group,
                                              "--worker", "w" + std::to_string(k)};
                argv.insert(argv.end(), flags.begin(), flags.end());
                argv.insert(argv.end(), {"--handler", kHandler, "--batch-size", std::to_string(batch), "--block",
                                         "100ms", "--log-level", "warn"});
                consumers.push_back(ctx.spawn(argv, "consume_" + std::to_string(k) + ".log"));
            }
            wait_applied(count);
            Context::stop_all(consumers);
        }
        const double x1 = xid_next();
        const std::string p = ctx.value("sink", "SELECT count(*) FROM bench_applied");
        if (p != std::to_string(count))
            std::fprintf(stderr, "   %s applied %s of %d entries\n", who.c_str(), p.c_str(), count);
        return {applied_rate(), rounded((x1 - x0) * 10000 / count, 0)};
    }

    // Live: emitters at a fixed rate into the outbox (one event a
    // transaction, its payload the emit time), pg_outbox_relay publish
    // (commit order, woken by commits) into the stream live:e, and consumer
    // who (ours, hand, none; alone: neither emitters nor publish) applying
    // it, batch 100, for seconds s at rate tx/s; with pgbench, a pgbench -S
    // beside them. Returns the latency emit -> applied (ms) "p50 p99 p99.9
    // max" when a consumer ran, and the pgbench -S tps when it ran.
    std::pair<std::vector<std::string>, std::string> live(int rate, const std::string& who, bool pgbench) {
        ctx.flush_redis();
        reset();
        std::unique_ptr<testing::Process> relay, consumer, pgb;
        if (who != "alone") {
            ctx.psql("src", {"SELECT outbox_rewind('live', 'now'); UPDATE outbox.groups SET streams = '{}'"});
            relay = ctx.spawn({ctx.relay, "publish", "--pg", ctx.conninfo("src"), "--redis", ctx.redis_address(),
                               "--group", "live", "--stream", "live:{topic}", "--poll-interval", "500ms", "--log-level",
                               "warn"},
                              "relay.log");
        }
        if (who == "ours")
            consumer = ctx.spawn({ctx.relay, "consume", "--pg", ctx.conninfo("sink"), "--redis", ctx.redis_address(),
                                  "--consumer", "bench", "--group", "live", "--stream", "live:e", "--handler", kHandler,
                                  "--batch-size", "100", "--log-level", "warn"},
                                 "consume_1.log");
        else if (who == "hand")
            consumer = ctx.spawn({ctx.self, "hand-consume", "--pg", ctx.conninfo("sink"), "--redis",
                                  ctx.redis_address(), "--group", "live", "--stream", "live:e", "--batch", "100",
                                  "--handler", kHandler, "--seconds", std::to_string(seconds + 90)},
                                 "hand.out");
        nap(1);
        const std::string port = std::to_string(ctx.pg->port());
        if (pgbench)
            pgb = ctx.spawn({"pgbench", "-n", "-S", "-M", "prepared", "-h", "127.0.0.1", "-p", port, "-U", "postgres",
                             "-c", "4", "-j", "2", "-T", std::to_string(seconds), "pgb"},
                            "pgbench_s.out");
        std::string emit_out;
        if (who != "alone")
            emit_out = ctx.run({"pgbench", "-n", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-c", "4", "-j",
                                "2", "-R", std::to_string(rate), "-T", std::to_string(seconds), "-f",
                                ctx.work + "/live.sql", "src"})
                           .output;
        std::string pgb_out;
        if (pgb) {
            while (pgb->running()) nap(0.05);
            pgb_out = pgb->log();
            pgb.reset();
        }
        std::pair<std::vector<std::string>, std::string> out;
        const bool consumed = who == "ours" || who == "hand";
        if (consumed) {
            long long emitted = 0;
            const std::string key = "number of transactions actually processed: ";
            const auto at = emit_out.find(key);
            if (at != std::string::npos) emitted = std::stoll(emit_out.substr(at + key.size()));
            if (!wait_applied(emitted, 60))
                std::fprintf(stderr, "   %s: not every emitted event applied after 60 s\n", who.c_str());
        }
        Context::stop(consumer);
        Context::stop(relay);
        if (consumed) {
            std::istringstream in(ctx.value("sink", R"(
			SELECT round(percentile_disc(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2) || ' ' ||
			       round(percentile_disc(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 2) || ' ' ||
			       round(percentile_disc(0.999) WITHIN GROUP (ORDER BY ms)::numeric, 2) || ' ' || round(max(ms)::numeric, 2)
			  FROM (SELECT (extract(epoch FROM applied_at) - (body->>'t')::float8) * 1000 AS ms FROM bench_applied) s)"));
            std::string w;
            while (in >> w) out.first.push_back(w);
        }
        if (pgbench) {
            std::istringstream in(pgb_out);
            std::string line;
            while (std::getline(in, line))
                if (line.rfind("tps = ", 0) == 0) out.second = line.substr(6, line.find(' ', 6) - 6);
        }
        return out;
    }
};

std::string col(const std::vector<std::vector<double>>& rows, std::size_t i) {
    std::vector<double> v;
    for (const auto& l : rows) v.push_back(l[i]);
    return stats(v);
}

std::string ratio(const std::vector<std::vector<double>>& rows, std::size_t a, std::size_t b) {
    std::vector<double> v;
    for (const auto& l : rows) v.push_back(l[a] / l[b]);
    return stats(v);
}

}  // namespace

void workload_consume(Context& ctx) {
    Consume c{ctx, knob_int("CONSUME", 20000), knob_int("CONSUME_SECONDS", 10)};
    const auto batches = words(knob("CONSUME_BATCHES", "10 100 1000"));
    const auto workers = words(knob("CONSUME_WORKERS", "1 2 4"));
    const auto rates = words(knob("CONSUME_RATES", "2000 5000"));
    const int pgbench_rate = knob_int("CONSUME_PGBENCH_RATE", 2000);
    auto join = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& w : v) s += (s.empty() ? "" : " ") + w;
        return s;
    };
    const std::string N = std::to_string(c.count);
    Context::say("consume: " + N + " entries a round, batches of " + join(batches) + " and " + join(workers) +
                 " worker(s): pg_outbox_relay consume vs a hand-written consumer (handler per entry, and set-based) vs "
                 "the bare XREADGROUP + XACK loop; latency at " +
                 join(rates) + " tx/s; pgbench -S beside each");
    ctx.flush_redis();
    ctx.psql("postgres", {"CREATE DATABASE src", "CREATE DATABASE sink", "CREATE DATABASE pgb"});
    // One outbox, published twice: group "one" into the stream one:c (the
    // batch rows) and group "four", 4 shards, into four:c:0 to four:c:3 (the
    // worker rows); "live" for the rounds that emit as they consume.
    ctx.psql("src", {"CREATE EXTENSION pg_outbox", "SELECT outbox_group_create('one', start_at => 'beginning')",
                     "SELECT outbox_group_create('four', start_at => 'beginning', shards => 4)",
                     "SELECT outbox_group_create('live', ordering => 'commit')"});
    // The consumer's side: the inbox consumer of pg_outbox_relay consume,
    // the hand-written consumer's dedupe table, and the projection both
    // apply to with the same one-row handler. applied_at is the moment of
    // the handler, tx_at the start of its transaction.
    ctx.psql("sink", {"CREATE EXTENSION pg_outbox", "SELECT inbox_consumer_create('bench', current_user::regrole)",
                      "CREATE TABLE bench_dedupe (event_id uuid PRIMARY KEY)",
                      "CREATE TABLE bench_applied (event_id uuid PRIMARY KEY, topic text NOT NULL, body jsonb NOT NULL,\n"
                      "\t\t\ttx_at timestamptz NOT NULL DEFAULT now(), applied_at timestamptz NOT NULL DEFAULT "
                      "clock_timestamp())"});
    ctx.psql("src", {"SELECT count(*) FROM outbox_emit_many('c',\n"
                     "\t\t(SELECT array_agg(lpad(i::text, 16, '0')) FROM generate_series(1, " + N + ") i),\n"
                     "\t\t(SELECT array_agg(jsonb_build_object('order_id', i, 'customer', 'customer-000000001', 'amount', 12345,\n"
                     "\t\t\t'currency', 'EUR', 'status', 'confirmed', 'note', 'lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod'))\n"
                     "\t\t   FROM generate_series(1, " + N + ") i))"});
    {
        std::vector<std::unique_ptr<testing::Process>> relays;
        relays.push_back(ctx.spawn({ctx.relay, "publish", "--pg", ctx.conninfo("src"), "--redis", ctx.redis_address(),
                                    "--group", "one", "--stream", "one:{topic}", "--batch-size", "1000", "--log-level",
                                    "warn"},
                                   "relay.log"));
        for (int k = 0; k < 4; ++k)
            relays.push_back(ctx.spawn({ctx.relay, "publish", "--pg", ctx.conninfo("src"), "--redis",
                                        ctx.redis_address(), "--group", "four/" + std::to_string(k), "--stream",
                                        "four:{topic}:{shard}", "--batch-size", "1000", "--log-level", "warn"},
                                       "relay_" + std::to_string(k) + ".log"));
        for (const char* pattern : {"one:*", "four:*"})
            ctx.must({ctx.self, "wait-entries", "--redis", ctx.redis_address(), "--pattern", pattern, "--count", N,
                      "--timeout", "600"});
        Context::stop_all(relays);
    }
    {
        auto r = ctx.redis->connect();
        std::string lens;
        for (int k = 0; k < 4; ++k) {
            auto reply = r.command_raw({"XLEN", "four:c:" + std::to_string(k)});
            lens += std::to_string(reply->integer) + " ";
        }
        std::printf("   shards of four: %sentries\n", lens.c_str());
    }
    ctx.psql("pgb", {"SELECT 1"});
    ctx.run({"pgbench", "-i", "-q", "-s", "10", "-h", "127.0.0.1", "-p", std::to_string(ctx.pg->port()), "-U",
             "postgres", "pgb"});
    std::vector<std::vector<double>> batch_rows, worker_rows;
    for (int r = 1; r <= ctx.rounds; ++r) {
        std::vector<double> line;
        std::string text;
        for (const auto& b : batches)
            for (const std::string who : {"hand", "ours", "set", "bare"}) {
                const auto [eps, xids] =
                    c.run(who, "one", std::stoi(b), 1, who + "-r" + std::to_string(r) + "-b" + b);
                line.insert(line.end(), {eps, xids});
                text += " " + fixed(eps, 0) + " " + fixed(xids, 0);
            }
        batch_rows.push_back(line);
        std::printf("   round %d: entries/s and xids per 10k (hand-written, pg_outbox_relay consume, hand-written "
                    "set-based, bare) at batches %s:%s\n",
                    r, join(batches).c_str(), text.c_str());
        line.clear();
        text.clear();
        for (const auto& n : workers)
            for (const std::string who : {"hand", "ours", "bare"}) {
                const auto [eps, xids] = c.run(who, "four", 100, std::stoi(n), who + "-r" + std::to_string(r) + "-w" + n);
                line.insert(line.end(), {eps, xids});
                text += " " + fixed(eps, 0) + " " + fixed(xids, 0);
            }
        worker_rows.push_back(line);
        std::printf("   round %d: entries/s and xids per 10k (hand-written, pg_outbox_relay consume, bare) with %s "
                    "worker(s):%s\n",
                    r, join(workers).c_str(), text.c_str());
    }
    // columns per batch: hand-written eps and xids, ours, set-based, bare (eps, 0)
    std::size_t k = 0;
    for (const auto& b : batches) {
        const std::string h = "consume, batch " + b + ": ";
        const bool hundred = b == "100";
        ctx.row("consume " + N + " entries, batch " + b +
                ", 1 worker: hand-written consumer, handler per entry pipelined (events/s) | " + col(batch_rows, k) + " |");
        ctx.row(h + "pg_outbox_relay consume (events/s) | " + col(batch_rows, k + 2) + " | " + (hundred ? "≥ 10000" : ""));
        ctx.row(h + "hand-written consumer, set-based, one statement a batch (events/s) | " + col(batch_rows, k + 4) + " |");
        ctx.row(h + "bare XREADGROUP + XACK loop, the Redis-side ceiling (events/s) | " + col(batch_rows, k + 6) + " |");
        ctx.row(h + "pg_outbox_relay consume / hand-written | " + ratio(batch_rows, k + 2, k) + " | " +
                (hundred ? "≥ 0.9" : ""));
        ctx.row(h + "pg_outbox_relay consume / hand-written set-based | " + ratio(batch_rows, k + 2, k + 4) + " |");
        ctx.row(h + "hand-written / bare loop | " + ratio(batch_rows, k, k + 6) + " |");
        ctx.row(h + "pg_outbox_relay consume / bare loop | " + ratio(batch_rows, k + 2, k + 6) + " |");
        ctx.row(h + "transaction ids per 10,000 entries, hand-written (both) | " + col(batch_rows, k + 1) + " / " +
                col(batch_rows, k + 5) + " |");
        ctx.row(h + "transaction ids per 10,000 entries, pg_outbox_relay consume | " + col(batch_rows, k + 3) + " | ≤ " +
                std::to_string(10000 / std::stoi(b)));
        k += 8;
    }
    k = 0;
    for (const auto& n : workers) {
        const std::string h = "consume, 4 shards, " + n + " worker(s): ";
        ctx.row("consume " + N + " entries of a 4-shard group, batch 100 a stream, " + n +
                " worker(s): hand-written, stream i to worker i mod " + n + " (events/s) | " + col(worker_rows, k) + " |");
        ctx.row(h + "pg_outbox_relay consume --pool (events/s) | " + col(worker_rows, k + 2) + " |");
        ctx.row(h + "bare XREADGROUP + XACK loop (events/s) | " + col(worker_rows, k + 4) + " |");
        ctx.row(h + "pg_outbox_relay consume / hand-written | " + ratio(worker_rows, k + 2, k) + " |");
        ctx.row(h + "pg_outbox_relay consume / bare loop | " + ratio(worker_rows, k + 2, k + 4) + " |");
        ctx.row(h + "transaction ids per 10,000 entries, hand-written / pg_outbox_relay consume | " +
                col(worker_rows, k + 1) + " / " + col(worker_rows, k + 3) + " |");
        k += 6;
    }
    ctx.flush_redis();

    ctx.write("live.sql", "SELECT outbox_emit('e', 'k' || :client_id, jsonb_build_object('t', extract(epoch FROM "
                          "clock_timestamp())));\n");
    // pgbench's tables in shared_buffers before the first measure
    ctx.run({"pgbench", "-n", "-S", "-M", "prepared", "-h", "127.0.0.1", "-p", std::to_string(ctx.pg->port()), "-U",
             "postgres", "-c", "4", "-j", "2", "-T", "3", "pgb"});
    std::map<std::string, std::vector<std::vector<std::string>>> latencies;  // by "who rate"
    std::vector<std::vector<double>> tps_rows;  // alone, none, hand, ours
    for (int r = 1; r <= ctx.rounds; ++r) {
        for (const auto& rate : rates)
            for (const std::string who : {"hand", "ours"}) {
                const auto f = c.live(std::stoi(rate), who, false).first;
                latencies[who + " " + rate].push_back(f);
                std::printf("   round %d, %s tx/s, %s: emit to applied p50/p99/p99.9/max ms: %s\n", r, rate.c_str(),
                            who.c_str(), join(f).c_str());
            }
        // pgbench -S alone; beside the emitters and the publishing relay at
        // BENCH_CONSUME_PGBENCH_RATE tx/s without a consumer, with the
        // hand-written one, with pg_outbox_relay consume. The order turns
        // round by round, so that a drift of the machine favours none.
        const std::vector<std::string> cases{"alone", "none", "hand", "ours"};
        std::map<std::string, double> tps;
        for (int i = 0; i < 4; ++i) {
            const std::string& who = cases[(i + r - 1) % 4];
            const std::string t = c.live(pgbench_rate, who, true).second;
            tps[who] = t.empty() ? 0 : std::stod(t);
        }
        tps_rows.push_back({tps["alone"], tps["none"], tps["hand"], tps["ours"]});
        std::printf("   round %d: pgbench -S tps (alone; beside emitters and publish: no consumer, hand-written, "
                    "pg_outbox_relay consume): %g %g %g %g\n",
                    r, tps["alone"], tps["none"], tps["hand"], tps["ours"]);
    }
    for (const auto& rate : rates)
        for (const std::string who : {"ours", "hand"}) {
            const std::string label = who == "hand" ? "pg_outbox_relay publish + hand-written consumer"
                                                    : "pg_outbox_relay publish + consume";
            auto lat = [&](std::size_t i) {
                std::vector<double> v;
                for (const auto& f : latencies[who + " " + rate])
                    if (i < f.size()) v.push_back(std::stod(f[i]));
                return stats(v);
            };
            const std::string h = "consume latency at " + rate + " tx/s, " + label;
            ctx.row(h + ", batch 100: emit to applied p50 (ms) | " + lat(0) + " |");
            ctx.row(h + ": p99 (ms) | " + lat(1) + " | " + (who == "ours" && rate == "2000" ? "< 10" : ""));
            ctx.row(h + ": p99.9 (ms) | " + lat(2) + " |");
            ctx.row(h + ": max (ms) | " + lat(3) + " |");
        }
    auto loss = [&](std::size_t i) {
        std::vector<double> v;
        for (const auto& l : tps_rows) v.push_back(1 - l[i] / l[0]);
        return stats(v);
    };
    const std::string rate_text = std::to_string(pgbench_rate);
    ctx.row("pgbench -S, 4 clients, " + std::to_string(c.seconds) + " s, alone (tps) | " + col(tps_rows, 0) + " |");
    ctx.row("pgbench -S beside emitters and pg_outbox_relay publish at " + rate_text + " tx/s, no consumer (tps) | " +
            col(tps_rows, 1) + " |");
    ctx.row("pgbench -S beside the same and the hand-written consumer (tps) | " + col(tps_rows, 2) + " |");
    ctx.row("pgbench -S beside the same and pg_outbox_relay consume (tps) | " + col(tps_rows, 3) + " |");
    ctx.row("pgbench -S: loss beside the hand-written consumer (1 - tps / tps alone) | " + loss(2) + " |");
    ctx.row("pgbench -S: loss beside pg_outbox_relay consume (1 - tps / tps alone) | " + loss(3) + " |");
    ctx.row("pgbench -S: loss of the emitters and publish alone, without a consumer (1 - tps / tps alone) | " + loss(1) +
            " |");
    ctx.row("pgbench -S: tps beside pg_outbox_relay consume / beside the hand-written consumer | " +
            ratio(tps_rows, 3, 2) + " | ≥ 1");
    ctx.flush_redis();
    ctx.psql("postgres", {"DROP DATABASE src", "DROP DATABASE sink", "DROP DATABASE pgb"});
}

}  // namespace pg_outbox::bench
