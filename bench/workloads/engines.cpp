// The "engines" workload: the SQL engine (pg_outbox_sql, SQL and PL/pgSQL
// only) beside the C engine (pg_outbox) and a plain INSERT, on the same
// server and the same work: two databases, eng_c with the C engine and
// eng_sql with the SQL engine (one database cannot have both). The server
// preloads pg_outbox, as a server running the C engine does in
// production; the SQL engine's database uses nothing of the library.
// Measured, each round, on both: single-event emit with pgbench (4
// clients) and a plain INSERT of the same row in the same database (the
// floor); set-based emit in one session (outbox_emit_many, and outbox_emit
// once per row of an INSERT ... SELECT's kind of query), per row; the drain
// of BENCH_ENGINES_EVENTS waiting events to Redis by pg_outbox_relay; the
// latency from the emitting statement to the entry in Redis at
// BENCH_ENGINES_RATE tx/s through the relay, woken by commits; entries
// applied per second by pg_outbox_relay consume through each engine's
// inbox. Ratios are taken round by round, SQL engine over C engine.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>

#include "../bench.hpp"

namespace pg_outbox::bench {

namespace {

const char* const kPlainTable = R"(
	CREATE TABLE plain_events (id bigserial PRIMARY KEY, topic text, key text, payload jsonb, headers jsonb,
		event_id uuid, created_at timestamptz DEFAULT now()))";
const char* const kApplied =
    "CREATE TABLE bench_applied (event_id uuid PRIMARY KEY, topic text NOT NULL, body jsonb NOT NULL,\n"
    "\ttx_at timestamptz NOT NULL DEFAULT now(), applied_at timestamptz NOT NULL DEFAULT clock_timestamp())";
const char* const kHandler = "INSERT INTO bench_applied (event_id, topic, body) VALUES ($5, $1, $3)";

struct Engines {
    Context& ctx;
    int emit_seconds;
    int bulk;
    long long events;
    int rate;
    int seconds;
    int consume;
    int consume_round = 0;

    static std::string db(const std::string& engine) { return "eng_" + engine; }

    // Runs a waiting program (argv) to its end while the relay or consumer
    // it waits for runs; throws BenchError, with what that one said, when
    // it exits first (an engine it cannot work with, say).
    void wait_beside(std::unique_ptr<testing::Process>& worker, const std::vector<std::string>& argv,
                     const std::string& log) {
        auto waiter = ctx.spawn(argv, log);
        while (waiter->running()) {
            if (!worker->running()) {
                const std::string said = worker->log();
                waiter.reset();
                throw BenchError("the relay exited before the end of the measurement:\n" + said);
            }
            nap(0.05);
        }
        const int status = waiter->wait(std::chrono::milliseconds(0));
        if (status != 0) throw BenchError(argv[1] + " exited with " + std::to_string(status) + ":\n" + waiter->log());
    }

    // Events/s of pgbench (4 clients, prepared) running script for s seconds.
    double tps(const std::string& engine, const std::string& script, int s) {
        return ctx.pgbench(db(engine), {"-M", "prepared", "-c", "4", "-j", "2", "-T", std::to_string(s), "-f", script});
    }
    void reset(const std::string& engine) {
        ctx.psql(db(engine), {"TRUNCATE plain_events, outbox.event, outbox.commit_log", "CHECKPOINT"});
    }
    // Rows per second of one statement in one session.
    double per_second(const std::string& engine, const std::string& sql, long long rows) {
        reset(engine);
        const double t0 = epoch_now();
        ctx.psql(db(engine), {sql});
        return rows / (epoch_now() - t0);
    }

    // BENCH_ENGINES_EVENTS waiting events of group "drain" (emitted first,
    // in transactions of 10,000) published from the beginning by
    // pg_outbox_relay (batch 1000): events/s.
    double drain(const std::string& engine) {
        reset(engine);
        ctx.load_events(db(engine), events);
        ctx.flush_redis();
        ctx.psql(db(engine), {"SELECT outbox_rewind('drain', 'beginning'); UPDATE outbox.groups SET streams = '{}'"});
        ctx.settle(db(engine));
        const double t0 = epoch_now();
        auto relay = ctx.spawn({ctx.relay, "publish", "--pg", ctx.conninfo(db(engine)), "--redis", ctx.redis_address(),
                                "--group", "drain", "--batch-size", "1000", "--log-level", "warn"},
                               "relay_" + engine + ".log");
        wait_beside(relay, {ctx.self, "wait-entries", "--redis", ctx.redis_address(), "--count", std::to_string(events),
                            "--timeout", "1800"},
                    "wait_" + engine + ".out");
        const double t1 = epoch_now();
        Context::stop(relay);
        return rounded(static_cast<double>(events) / (t1 - t0), 0);
    }

