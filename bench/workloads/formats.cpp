// The "formats" workload: the publish rate of pg_outbox_relay in each
// stream entry format (--format default, cloudevents,
// cloudevents-structured) over the same waiting events, round by round,
// with the ratio of each CloudEvents format to the default format and to
// the bare pipelined XADD of the same entries (xadd-ceiling --format).
#include <cstdio>

#include "../bench.hpp"

namespace pg_outbox::bench {

namespace {

const char* const kFormats[] = {"default", "cloudevents", "cloudevents-structured"};

// Drains the group from the beginning with pg_outbox_relay in a format;
// events per second.
double drain_in(Context& ctx, const std::string& format, long long events) {
    ctx.flush_redis();
    ctx.psql("formats", {"SELECT outbox_rewind('formats', 'beginning'); UPDATE outbox.groups SET streams = '{}'"});
    ctx.settle("formats");
    const double t0 = epoch_now();
    auto relay = ctx.spawn({ctx.relay, "publish", "--pg", ctx.conninfo("formats"), "--redis", ctx.redis_address(),
                            "--group", "formats", "--batch-size", "1000", "--format", format, "--log-level", "warn"},
                           "relay-" + format + ".log");
    ctx.wait_streams(events);
    const double t1 = epoch_now();
    Context::stop(relay);
    return rounded(static_cast<double>(events) / (t1 - t0), 0);
}

}  // namespace

void workload_formats(Context& ctx) {
    const long long events = knob_int("FORMAT_EVENTS", 200000);
    const std::string n = std::to_string(events);
    Context::say("formats: " + n + " waiting events in each entry format, " + std::to_string(ctx.rounds) + " rounds");
    ctx.psql("postgres", {"CREATE DATABASE formats"});
    ctx.psql("formats", {"CREATE EXTENSION pg_outbox",
                         "SELECT outbox_group_create('formats', start_at => 'beginning')"});
    // The events of the drain (a 16-character key, about 200 bytes of
    // JSON), every other one with headers carrying a trace context, which
    // the formats copy into fields or attributes of their own.
    ctx.load_events("formats", events,
                    "CASE WHEN i % 2 = 0 THEN jsonb_build_object('tenant', 'acme', 'traceparent', "
                    "'00-' || lpad(to_hex(c * 10000 + i), 32, '0') || '-00f067aa0ba902b7-01') END");
    ctx.psql("formats", {"VACUUM ANALYZE"});
    // Per round: the relay in each format (0-2), the ceiling in each (3-5).
    std::vector<std::vector<double>> rounds;
    for (int r = 1; r <= ctx.rounds; ++r) {
        std::vector<double> line(6);
        for (int f = 0; f < 3; ++f) {
            line[f] = drain_in(ctx, kFormats[f], events);
            ctx.flush_redis();
            ctx.settle("formats");
            line[3 + f] = std::stod(result(ctx.must({ctx.self, "xadd-ceiling", "--pg", ctx.conninfo("formats"),
                                                     "--redis", ctx.redis_address(), "--format", kFormats[f]}),
                                           "events_per_second"));
        }
        rounds.push_back(line);
        std::printf("   round %d: relay default %.0f/s, cloudevents %.0f/s, cloudevents-structured %.0f/s; XADD "
                    "ceiling %.0f, %.0f, %.0f/s\n",
                    r, line[0], line[1], line[2], line[3], line[4], line[5]);
    }
    ctx.flush_redis();
    auto col = [&](int i) {
        std::vector<double> v;
        for (const auto& l : rounds) v.push_back(l[i]);
        return stats(v);
    };
    auto ratio = [&](int a, int b) {
        std::vector<double> v;
        for (const auto& l : rounds) v.push_back(l[a] / l[b]);
        return stats(v);
    };
    for (int f = 0; f < 3; ++f)
        ctx.row("formats: publish " + n + " events, --format " + kFormats[f] + " (events/s) | " + col(f) + " |");
    for (int f = 0; f < 3; ++f)
        ctx.row(std::string("formats: bare pipelined XADD of the ") + kFormats[f] + " entries (events/s) | " +
                col(3 + f) + " |");
    ctx.row("formats: cloudevents / default | " + ratio(1, 0) + " | ≥ 0.9");
    ctx.row("formats: cloudevents-structured / default | " + ratio(2, 0) + " | ≥ 0.9");
    for (int f = 0; f < 3; ++f)
        ctx.row(std::string("formats: relay / ceiling, ") + kFormats[f] + " | " + ratio(f, 3 + f) + " |");
    ctx.drop_database("formats");
}

}  // namespace pg_outbox::bench
