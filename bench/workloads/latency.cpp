// The "latency" workload: writers at each rate of BENCH_RATES single-event
// transactions per second for BENCH_SECONDS (pgbench -R); the time from
// the emitting statement to the entry's arrival in Redis (a blocking XREAD
// by `pg_outbox_bench latency`), for a relay woken by commits in commit
// and in xid8 order, and one polling every 100 ms. Every latency of every
// round, pooled, is drawn by percentile in the latency chart.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "../bench.hpp"

namespace pg_outbox::bench {

namespace {

std::vector<double> read_numbers(const std::string& path) {
    std::ifstream in(path);
    std::vector<double> v;
    double x;
    while (in >> x) v.push_back(x);
    return v;
}

const char* label_of(const std::string& mode, bool chart) {
    if (mode == "poll") return chart ? "commit order, polling every 100 ms" : "commit order, polling every 100ms";
    if (mode == "xid8") return "xid8 order, woken by commits";
    return "commit order, woken by commits";
}

}  // namespace

void workload_latency(Context& ctx) {
    const auto rates = words(knob("RATES", knob("RATE", "2000 5000")));
    const int seconds = knob_int("SECONDS", 15);
    std::string listed;
    for (const auto& r : rates) listed += (listed.empty() ? "" : " ") + r;
    Context::say("latency: " + listed + " transactions/s for " + std::to_string(seconds) +
                 "s each, woken by commits vs polling every 100ms");
    ctx.psql("postgres", {"CREATE DATABASE lat"});
    ctx.psql("lat", {"CREATE EXTENSION pg_outbox", "SELECT outbox_group_create('lat', ordering => 'commit')",
                     "SELECT outbox_group_create('lat_xid8', ordering => 'xid8')"});
    const std::string script = ctx.write(
        "lat.sql",
        "SELECT outbox_emit('lat', 'k' || :client_id, jsonb_build_object('t', extract(epoch FROM clock_timestamp())));\n");
    const std::vector<std::string> modes{"listen", "poll", "xid8"};
    // Per rate and mode: each round's p50, p99, p99.9 and max (as printed),
    // and every latency of every round.
    std::map<std::string, std::vector<std::vector<std::string>>> figures;
    std::map<std::string, std::vector<double>> pooled;
    for (int r = 1; r <= ctx.rounds; ++r) {
        for (const auto& rate : rates) {
            const long long count = std::stoll(rate) * seconds * 95 / 100;
            for (const auto& mode : modes) {
                ctx.flush_redis();
                const std::string group = mode == "xid8" ? "lat_xid8" : "lat";
                ctx.psql("lat", {"SELECT outbox_rewind('" + group + "', 'now'); UPDATE outbox.groups SET streams = '{}'"});
                std::vector<std::string> argv{ctx.relay, "publish", "--pg", ctx.conninfo("lat"), "--redis",
                                              ctx.redis_address(), "--group", group, "--log-level", "warn"};
                if (mode == "poll")
                    argv.insert(argv.end(), {"--no-listen", "--poll-interval", "100ms"});
                else
                    argv.insert(argv.end(), {"--poll-interval", "500ms"});
                auto relay = ctx.spawn(argv, "relay.log");
                nap(1);
                const std::string samples = ctx.work + "/lat_samples";
                std::remove(samples.c_str());
                auto probe = ctx.spawn({ctx.self, "latency", "--redis", ctx.redis_address(), "--stream", "outbox:lat",
                                        "--count", std::to_string(count), "--timeout", std::to_string(seconds + 30),
                                        "--samples", samples},
                                       "lat.out");
                nap(0.5);
                // Its failure shows in the probe's figures.
                ctx.run({"pgbench", "-n", "-h", "127.0.0.1", "-p", std::to_string(ctx.pg->port()), "-U", "postgres",
                         "-c", "4", "-j", "2", "-R", rate, "-T", std::to_string(seconds), "-f", script, "lat"});
                while (probe->running()) nap(0.05);
                const std::string out = probe->log();
                probe.reset();
                // every round's latencies, pooled, for the chart
                auto& pool = pooled[mode + "_" + rate];
                const auto got = read_numbers(samples);
                pool.insert(pool.end(), got.begin(), got.end());
                Context::stop(relay);
                std::vector<std::string> f{result(out, "p50_ms"), result(out, "p99_ms"), result(out, "p999_ms"),
                                           result(out, "max_ms")};
                figures[mode + "_" + rate].push_back(f);
                std::printf("   round %d, %s tx/s, %s: p50/p99/p99.9/max ms: %s %s %s %s\n", r, rate.c_str(),
                            mode.c_str(), f[0].c_str(), f[1].c_str(), f[2].c_str(), f[3].c_str());
            }
        }
    }
    auto col = [&](const std::string& key, int i) {
        std::vector<double> v;
        for (const auto& l : figures[key])
            if (!l[i].empty()) v.push_back(std::stod(l[i]));
        return stats(v);
    };
    for (const auto& rate : rates)
        for (const auto& mode : modes) {
            const std::string key = mode + "_" + rate;
            const std::string prefix = "latency at " + rate + " tx/s, " + label_of(mode, false) + ": ";
            // Targets, woken by commits: p99 < 5 ms; at 2,000 tx/s also
            // p99.9 < 10 ms and a maximum < 50 ms.
            const bool woken = mode != "poll";
            const bool strict = woken && rate == "2000";
            ctx.row(prefix + "commit to stream p50 (ms) | " + col(key, 0) + " |");
            ctx.row(prefix + "p99 (ms) | " + col(key, 1) + " | " + (woken ? "< 5" : ""));
            ctx.row(prefix + "p99.9 (ms) | " + col(key, 2) + " | " + (strict ? "< 10" : ""));
            ctx.row(prefix + "max (ms) | " + col(key, 3) + " | " + (strict ? "< 50" : ""));
        }
    // Each round's figures, woken by commits.
    for (const auto& rate : rates)
        for (const std::string mode : {"listen", "xid8"}) {
            int r = 0;
            for (const auto& f : figures[mode + "_" + rate])
                ctx.row("latency at " + rate + " tx/s, " + (mode == "xid8" ? "xid8 order" : "commit order") +
                        ", round " + std::to_string(++r) + ": p50 / p99 / p99.9 / max (ms) | " + f[0] + " / " + f[1] +
                        " / " + f[2] + " / " + f[3] + " |");
        }
    // The chart: percentile on a "nines" axis, x = -log10(1 - q), up to
    // the largest sample.
    std::vector<std::string> plots;
    for (const auto& rate : rates)
        for (const auto& mode : modes) {
            auto a = pooled[mode + "_" + rate];
            if (a.empty()) continue;
            std::sort(a.begin(), a.end());
            const std::size_t n = a.size();
            std::ostringstream pct;
            for (int step = 0; step <= 300; ++step) {
                const double x = step * 0.02;
                const std::size_t i = static_cast<std::size_t>((1 - std::pow(10, -x)) * static_cast<double>(n)) + 1;
                if (i >= n) break;
                pct << x << " " << a[i - 1] << "\n";
            }
            pct << std::log10(static_cast<double>(n)) << " " << a[n - 1] << "\n";
            const std::string path = ctx.write("latdist_" + mode + "_" + rate + ".pct", pct.str());
            plots.push_back("'" + path + "' using 1:2 with lines lw 2 title '" + rate + " tx/s, " +
                            label_of(mode, true) + "'");
        }
    if (!plots.empty()) {
        std::string plot;
        for (const auto& p : plots) plot += (plot.empty() ? "" : ",") + p;
        ctx.chart("latency", "set terminal pngcairo size 960,600 font ',11'\n"
                             "set output '@OUTPUT@'\n"
                             "set title \"Emit to visible in Redis: latency by percentile (every round pooled, " +
                                 std::to_string(seconds) +
                                 " s each)\"\n"
                                 "set xlabel 'percentile'\n"
                                 "set ylabel 'ms'\n"
                                 "set logscale y\n"
                                 "set xtics ('50' log10(2), '90' 1, '99' 2, '99.9' 3, '99.99' 4, '99.999' 5)\n"
                                 "set xrange [0:*]\n"
                                 "set autoscale xfixmax\n"
                                 "set yrange [0.1:*]\n"
                                 "set key bottom right\n"
                                 "set grid\n"
                                 "plot " +
                                 plot + "\n");
    }
    ctx.drop_database("lat");
}

}  // namespace pg_outbox::bench