    // Writers at rate single-event tx/s for seconds; the time from the
    // emitting statement to the entry in Redis (`pg_outbox_bench
    // latency`), the relay of group "lat" (xid8 order) woken by commits:
    // p50, p99, p99.9, max (ms).
    std::vector<std::string> latency(const std::string& engine) {
        ctx.flush_redis();
        ctx.psql(db(engine), {"SELECT outbox_rewind('lat', 'now'); UPDATE outbox.groups SET streams = '{}'"});
        auto relay = ctx.spawn({ctx.relay, "publish", "--pg", ctx.conninfo(db(engine)), "--redis", ctx.redis_address(),
                                "--group", "lat", "--poll-interval", "500ms", "--log-level", "warn"},
                               "relay_lat_" + engine + ".log");
        nap(1);
        const long long count = static_cast<long long>(rate) * seconds * 95 / 100;
        auto probe = ctx.spawn({ctx.self, "latency", "--redis", ctx.redis_address(), "--stream", "outbox:lat", "--count",
                                std::to_string(count), "--timeout", std::to_string(seconds + 30)},
                               "lat_" + engine + ".out");
        nap(0.5);
        // Its failure shows in the probe's figures.
        ctx.run({"pgbench", "-n", "-h", "127.0.0.1", "-p", std::to_string(ctx.pg->port()), "-U", "postgres", "-c", "4",
                 "-j", "2", "-R", std::to_string(rate), "-T", std::to_string(seconds), "-f", ctx.work + "/lat.sql",
                 db(engine)});
        while (probe->running()) {
            if (!relay->running()) {
                const std::string said = relay->log();
                probe.reset();
                throw BenchError("the relay exited before the end of the measurement:\n" + said);
            }
            nap(0.05);
        }
        const std::string out = probe->log();
        probe.reset();
        Context::stop(relay);
        return {result(out, "p50_ms"), result(out, "p99_ms"), result(out, "p999_ms"), result(out, "max_ms")};
    }

    // The stream cons:c: the BENCH_ENGINES_CONSUME events of database
    // eng_src (C engine) published again from the beginning, fields as
    // pg_outbox_relay publish writes them.
    void publish_consume_stream() {
        ctx.flush_redis();
        ctx.psql("eng_src", {"SELECT outbox_rewind('cons', 'beginning'); UPDATE outbox.groups SET streams = '{}'"});
        auto relay = ctx.spawn({ctx.relay, "publish", "--pg", ctx.conninfo("eng_src"), "--redis", ctx.redis_address(),
                                "--group", "cons", "--stream", "cons:{topic}", "--batch-size", "1000", "--log-level",
                                "warn"},
                               "relay_cons.log");
        wait_beside(relay, {ctx.self, "wait-entries", "--redis", ctx.redis_address(), "--pattern", "cons:*", "--count",
                            std::to_string(consume), "--timeout", "600"},
                    "wait_cons.out");
        Context::stop(relay);
    }

