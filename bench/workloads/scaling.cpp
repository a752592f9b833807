// The "scaling" workload: a backlog of BENCH_SCALING_EVENTS events drained
// by one relay per shard, for each shard count of BENCH_SCALING_SHARDS,
// into each target of BENCH_SCALING_TARGETS (one Redis; a Redis Cluster of
// 3 masters; "cluster-base": the same cluster drained by the relay binary
// BENCH_SCALING_BASE_RELAY), with the emitters stopped and running at
// BENCH_SCALING_EMIT_RATE events/s. Each point against the first shard
// count of the same target and emitter state, round by round; the
// scaling chart draws the drain's events/s.
#include <cstdio>
#include <map>
#include <sstream>

#include "../bench.hpp"

namespace pg_outbox::bench {

namespace {

// events/s, emitted/s, and CPU µs per drained event of the relays'
// backends, PostgreSQL (all), the relays, the Redis server(s).
using Point = std::vector<double>;

}  // namespace

void workload_scaling(Context& ctx) {
    const int events = knob_int("SCALING_EVENTS", 500000);
    const auto shards = words(knob("SCALING_SHARDS", "1 2 4"));
    const auto targets = words(knob("SCALING_TARGETS", "redis cluster"));
    const int emit_rate = knob_int("SCALING_EMIT_RATE", 20000);
    const int rounds = knob_int("SCALING_ROUNDS", ctx.rounds);
    const int timeout = knob_int("SCALING_TIMEOUT", 300);
    const std::string base_relay = knob("SCALING_BASE_RELAY", "");
    std::string listed;
    for (const auto& n : shards) listed += (listed.empty() ? "" : " ") + n;
    Context::say("scaling: a " + std::to_string(events) + "-event backlog drained by one relay per shard (" + listed +
                 " shards) into one Redis and a Redis Cluster of 3 masters, emitters stopped and at " +
                 std::to_string(emit_rate) + " events/s");
    for (const auto& t : targets)
        if (t == "cluster-base" && base_relay.empty())
            throw BenchError("the cluster-base target needs BENCH_SCALING_BASE_RELAY");
    testing::RedisClusterServers cluster(3, 0, std::chrono::milliseconds(1000), {},
                                         testing::Placement{ctx.work + "/cluster", 0, false});
    ctx.psql("postgres", {"CREATE DATABASE scaling"});
    ctx.psql("scaling", {"CREATE EXTENSION pg_outbox"});
    for (const auto& n : shards)
        ctx.psql("scaling", {"SELECT outbox_group_create('s" + n +
                             "', start_at => 'beginning', ordering => 'xid8', shards => " + n + ")"});
    ctx.load_events("scaling", events);
    ctx.psql("scaling", {"VACUUM ANALYZE outbox.event"});
    // The emitters: transactions of 10 events of one of four topics, random
    // keys (so every shard gets its share), at a fixed rate.
    const std::string emit_sql = ctx.write("scaling_emit.sql", std::string("\\set t random(0, 3)\n"
                                                                           "\\set k random(1, 100000000)\n"
                                                                           "SELECT count(*) FROM outbox_emit_many('topic' || :t,\n"
                                                                           "\t(SELECT array_agg(lpad((:k + i)::text, 16, '0')) FROM generate_series(1, 10) i),\n"
                                                                           "\t(SELECT array_agg('") +
                                                                   kPayload + "'::jsonb) FROM generate_series(1, 10)));\n");
    auto point = [&](const std::string& target, const std::string& state, const std::string& n) {
        std::string addr;
        std::vector<std::string> nodes;
        std::vector<pid_t> redis_pids;
        if (target != "redis") {
            addr = cluster.url();
            for (std::size_t i = 0; i < cluster.size(); ++i) {
                nodes.push_back(cluster.node(i).address());
                redis_pids.push_back(cluster.node(i).pid());
            }
        } else {
            addr = ctx.redis_address();
            nodes = {addr};
            redis_pids = {ctx.redis->pid()};
        }
        if (target == "redis")
            ctx.flush_redis();
        else
            for (std::size_t i = 0; i < cluster.size(); ++i) cluster.node(i).connect().command_raw({"FLUSHALL"});
        ctx.rewind_shards("scaling", "s" + n);
        ctx.settle("scaling");
        std::unique_ptr<testing::Process> emitters;
        if (state == "running") {
            emitters = ctx.spawn({"pgbench", "-n", "-M", "prepared", "-h", "127.0.0.1", "-p",
                                  std::to_string(ctx.pg->port()), "-U", "postgres", "-c", "2", "-j", "1", "-R",
                                  std::to_string(emit_rate / 10), "-T", std::to_string(timeout), "-f", emit_sql,
                                  "scaling"},
                                 "scaling_pgbench.out");
            nap(1);  // a steady load before the relays start
        }
        const std::string x0 = ctx.value("scaling", "SELECT pg_current_xact_id()");
        auto pids = ctx.pg_processes();
        pids.insert(pids.end(), redis_pids.begin(), redis_pids.end());
        const auto cpu0 = Context::cpu_snapshot(pids);
        const double t0 = epoch_now();
        auto relays = ctx.start_shard_relays("scaling", "s" + n, std::stoi(n), addr,
                                             target == "cluster-base" ? base_relay : std::string());
        std::vector<std::string> wait{ctx.self, "wait-entries"};
        for (const auto& node : nodes) wait.insert(wait.end(), {"--redis", node});
        wait.insert(wait.end(), {"--count", std::to_string(events), "--timeout", std::to_string(timeout)});
        ctx.must(wait, std::chrono::seconds(timeout + 60));
        const double t1 = epoch_now();
        // the relays' backends first, so that every snapshot below is
        // taken at the same moment
        std::vector<pid_t> backends;
        {
            std::istringstream in(ctx.value(
                "scaling", "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'pg_outbox_relay%'"));
            pid_t p;
            while (in >> p) backends.push_back(p);
        }
        const auto pg1 = Context::cpu_snapshot(ctx.pg_processes());
        const auto pgrelay1 = Context::cpu_snapshot(backends);
        const auto redis1 = Context::cpu_snapshot(redis_pids);
        std::vector<pid_t> relay_pids;
        for (const auto& p : relays) relay_pids.push_back(p->pid());
        const auto relay1 = Context::cpu_snapshot(relay_pids);
        double emitted = 0;
        if (emitters) {
            emitted = std::stod(ctx.value("scaling", "SELECT count(*) FROM outbox.event WHERE txid > '" + x0 + "'"));
            Context::stop(emitters);
        }
        Context::stop_all(relays);
        Point pt{rounded(events / (t1 - t0), 0), rounded(emitted / (t1 - t0), 0)};
        for (const auto* part : {&pgrelay1, &pg1, &relay1, &redis1})
            pt.push_back(rounded(Context::cpu_between(cpu0, *part) * 1e6 / events, 2));
        return pt;
    };
    std::map<std::string, std::vector<Point>> points;  // by "target state n"
    for (int r = 1; r <= rounds; ++r)
        for (const auto& target : targets)
            for (const std::string state : {"stopped", "running"})
                for (const auto& n : shards) {
                    const Point pt = point(target, state, n);
                    points[target + " " + state + " " + n].push_back(pt);
                    std::printf("   round %d, %s, emitters %s, %s shard(s): events/s, emitted/s, CPU µs per event "
                                "(PostgreSQL relay backends, PostgreSQL all, relays, Redis): %.0f %.0f %.2f %.2f %.2f "
                                "%.2f\n",
                                r, target.c_str(), state.c_str(), n.c_str(), pt[0], pt[1], pt[2], pt[3], pt[4], pt[5]);
                }
    // Rows, and the chart's data: one block per target and emitter state,
    // "shards median min max" of the drain's events/s.
    std::string dat;
    const std::string& first = shards.front();
    for (const auto& target : targets) {
        std::string tname = "one Redis";
        if (target == "cluster") tname = "Redis Cluster, 3 masters, no replicas";
        if (target == "cluster-base") tname = "Redis Cluster, 3 masters, no replicas, relay " + base_relay;
        for (const std::string state : {"stopped", "running"}) {
            const std::string sname =
                state == "running" ? "emitters at " + std::to_string(emit_rate) + " events/s" : "emitters stopped";
            dat += "# " + tname + ", " + sname + "\n";
            for (const auto& n : shards) {
                const auto& f = points[target + " " + state + " " + n];
                const auto& base = points[target + " " + state + " " + first];
                auto col = [&](int i) {
                    std::vector<double> v;
                    for (const auto& p : f) v.push_back(p[i]);
                    return v;
                };
                // round by round, against the first shard count of the same target and state
                std::vector<double> ratio;
                for (std::size_t k = 0; k < f.size(); ++k) ratio.push_back(f[k][0] / base[k][0]);
                const std::string head = "scaling, " + tname + ", " + sname + ", " + n + " shard(s)";
                ctx.row(head + ": drain (events/s) | " + stats(col(0)) + " |");
                ctx.row("scaling, " + tname + ", " + sname + ", " + n + " shard(s) / " + first + " shard(s) | " +
                        stats(ratio) + " |");
                if (state == "running") ctx.row(head + ": emitted while draining (events/s) | " + stats(col(1)) + " |");
                ctx.row(head +
                        ": CPU per drained event of PostgreSQL (the relays' backends; all its processes), relays, "
                        "Redis (µs) | " +
                        stats(col(2)) + "; " + stats(col(3)) + ", " + stats(col(4)) + ", " + stats(col(5)) + " |");
                auto eps = col(0);
                std::sort(eps.begin(), eps.end());
                const std::size_t m = eps.size();
                const double median = m % 2 ? eps[m / 2] : (eps[m / 2 - 1] + eps[m / 2]) / 2;
                char line[128];
                std::snprintf(line, sizeof line, "%s %g %g %g\n", n.c_str(), median, eps.front(), eps.back());
                dat += line;
            }
            dat += "\n\n";
        }
    }
    const std::string dat_path = ctx.write("scaling.dat", dat);
    // one line per block of scaling.dat (target and emitter state)
    std::string plot;
    int index = 0;
    std::istringstream titles(dat);
    std::string line;
    while (std::getline(titles, line))
        if (line.rfind("# ", 0) == 0)
            plot += (plot.empty() ? "" : ",") + ("'" + dat_path + "' index " + std::to_string(index++) +
                                                  " using 1:2:3:4 with yerrorlines lw 2 pt 7 title '" +
                                                  line.substr(2) + "'");
    std::string xtics;
    for (const auto& n : shards) xtics += (xtics.empty() ? "" : ", ") + n;
    char xmax[32];
    std::snprintf(xmax, sizeof xmax, "%g", std::stod(shards.back()) * 1.25);
    ctx.chart("scaling", "set terminal pngcairo size 960,600 font ',11'\n"
                         "set output '@OUTPUT@'\n"
                         "set title \"Drain of a " +
                             std::to_string(events) + "-event backlog, one relay per shard (" +
                             std::to_string(cores()) +
                             " cores, everything on one machine)\"\n"
                             "set xlabel 'shards (relays)'\n"
                             "set ylabel 'events/s published (median, bars: min-max of " +
                             std::to_string(rounds) +
                             " rounds)'\n"
                             "set logscale x 2\n"
                             "set xtics (" +
                             xtics +
                             ")\n"
                             "set xrange [0.8:" +
                             xmax +
                             "]\n"
                             "set yrange [0:*]\n"
                             "set format y '%.0s%c'\n"
                             "set key bottom right\n"
                             "set grid\n"
                             "plot " +
                             plot + "\n");
    for (std::size_t i = 0; i < cluster.size(); ++i) cluster.node(i).connect().command_raw({"FLUSHALL"});
    ctx.flush_redis();
    ctx.drop_database("scaling");
}

}  // namespace pg_outbox::bench
