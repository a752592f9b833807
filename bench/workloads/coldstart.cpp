// The "coldstart" workload: a relay started on empty partitions, then a
// burst of BENCH_BURST events; the time from the burst's last commit to its
// last XADD.
#include <cstdio>

#include "../bench.hpp"

namespace pg_outbox::bench {

void workload_coldstart(Context& ctx) {
    const int burst = knob_int("BURST", 500000);
    Context::say("cold start: relay started on empty partitions, then a burst of " + std::to_string(burst) + " events");
    std::vector<double> seconds;
    for (int r = 1; r <= ctx.rounds; ++r) {
        ctx.flush_redis();
        ctx.psql("postgres", {"DROP DATABASE IF EXISTS cold", "CREATE DATABASE cold"});
        ctx.psql("cold", {"CREATE EXTENSION pg_outbox",
                          "SELECT outbox_group_create('cold', start_at => 'beginning', ordering => 'commit')"});
        auto relay = ctx.spawn({ctx.relay, "publish", "--pg", ctx.conninfo("cold"), "--redis", ctx.redis_address(),
                                "--group", "cold", "--log-level", "warn"},
                               "relay.log");
        nap(2);  // the relay polls the empty table for a while
        ctx.load_events("cold", burst);
        const double t_commit = epoch_now();
        ctx.wait_streams(burst);
        const double t_done = epoch_now();
        Context::stop(relay);
        // As the table printed it: milliseconds.
        seconds.push_back(std::stod(fixed(t_done - t_commit, 3)));
        std::printf("   round %d: last commit to last XADD %s s\n", r, fixed(seconds.back(), 3).c_str());
    }
    ctx.row("cold start, commit order: last commit to last XADD of a " + std::to_string(burst) +
            "-event burst (s) | " + stats(seconds) + " | < 2");
    ctx.drop_database("cold");
}

}  // namespace pg_outbox::bench