    // The stream cons:c of BENCH_ENGINES_CONSUME entries applied by
    // pg_outbox_relay consume (batch 100) into the engine's inbox, through
    // a consumer group of its own: entries/s between the end of the first
    // transaction and the last apply, on the server's clock.
    double consume_rate(const std::string& engine) {
        ctx.psql(db(engine), {"TRUNCATE bench_applied, outbox.inbox", "CHECKPOINT"});
        const std::string group = "g" + std::to_string(++consume_round);
        auto consumer = ctx.spawn({ctx.relay, "consume", "--pg", ctx.conninfo(db(engine)), "--redis",
                                   ctx.redis_address(), "--consumer", "bench", "--group", group, "--stream", "cons:c",
                                   "--handler", kHandler, "--batch-size", "100", "--log-level", "warn"},
                                  "consume_" + engine + ".log");
        wait_beside(consumer, {ctx.self, "wait-rows", "--pg", ctx.conninfo(db(engine)), "--sql",
                               "SELECT count(*) FROM bench_applied", "--count", std::to_string(consume), "--timeout",
                               "600"},
                    "wait_consume_" + engine + ".out");
        Context::stop(consumer);
        return std::stod(ctx.value(db(engine), R"(
		WITH f AS (SELECT max(applied_at) AS t FROM bench_applied WHERE tx_at = (SELECT min(tx_at) FROM bench_applied))
		SELECT coalesce((SELECT round(count(*) / extract(epoch FROM max(a.applied_at) - f.t))
		  FROM bench_applied a, f WHERE a.applied_at > f.t GROUP BY f.t), 0))"));
    }
};

}  // namespace

void workload_engines(Context& ctx) {
    Engines e{ctx,
              knob_int("ENGINES_EMIT_SECONDS", 10),
              knob_int("ENGINES_BULK", 100000),
              knob_int("ENGINES_EVENTS", 200000),
              knob_int("ENGINES_RATE", 2000),
              knob_int("ENGINES_SECONDS", 15),
              knob_int("ENGINES_CONSUME", 20000)};
    const std::string B = std::to_string(e.bulk);
    const std::string P = kPayload;
    Context::say("engines: the SQL engine beside the C engine and a plain INSERT (databases eng_sql and eng_c, one "
                 "server preloading pg_outbox)");
    for (const std::string engine : {"c", "sql"}) {
        ctx.psql("postgres", {"CREATE DATABASE " + Engines::db(engine)});
        ctx.psql(Engines::db(engine),
                 {std::string("CREATE EXTENSION ") + (engine == "c" ? "pg_outbox" : "pg_outbox_sql"), kPlainTable,
                  kApplied, "SELECT outbox_group_create('drain', start_at => 'beginning', ordering => 'xid8')",
                  "SELECT outbox_group_create('lat', ordering => 'xid8')",
                  "SELECT inbox_consumer_create('bench', current_user::regrole)"});
        const std::string engine_name = ctx.value(Engines::db(engine), "SELECT engine FROM outbox.engine()");
        if (engine_name != engine) throw BenchError("database " + Engines::db(engine) + " is on engine " + engine_name);
    }
    // The entries to consume: BENCH_ENGINES_CONSUME events of one topic in
    // a third database (C engine), published into the stream cons:c before
    // each round's consumers.
    ctx.psql("postgres", {"CREATE DATABASE eng_src"});
    ctx.psql("eng_src", {"CREATE EXTENSION pg_outbox",
                         "SELECT outbox_group_create('cons', start_at => 'beginning', ordering => 'xid8')",
                         "SELECT count(*) FROM outbox_emit_many('c', (SELECT array_agg(lpad(i::text, 16, '0')) FROM "
                         "generate_series(1, " + std::to_string(e.consume) + ") i), (SELECT array_agg('" + P +
                             "'::jsonb) FROM generate_series(1, " + std::to_string(e.consume) + ")))"});
    const std::string emit1 = ctx.write("eng_emit.sql", "\\set k random(1, 100000000)\nSELECT outbox_emit('orders', "
                                                        "lpad(:k::text, 16, '0'), '" + P + "');\n");
    const std::string plain1 =
        ctx.write("eng_plain.sql", "\\set k random(1, 100000000)\nINSERT INTO plain_events (topic, key, payload, "
                                   "event_id) VALUES ('orders', lpad(:k::text, 16, '0'), '" + P +
                                       "', gen_random_uuid());\n");
    ctx.write("lat.sql",
              "SELECT outbox_emit('lat', 'k' || :client_id, jsonb_build_object('t', extract(epoch FROM "
              "clock_timestamp())));\n");
    const std::map<std::string, std::string> bulk_sql{
        {"plain", "INSERT INTO plain_events (topic, key, payload, event_id) SELECT 'orders', lpad(i::text, 16, '0'), '" +
                      P + "', gen_random_uuid() FROM generate_series(1, " + B + ") i"},
        {"many", "SELECT count(*) FROM outbox_emit_many('orders', (SELECT array_agg(lpad(i::text, 16, '0')) FROM "
                 "generate_series(1, " + B + ") i), (SELECT array_agg('" + P + "'::jsonb) FROM generate_series(1, " +
                     B + ")))"},
        {"row", "SELECT count(outbox_emit('orders', lpad(i::text, 16, '0'), '" + P + "')) FROM generate_series(1, " +
                    B + ") i"},
    };
    // Per round, by name: the figures of each engine.
    std::vector<std::map<std::string, double>> rounds;
    std::map<std::string, std::vector<std::vector<std::string>>> lat;
    // What failed, by measurement ("drain sql"), with the reason.
    std::map<std::string, std::string> failures;
    for (int r = 1; r <= ctx.rounds; ++r) {
        std::map<std::string, double> f;
        // Single-event emit: each engine's emit and its database's plain
        // INSERT, twice for half the time, the list forward then backward.
        const int half = (e.emit_seconds + 1) / 2;
        const std::vector<std::string> order{"c:plain", "c:emit", "sql:plain", "sql:emit",
                                             "sql:emit", "sql:plain", "c:emit", "c:plain"};
        for (const auto& v : order) {
            const std::string engine = v.substr(0, v.find(':'));
            e.reset(engine);
            f["emit1 " + v] += e.tps(engine, v.substr(v.find(':') + 1) == "plain" ? plain1 : emit1, half) / 2;
        }
        for (const std::string engine : {"c", "sql"})
            for (const std::string kind : {"plain", "many", "row"})
                f["bulk " + engine + ":" + kind] = e.per_second(engine, bulk_sql.at(kind), e.bulk);
        // A relay or consumer that cannot work with an engine fails that
        // engine's figure alone: the row says so, the others are measured.
        auto attempt = [&](const std::string& what, const std::function<void()>& measure) {
            try {
                measure();
            } catch (const BenchError& err) {
                failures[what] = err.what();
                std::fprintf(stderr, "   round %d: %s failed: %s\n", r, what.c_str(), err.what());
            }
        };
        for (const std::string engine : {"c", "sql"}) {
            f["drain " + engine] = std::nan("");
            attempt("drain " + engine, [&] { f["drain " + engine] = e.drain(engine); });
        }
        for (const std::string engine : {"c", "sql"}) {
            lat[engine].push_back({"", "", "", ""});
            attempt("latency " + engine, [&] { lat[engine].back() = e.latency(engine); });
        }
        e.publish_consume_stream();
        for (const std::string engine : {"c", "sql"}) {
            f["consume " + engine] = std::nan("");
            attempt("consume " + engine, [&] { f["consume " + engine] = e.consume_rate(engine); });
        }
        std::printf("   round %d: emit 1/tx events/s (C: plain emit; SQL: plain emit): %.0f %.0f; %.0f %.0f\n", r,
                    f["emit1 c:plain"], f["emit1 c:emit"], f["emit1 sql:plain"], f["emit1 sql:emit"]);
        std::printf("   round %d: bulk rows/s (C: plain many row; SQL: plain many row): %.0f %.0f %.0f; %.0f %.0f %.0f\n",
                    r, f["bulk c:plain"], f["bulk c:many"], f["bulk c:row"], f["bulk sql:plain"], f["bulk sql:many"],
                    f["bulk sql:row"]);
        std::printf("   round %d: drain events/s C %.0f SQL %.0f; consume entries/s C %.0f SQL %.0f\n", r, f["drain c"],
                    f["drain sql"], f["consume c"], f["consume sql"]);
        for (const std::string engine : {"c", "sql"}) {
            const auto& l = lat[engine].back();
            std::printf("   round %d: latency at %d tx/s, %s engine, p50/p99/p99.9/max ms: %s %s %s %s\n", r, e.rate,
                        engine.c_str(), l[0].c_str(), l[1].c_str(), l[2].c_str(), l[3].c_str());
        }
        rounds.push_back(f);
    }
    // A figure no round measured reads "failed".
    auto shown = [](const std::vector<double>& v) { return v.empty() ? std::string("failed") : stats(v); };
    auto col = [&](const std::string& name, int digits = 0) {
        std::vector<double> v;
        for (const auto& f : rounds)
            if (!std::isnan(f.at(name))) v.push_back(rounded(f.at(name), digits));
        return shown(v);
    };
    auto ratio = [&](const std::string& a, const std::string& b) {
        std::vector<double> v;
        for (const auto& f : rounds)
            if (!std::isnan(f.at(a) / f.at(b))) v.push_back(f.at(a) / f.at(b));
        return shown(v);
    };
    // µs per row of a bulk statement.
    auto us = [&](const std::string& name) {
        std::vector<double> v;
        for (const auto& f : rounds) v.push_back(rounded(1e6 / f.at(name), 2));
        return stats(v);
    };
    auto lat_col = [&](const std::string& engine, int i) {
        std::vector<double> v;
        for (const auto& l : lat[engine])
            if (!l[i].empty()) v.push_back(std::stod(l[i]));
        return shown(v);
    };
    const std::map<std::string, std::string> label{{"c", "C engine"}, {"sql", "SQL engine"}};
    for (const std::string engine : {"c", "sql"}) {
        const std::string p = "engines, " + label.at(engine) + ": ";
        ctx.row(p + "emit, 1 event a transaction, 4 clients: plain INSERT in its database (events/s) | " +
                col("emit1 " + engine + ":plain") + " |");
        ctx.row(p + "emit, 1 event a transaction, 4 clients: outbox_emit (events/s) | " + col("emit1 " + engine + ":emit") +
                " |");
        ctx.row(p + "emit, 1 event a transaction: outbox_emit / plain INSERT | " +
                ratio("emit1 " + engine + ":emit", "emit1 " + engine + ":plain") + " | " +
                (engine == "sql" ? "≥ 0.85" : "≥ 0.97"));
        ctx.row(p + "bulk, one session, " + B + " rows: plain INSERT ... SELECT (µs per row) | " +
                us("bulk " + engine + ":plain") + " |");
        ctx.row(p + "bulk, one session: outbox_emit_many (µs per row) | " + us("bulk " + engine + ":many") + " |");
        ctx.row(p + "bulk, one session: outbox_emit once per row, set-based SQL (µs per row) | " +
                us("bulk " + engine + ":row") + " |");
        ctx.row(p + "bulk: outbox_emit_many / plain INSERT ... SELECT (rows/s) | " +
                ratio("bulk " + engine + ":many", "bulk " + engine + ":plain") + " |");
        ctx.row(p + "bulk: outbox_emit per row / plain INSERT ... SELECT (rows/s) | " +
                ratio("bulk " + engine + ":row", "bulk " + engine + ":plain") + " |");
        ctx.row(p + "drain of " + std::to_string(e.events) + " waiting events by pg_outbox_relay (events/s) | " +
                col("drain " + engine) + " |");
        ctx.row(p + "latency at " + std::to_string(e.rate) + " tx/s, xid8 order, woken by commits: p50 (ms) | " +
                lat_col(engine, 0) + " |");
        ctx.row(p + "latency at " + std::to_string(e.rate) + " tx/s: p99 (ms) | " + lat_col(engine, 1) + " | " +
                (engine == "sql" ? "< 10" : "< 5"));
        ctx.row(p + "latency at " + std::to_string(e.rate) + " tx/s: p99.9 (ms) | " + lat_col(engine, 2) + " |");
        ctx.row(p + "latency at " + std::to_string(e.rate) + " tx/s: max (ms) | " + lat_col(engine, 3) + " |");
        ctx.row(p + "consume " + std::to_string(e.consume) + " entries, batch 100, one worker (entries/s) | " +
                col("consume " + engine) + " |");
    }
    ctx.row("engines, SQL / C: single-event emit (events/s) | " + ratio("emit1 sql:emit", "emit1 c:emit") + " |");
    ctx.row("engines, SQL / C: outbox_emit_many (rows/s) | " + ratio("bulk sql:many", "bulk c:many") + " |");
    ctx.row("engines, SQL / C: outbox_emit per row, set-based (rows/s) | " + ratio("bulk sql:row", "bulk c:row") + " |");
    ctx.row("engines, SQL / C: drain (events/s) | " + ratio("drain sql", "drain c") + " | ≥ 0.6");
    ctx.row("engines, SQL / C: consume (entries/s) | " + ratio("consume sql", "consume c") + " |");
    // Each failure's first line of what the program said (a relay's log
    // line without its time), "|" kept out of the table's cells.
    for (const auto& [what, why] : failures) {
        std::string said = why.substr(why.find('\n') == std::string::npos ? 0 : why.find('\n') + 1);
        said = said.substr(0, said.find('\n'));
        if (!said.empty() && std::isdigit(static_cast<unsigned char>(said[0])) && said.find(' ') != std::string::npos)
            said = said.substr(said.find(' ') + 1);
        std::replace(said.begin(), said.end(), '|', '/');
        ctx.row("engines: " + what + " failed | " + said + " |");
    }
    for (const std::string engine : {"c", "sql"}) ctx.drop_database(Engines::db(engine));
    ctx.drop_database("eng_src");
}

}  // namespace pg_outbox::bench
