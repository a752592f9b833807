// The "fetch" workload: one call of outbox_fetch by the leader, empty and
// with a batch of 1000, vs SELECT 1, through pgbench (one client,
// prepared statements: what a relay's backend does per call). A batch
// fetched without advancing is the same batch again.
#include <cstdio>

#include "../bench.hpp"

namespace pg_outbox::bench {

namespace {

const char* const kGroups[] = {"empty_x", "empty_c", "full_x", "full_c"};

// Prepares database fetchbench on the server at ctx's PostgreSQL: four
// groups, two empty and two with a batch of 1000 waiting.
void prepare(Context& ctx) {
    ctx.psql("postgres", {"CREATE DATABASE fetchbench"});
    ctx.psql("fetchbench", {"CREATE EXTENSION pg_outbox",
                            "SELECT outbox_group_create('full_x', start_at => 'beginning', ordering => 'xid8')",
                            "SELECT outbox_group_create('full_c', start_at => 'beginning', ordering => 'commit')"});
    ctx.load_events("fetchbench", 1000);
    // 'now' is the horizon, which the maintenance run woken by CREATE
    // EXTENSION holds back while it lasts: the empty groups start once the
    // horizon has passed the events.
    ctx.psql("fetchbench",
             {"DO $$ BEGIN\n"
              "\t\t\tWHILE outbox.horizon() <= (SELECT max(txid) FROM outbox.event) LOOP PERFORM pg_sleep(0.05); END "
              "LOOP;\n\t\tEND $$",
              "SELECT outbox_group_create('empty_x', start_at => 'now', ordering => 'xid8')",
              "SELECT outbox_group_create('empty_c', start_at => 'now', ordering => 'commit')", "VACUUM ANALYZE"});
    for (const char* g : kGroups)
        std::printf("   %s: %s events a call\n", g,
                    ctx.value("fetchbench", std::string("SELECT count(*) FROM outbox_fetch('") + g + "', 1000)").c_str());
}

// ms per call of each script (select1, then the groups), one pgbench run each.
std::vector<double> measure(Context& ctx, int seconds) {
    std::vector<double> ms;
    for (const std::string f : {"select1", "empty_x", "empty_c", "full_x", "full_c"}) {
        const double tps = ctx.pgbench("fetchbench", {"-M", "prepared", "-c", "1", "-T", std::to_string(seconds), "-f",
                                                      ctx.work + "/fetch_" + f + ".sql"});
        // As the table printed it: four decimals.
        ms.push_back(std::stod(fixed(1000 / tps, 4)));
    }
    return ms;
}

void run(Context& ctx) {
    const int seconds = knob_int("FETCH_SECONDS", 5);
    Context::say("fetch: one call of outbox_fetch by the leader, empty and with a batch of 1000, vs SELECT 1");
    ctx.write("fetch_select1.sql", "SELECT 1;\n");
    for (const char* g : kGroups)
        ctx.write(std::string("fetch_") + g + ".sql",
                  std::string("SELECT count(*) FROM outbox_fetch('") + g + "', 1000);\n");
    prepare(ctx);
    std::vector<std::vector<double>> rounds;
    for (int r = 1; r <= ctx.rounds; ++r) {
        rounds.push_back(measure(ctx, seconds));
        std::string line;
        for (double v : rounds.back()) line += " " + fixed(v, 4);
        std::printf("   round %d: ms per call (select1 empty_x empty_c full_x full_c):%s\n", r, line.c_str());
    }
    auto column = [&](int i) {
        std::vector<double> v;
        for (const auto& l : rounds) v.push_back(l[i]);
        return v;
    };
    auto ratio = [&](const std::vector<std::vector<double>>& a, int i, const std::vector<std::vector<double>>& b,
                     int j) {
        std::vector<double> v;
        for (std::size_t k = 0; k < a.size(); ++k) v.push_back(a[k][i] / b[k][j]);
        return v;
    };
    ctx.row("fetch: SELECT 1 (ms per call) | " + stats(column(0)) + " |");
    ctx.row("fetch, xid8 order: empty batch (ms per call) | " + stats(column(1)) + " |");
    ctx.row("fetch, commit order: empty batch (ms per call) | " + stats(column(2)) + " |");
    ctx.row("fetch, xid8 order: empty batch / SELECT 1 | " + stats(ratio(rounds, 1, rounds, 0)) + " |");
    ctx.row("fetch, commit order: empty batch / SELECT 1 | " + stats(ratio(rounds, 2, rounds, 0)) + " |");
    ctx.row("fetch, xid8 order: batch of 1000 (ms per call) | " + stats(column(3)) + " |");
    ctx.row("fetch, commit order: batch of 1000 (ms per call) | " + stats(column(4)) + " |");
    ctx.drop_database("fetchbench");
}

}  // namespace

void workload_fetch(Context& ctx) { run(ctx); }

}  // namespace pg_outbox::bench
