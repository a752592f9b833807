// The "advance" workload: the server's cost of a leader's calls, per call,
// as pgbench -r reports them (one client, BENCH_ADVANCE_SECONDS a script):
// outbox_fetch_packed() and outbox_fetch() on an empty feed and with a
// batch of 100 events, and outbox_advance() (with streams, so that every
// call writes the row), in xid8 and commit order, beside SELECT 1. Commits
// do not wait for the WAL flush (synchronous_commit off, as the relay's
// advances with explicit ids): the figures are the calls' own cost, not
// the disk's.
//
// With BENCH_BASE_DESTDIR (a copy of PostgreSQL's tree into which another
// build of pg_outbox was installed, as PG_OUTBOX_DESTDIR), the same calls
// are measured on a second server running that build, the two servers
// taking turns within each round (every other round in reverse order);
// each figure of this build is then also divided by the base build's, round
// by round: the before/after of the fetch/advance path.
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "../bench.hpp"

namespace pg_outbox::bench {

namespace {

const char* const kDb = "fetch_advance_bench";

// One server measured: the main one (port 0) or the base build's.
struct Server {
    std::string label;
    int port = 0;
    std::map<std::string, std::string> pos;  // by order: the last event's position
};

// Groups, per order o: e_o (the cursor at its last event: an empty feed,
// and the position its advances go to) and b_o (100 events ahead of the
// cursor, which never moves: the same batch every call).
void setup(Context& ctx, Server& s) {
    ctx.psql("postgres", {std::string("DROP DATABASE IF EXISTS ") + kDb, std::string("CREATE DATABASE ") + kDb}, s.port);
    ctx.psql(kDb,
             {"CREATE EXTENSION pg_outbox",
              "SELECT outbox_group_create(g || '_' || o, start_at => 'beginning', ordering => o)\n"
              "  FROM unnest(ARRAY['e', 'b']) g, unnest(ARRAY['xid8', 'commit']) o",
              "SELECT outbox_emit('t', (n % 10)::text, jsonb_build_object('n', n)) FROM generate_series(1, 100) n"},
             s.port);
    // Read by a session that ends at once: the benchmark's session takes
    // the lead after it.
    for (const char* o : {"xid8", "commit"}) {
        const std::string out = ctx.value(
            kDb, std::string("SELECT pos FROM outbox_fetch('e_") + o + "', 1000) ORDER BY txid DESC, seq DESC LIMIT 1",
            s.port);
        ctx.psql(kDb, {std::string("SELECT outbox_resign('e_") + o + "')"}, s.port);
        s.pos[o] = out;
    }
}

// Runs one script; returns "statement" → ms per call from pgbench -r.
std::vector<std::pair<std::string, double>> measure(Context& ctx, const Server& s, const std::string& script,
                                                    int seconds) {
    const std::string out =
        ctx.must({"env", "PGOPTIONS=-c synchronous_commit=off", "pgbench", "-n", "-c", "1", "-T",
                  std::to_string(seconds), "-r", "-h", "127.0.0.1", "-p", std::to_string(s.port ? s.port : ctx.pg->port()),
                  "-U", "postgres", "-f", script, kDb});
    std::vector<std::pair<std::string, double>> ms;
    std::istringstream in(out);
    std::string line;
    bool on = false;
    while (std::getline(in, line)) {
        if (line.rfind("statement latencies", 0) == 0) {
            on = true;
            continue;
        }
        if (!on) continue;
        std::istringstream l(line);
        double latency = 0;
        long failures = 0;
        std::string text;
        if (!(l >> latency >> failures)) continue;
        std::getline(l >> std::ws, text);
        if (!text.empty() && text.back() == ';') text.pop_back();
        ms.emplace_back(text, latency);
    }
    return ms;
}

std::string base_testkit() { return PG_OUTBOX_TESTKIT_PATH; }

}  // namespace

void workload_advance(Context& ctx) {
    const int seconds = knob_int("ADVANCE_SECONDS", 3);
    const std::string base_destdir = knob("BASE_DESTDIR", "");
    Context::say("advance: a leader's calls of outbox_fetch_packed, outbox_fetch and outbox_advance, per call" +
                 (base_destdir.empty() ? std::string() : ", against the build installed in " + base_destdir));
    std::vector<Server> servers{{"this build", 0, {}}};
    // The base build's server, started by the test kit's program from that
    // tree's programs, and stopped by the PID it recorded.
    struct BaseGuard {
        Context& ctx;
        std::string dir;
        ~BaseGuard() {
            if (!dir.empty()) ctx.run({base_testkit(), "stop", "--dir", dir});
        }
    } guard{ctx, {}};
    if (!base_destdir.empty()) {
        guard.dir = ctx.work + "/pg_base";
        const int port = testing::free_port();
        ctx.must({"env", "PG_OUTBOX_PG_BIN=" + base_destdir + "/usr/lib/postgresql/15/bin", base_testkit(), "start",
                  "pg", "--dir", guard.dir, "--port", std::to_string(port), "--", "shared_buffers = '1GB'",
                  "max_wal_size = '8GB'", "checkpoint_timeout = '30min'", "max_connections = 50",
                  "shared_preload_libraries = 'pg_outbox'"});
        servers.push_back({"base build", port, {}});
    }
    for (auto& s : servers) setup(ctx, s);
    const std::string one = ctx.write("advance_one.sql", "SELECT 1;\n");
    // Per server, statement (positions left out) → ms per round.
    std::map<std::string, std::map<std::string, std::vector<double>>> ms;
    std::vector<std::string> statements;
    for (int r = 1; r <= ctx.rounds; ++r) {
        // Every other round in reverse order: the load of a shared machine
        // drifts, and the server measured first would otherwise pay for it.
        std::vector<Server*> order;
        for (auto& s : servers) order.push_back(&s);
        if (r % 2 == 0) std::reverse(order.begin(), order.end());
        for (Server* s : order) {
            auto record = [&](const std::vector<std::pair<std::string, double>>& got, const std::string& o) {
                for (const auto& [text, v] : got) {
                    std::string key = text;
                    if (!o.empty()) {
                        // Positions vary by server: left out of the statement's text.
                        const std::string& p = s->pos[o];
                        for (std::size_t at; (at = key.find(p)) != std::string::npos;) key.replace(at, p.size(), "POS");
                    }
                    if (std::find(statements.begin(), statements.end(), key) == statements.end())
                        statements.push_back(key);
                    ms[s->label][key].push_back(v);
                    std::printf("   round %d, %s: %.3f ms  %s\n", r, s->label.c_str(), v, key.c_str());
                }
            };
            record(measure(ctx, *s, one, seconds), "");
            for (const std::string o : {"xid8", "commit"}) {
                const std::string& p = s->pos[o];
                const std::string cycle = ctx.write(
                    "advance_cycle.sql", "SELECT outbox_fetch_packed('e_" + o + "', 1000);\n"
                                         "SELECT count(*) FROM outbox_fetch('e_" + o + "', 1000);\n"
                                         "SELECT outbox_advance('e_" + o + "', '" + p + "', '{\"s\": \"" + p + "\"}');\n"
                                         "SELECT outbox_fetch_packed('b_" + o + "', 1000);\n"
                                         "SELECT count(*) FROM outbox_fetch('b_" + o + "', 1000);\n");
                record(measure(ctx, *s, cycle, seconds), o);
            }
        }
    }
    for (const auto& st : statements) {
        ctx.row("advance: " + st + " (ms per call) | " + stats(ms["this build"][st]) + " |");
        if (servers.size() > 1) {
            const auto& a = ms["this build"][st];
            const auto& b = ms["base build"][st];
            std::vector<double> ratio;
            for (std::size_t k = 0; k < a.size() && k < b.size(); ++k) ratio.push_back(a[k] / b[k]);
            ctx.row("advance: " + st + ", this build / base build | " + stats(ratio) + " |");
        }
    }
    for (auto& s : servers) ctx.psql("postgres", {std::string("DROP DATABASE ") + kDb}, s.port);
}

}  // namespace pg_outbox::bench
