// Unit tests of the metrics text, the health answer and the log lines:
// names from outside cannot forge a series or a log line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "pg_outbox/log.hpp"
#include "pg_outbox/metrics.hpp"

using namespace pg_outbox;
using namespace std::chrono_literals;

namespace {

const std::string kHostile = "evil\"} 1\nfake_series{a=\"b\"} 42\n\\";

}  // namespace

TEST(Metrics, LabelValuesAreEscaped) {
    EXPECT_EQ(prometheus_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    for (const char* mode : {"publish", "consume"}) {
        Metrics m(mode, kHostile);
        m.count_error("redis_\"x\n");
        const auto text = m.render();
        std::istringstream lines(text);
        for (std::string line; std::getline(lines, line);) {
            EXPECT_EQ(line.rfind("fake_series", 0), std::string::npos) << line;
            if (line.empty() || line[0] == '#') continue;
            if (line.rfind("process_", 0) == 0 || line.rfind("pg_outbox_relay_build_info{", 0) == 0) continue;
            EXPECT_EQ(line.rfind("pg_outbox_relay_", 0), 0u) << line;
            EXPECT_NE(line.find("group=\"evil\\\"} 1\\nfake_series{a=\\\"b\\\"} 42\\n\\\\\""), std::string::npos)
                << line;
        }
    }
}

TEST(Metrics, HealthReportsWhy) {
    Metrics m("publish", "g", 50ms);
    EXPECT_FALSE(m.health(60s).ok);
    m.heartbeat();
    EXPECT_FALSE(m.health(60s).ok);
    EXPECT_NE(m.health(60s).text.find("PostgreSQL"), std::string::npos);
    m.pg_connected = true;
    m.redis_connected = true;
    EXPECT_EQ(m.health(60s).text, "ok standby\n");
    m.pg_in_recovery = true;
    EXPECT_FALSE(m.health(60s).ok);
    EXPECT_NE(m.health(60s).text.find("standby"), std::string::npos);
    m.pg_in_recovery = false;
    m.leader = true;
    EXPECT_EQ(m.health(60s).text, "ok leader\n");
}

// A leader held at an event too large to publish fails health at once,
// saying which event and how to pass it; the gauge follows; a standby
// answers as a standby.
TEST(Metrics, EventTooLargeFailsHealth) {
    Metrics m("publish", "g");
    m.heartbeat();
    m.pg_connected = true;
    m.redis_connected = true;
    m.leader = true;
    EXPECT_NE(m.render().find("pg_outbox_relay_event_too_large{mode=\"publish\",group=\"g\"} 0"), std::string::npos);
    m.set_event_too_large("the event at position 12-3 of group \"g\" is too large to publish; pass it with "
                          "SELECT outbox_skip('g', '12-3', '<reason>')\nsecond line");
    const auto h = m.health(60s);
    EXPECT_FALSE(h.ok);
    EXPECT_EQ(h.text, "unhealthy: the event at position 12-3 of group \"g\" is too large to publish; pass it with "
                      "SELECT outbox_skip('g', '12-3', '<reason>')\\nsecond line\n");
    EXPECT_NE(m.render().find("pg_outbox_relay_event_too_large{mode=\"publish\",group=\"g\"} 1"), std::string::npos);
    m.leader = false;
    EXPECT_EQ(m.health(60s).text, "ok standby\n");
    m.leader = true;
    m.clear_event_too_large();
    EXPECT_EQ(m.health(60s).text, "ok leader\n");
    EXPECT_FALSE(m.event_too_large());
}

// Consume mode's park series exist from the start, at 0, the park_limit
// error kind among them; a worker held at its park_limit (OB005) fails
// health saying why until it is cleared; publish mode has none of them.
TEST(Metrics, ParkSeriesAndParkLimit) {
    Metrics m("consume", "g", 0ms, "c");
    m.heartbeat();
    m.pg_connected = true;
    m.redis_connected = true;
    const std::string labels = "{mode=\"consume\",consumer=\"c\",group=\"g\"}";
    auto text = m.render();
    for (const char* name : {"pg_outbox_relay_keys_parked", "pg_outbox_relay_entries_parked_total",
                             "pg_outbox_relay_entries_redriven_total", "pg_outbox_relay_park_limit_reached"})
        EXPECT_NE(text.find(std::string(name) + labels + " 0\n"), std::string::npos) << name << '\n' << text;
    EXPECT_NE(text.find("# TYPE pg_outbox_relay_keys_parked gauge"), std::string::npos);
    EXPECT_NE(text.find("# TYPE pg_outbox_relay_entries_parked_total counter"), std::string::npos);
    EXPECT_NE(text.find("# TYPE pg_outbox_relay_entries_redriven_total counter"), std::string::npos);
    EXPECT_NE(text.find("# TYPE pg_outbox_relay_park_limit_reached gauge"), std::string::npos);
    EXPECT_NE(text.find("pg_outbox_relay_errors_total{mode=\"consume\",consumer=\"c\",group=\"g\",kind=\"park_limit\"} 0"),
              std::string::npos);
    m.keys_parked = 3;
    m.entries_parked += 7;
    m.entries_redriven += 5;
    text = m.render();
    EXPECT_NE(text.find("pg_outbox_relay_keys_parked" + labels + " 3\n"), std::string::npos) << text;
    EXPECT_NE(text.find("pg_outbox_relay_entries_parked_total" + labels + " 7\n"), std::string::npos);
    EXPECT_NE(text.find("pg_outbox_relay_entries_redriven_total" + labels + " 5\n"), std::string::npos);
    EXPECT_EQ(m.health(60s).text, "ok\n");
    m.set_park_limit("consumer \"c\" has 1000000 parked entries, its park_limit\nsecond line");
    EXPECT_TRUE(m.park_limit_reached());
    const auto h = m.health(60s);
    EXPECT_FALSE(h.ok);
    EXPECT_EQ(h.text, "unhealthy: consumer \"c\" has 1000000 parked entries, its park_limit\\nsecond line\n");
    m.pg_connected = false;  // the held batch is retried on a new session
    EXPECT_EQ(m.health(60s).text, h.text);
    m.pg_connected = true;
    EXPECT_NE(m.render().find("pg_outbox_relay_park_limit_reached" + labels + " 1\n"), std::string::npos);
    m.clear_park_limit();
    EXPECT_FALSE(m.park_limit_reached());
    EXPECT_EQ(m.health(60s).text, "ok\n");
    EXPECT_NE(m.render().find("pg_outbox_relay_park_limit_reached" + labels + " 0\n"), std::string::npos);
    const auto publish = Metrics("publish", "g").render();
    EXPECT_EQ(publish.find("parked"), std::string::npos);
    EXPECT_EQ(publish.find("park_limit"), std::string::npos);
}

// A leader with events waiting that publishes nothing (a batch Redis keeps
// refusing) is stuck after --stuck-after; one published batch or a feed
// run dry clears it; a standby and a leader that keeps up never are.
TEST(Metrics, StuckLeaderFailsHealth) {
    Metrics m("publish", "g", 100ms);
    m.heartbeat();
    m.pg_connected = true;
    m.redis_connected = true;
    m.leader = true;
    m.caught_up();
    std::this_thread::sleep_for(150ms);
    EXPECT_TRUE(m.health(60s).ok) << "nothing waits";
    m.batch_waiting();
    m.count_error("redis_WRONGTYPE");
    std::this_thread::sleep_for(80ms);
    m.batch_waiting();  // the retry fetches the same batch again
    EXPECT_TRUE(m.health(60s).ok);
    std::this_thread::sleep_for(80ms);
    const auto h = m.health(60s);
    EXPECT_FALSE(h.ok);
    EXPECT_EQ(h.text.rfind("stuck: ", 0), 0u) << h.text;
    EXPECT_NE(h.text.find("redis_WRONGTYPE"), std::string::npos) << h.text;
    EXPECT_GE(m.stalled(), 150ms);
    EXPECT_NE(m.render().find("pg_outbox_relay_stalled_seconds{mode=\"publish\",group=\"g\"} 0.1"), std::string::npos);
    m.batch_published();
    EXPECT_TRUE(m.health(60s).ok);
    m.caught_up();
    EXPECT_EQ(m.stalled(), 0ms);
    m.batch_waiting();
    std::this_thread::sleep_for(150ms);
    m.leader = false;
    EXPECT_TRUE(m.health(60s).ok) << "a standby is never stuck";
    Metrics never("publish", "g", 0ms);
    never.heartbeat();
    never.pg_connected = true;
    never.redis_connected = true;
    never.leader = true;
    never.batch_waiting();
    std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(never.health(60s).ok) << "--stuck-after 0";
}

TEST(Log, ControlCharactersAreEscaped) {
    EXPECT_EQ(escape_control("a\nb\rc\td\x1b[31m\x7f"), "a\\nb\\rc\\td\\x1b[31m\\x7f");
    EXPECT_EQ(escape_control("next\xc2\x85line"), "next\\u0085line");
    EXPECT_EQ(escape_control("caf\xc3\xa9 \\n"), "caf\xc3\xa9 \\n");
    EXPECT_EQ(escape_control(std::string("nul\0x", 5)), "nul\\x00x");
}

// A text log line stays one line whatever the message holds.
TEST(Log, TextLinesCannotBeForged) {
    std::ostringstream out;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
    spdlog::logger logger("test", sink);
    logger.set_formatter(make_text_formatter());
    logger.info("consumer \"{}\" starts", kHostile);
    logger.flush();
    const auto text = out.str();
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.find('\n'), text.size() - 1) << text;
    EXPECT_NE(text.find("info consumer \"evil\"} 1\\nfake_series"), std::string::npos) << text;
}

namespace {

// The value of a series in a rendered text, or nullopt when it is absent.
std::optional<std::string> sample(const std::string& text, const std::string& series) {
    const auto at = text.find("\n" + series + " ");
    if (at == std::string::npos) return std::nullopt;
    const auto from = at + series.size() + 2;
    return text.substr(from, text.find('\n', from) - from);
}

}  // namespace

// Every error kind a mode counts is a series from the start, at 0: an
// alert on rate() sees the first error.
TEST(Metrics, EveryErrorKindIsExposedFromTheStart) {
    for (const char* mode : {"publish", "consume"}) {
        Metrics m(mode, "g", 0ms, "c");
        const auto text = m.render();
        const auto& kinds = error_kinds(mode);
        const std::string labels = std::string("{mode=\"") + mode + "\"" +
                                   (std::string(mode) == "consume" ? ",consumer=\"c\"" : "") + ",group=\"g\"";
        EXPECT_GE(kinds.size(), 4u);
        for (const auto& kind : kinds)
            EXPECT_EQ(sample(text, "pg_outbox_relay_errors_total" + labels + ",kind=\"" + kind + "\"}"), "0")
                << mode << ' ' << kind;
        EXPECT_NE(std::find(kinds.begin(), kinds.end(), "pg"), kinds.end());
        EXPECT_NE(std::find(kinds.begin(), kinds.end(), "redis_io"), kinds.end());
        EXPECT_NE(std::find(kinds.begin(), kinds.end(), "redis_other"), kinds.end());
    }
    const auto& publish = error_kinds("publish");
    EXPECT_NE(std::find(publish.begin(), publish.end(), "maintenance"), publish.end());
    const auto& consume = error_kinds("consume");
    EXPECT_NE(std::find(consume.begin(), consume.end(), "pg_configuration"), consume.end());
    EXPECT_NE(std::find(consume.begin(), consume.end(), "pg_transient"), consume.end());
    EXPECT_NE(std::find(consume.begin(), consume.end(), "park_limit"), consume.end());
}

// Redis error codes map onto a fixed set of kinds.
TEST(Metrics, RedisErrorKindsAreAFixedSet) {
    EXPECT_EQ(redis_error_kind("io"), "redis_io");
    EXPECT_EQ(redis_error_kind("OOM"), "redis_OOM");
    EXPECT_EQ(redis_error_kind("WRONGTYPE"), "redis_WRONGTYPE");
    EXPECT_EQ(redis_error_kind("READONLY"), "redis_READONLY");
    EXPECT_EQ(redis_error_kind("XINFO"), "redis_other");
    EXPECT_EQ(redis_error_kind("other"), "redis_other");
    for (const char* mode : {"publish", "consume"}) {
        const auto& kinds = error_kinds(mode);
        for (const char* code : {"io", "OOM", "BUSY", "NOSCRIPT", "WRONGTYPE", "ANYTHING"})
            EXPECT_NE(std::find(kinds.begin(), kinds.end(), redis_error_kind(code)), kinds.end()) << code;
    }
    Metrics m("publish", "g");
    m.count_error(redis_error_kind("OOM"));
    m.count_error(redis_error_kind("OOM"));
    EXPECT_EQ(sample(m.render(), "pg_outbox_relay_errors_total{mode=\"publish\",group=\"g\",kind=\"redis_OOM\"}"), "2");
}

// An empty feed has no lag: lag_seconds goes to 0 when a fetch returns
// nothing, instead of keeping the last batch's age.
TEST(Metrics, LagSecondsIsZeroWhenTheFeedIsEmpty) {
    Metrics m("publish", "g");
    m.leader = true;
    m.lag_seconds = 1.54;
    m.batch_waiting();
    EXPECT_EQ(sample(m.render(), "pg_outbox_relay_lag_seconds{mode=\"publish\",group=\"g\"}"), "1.54");
    m.caught_up();
    EXPECT_EQ(sample(m.render(), "pg_outbox_relay_lag_seconds{mode=\"publish\",group=\"g\"}"), "0");
}

// lag_events comes from the leader only: a standby, or a leader before
// its first count, leaves the series out (a sum over relays is the
// backlog); the leader gauge is always there to select on.
TEST(Metrics, LagEventsOnlyFromTheLeader) {
    Metrics m("publish", "g");
    const std::string lag = "pg_outbox_relay_lag_events{mode=\"publish\",group=\"g\"}";
    const std::string leader = "pg_outbox_relay_leader{mode=\"publish\",group=\"g\"}";
    EXPECT_EQ(sample(m.render(), lag), std::nullopt);
    EXPECT_EQ(sample(m.render(), leader), "0");
    m.lag_events = 12;
    EXPECT_EQ(sample(m.render(), lag), std::nullopt) << "a standby";
    m.leader = true;
    EXPECT_EQ(sample(m.render(), lag), "12");
    EXPECT_EQ(sample(m.render(), leader), "1");
    m.lag_events = -1;
    EXPECT_EQ(sample(m.render(), lag), std::nullopt) << "not counted yet";
    EXPECT_EQ(m.render().find("} -1\n"), std::string::npos);
}

// What an open transaction holds back comes, like lag_events, from the
// leader once counted: the leader's series, both of them, or none.
TEST(Metrics, HeldBackOnlyFromTheLeader) {
    Metrics m("publish", "g");
    const std::string events = "pg_outbox_relay_held_back_events{mode=\"publish\",group=\"g\"}";
    const std::string seconds = "pg_outbox_relay_held_back_seconds{mode=\"publish\",group=\"g\"}";
    m.leader = true;
    EXPECT_EQ(sample(m.render(), events), std::nullopt) << "not counted yet";
    EXPECT_EQ(sample(m.render(), seconds), std::nullopt) << "not counted yet";
    m.held_back_events = 7;
    m.held_back_seconds = 12.5;
    EXPECT_EQ(sample(m.render(), events), "7");
    EXPECT_EQ(sample(m.render(), seconds), "12.5");
    EXPECT_NE(m.render().find("# TYPE pg_outbox_relay_held_back_seconds gauge\n"), std::string::npos);
    m.leader = false;
    EXPECT_EQ(sample(m.render(), events), std::nullopt) << "a standby";
    EXPECT_EQ(sample(m.render(), seconds), std::nullopt) << "a standby";
}

// Consume mode labels the inbox identity (consumer) and the Redis
// consumer group (group) apart; publish mode has no consumer label.
TEST(Metrics, ConsumeLabelsConsumerAndGroup) {
    Metrics consume("consume", "ledger-workers", 0ms, "accounting");
    const auto text = consume.render();
    EXPECT_EQ(sample(text, "pg_outbox_relay_events_applied_total{mode=\"consume\",consumer=\"accounting\","
                           "group=\"ledger-workers\"}"),
              "0")
        << text;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
        if (!line.empty() && line[0] != '#' && line.rfind("pg_outbox_relay_", 0) == 0 &&
            line.rfind("pg_outbox_relay_build_info{", 0) != 0)
            EXPECT_NE(line.find("{mode=\"consume\",consumer=\"accounting\",group=\"ledger-workers\""),
                      std::string::npos)
                << line;
    Metrics hostile("consume", "g", 0ms, kHostile);
    EXPECT_NE(hostile.render().find("consumer=\"evil\\\"} 1\\nfake_series{a=\\\"b\\\"} 42\\n\\\\\",group=\"g\""),
              std::string::npos);
    EXPECT_EQ(Metrics("publish", "g").render().find("consumer="), std::string::npos);
}

// build_info names the relay's version and, once connected, the
// extension's version and engine; both modes expose it.
TEST(Metrics, BuildInfo) {
    for (const char* mode : {"publish", "consume"}) {
        Metrics m(mode, "g");
        EXPECT_EQ(sample(m.render(), "pg_outbox_relay_build_info{version=\"" PG_OUTBOX_VERSION
                                     "\",extension_version=\"\",engine=\"\"}"),
                  "1");
        m.set_extension("9.9\"x", "sql\n");
        EXPECT_EQ(sample(m.render(), "pg_outbox_relay_build_info{version=\"" PG_OUTBOX_VERSION
                                     "\",extension_version=\"9.9\\\"x\",engine=\"sql\\n\"}"),
                  "1");
        m.set_extension("0.2.0", "c");
        EXPECT_EQ(sample(m.render(), "pg_outbox_relay_build_info{version=\"" PG_OUTBOX_VERSION
                                     "\",extension_version=\"0.2.0\",engine=\"c\"}"),
                  "1");
    }
}

// The process metrics of Prometheus client libraries, from /proc/self.
TEST(Metrics, ProcessMetrics) {
    const auto value = [](const std::string& text, const std::string& name) {
        const auto v = sample(text, name);
        EXPECT_TRUE(v) << name << " in\n" << text;
        return v ? std::stod(*v) : -1.0;
    };
    const auto text = Metrics("publish", "g").render();
    for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                             "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                             "process_start_time_seconds"})
        EXPECT_NE(text.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
    EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter\n"), std::string::npos);
    // Burn some CPU time so that it shows.
    volatile double x = 0;
    for (int i = 0; i < 20000000; ++i) x = x + i * 0.5;
    const auto after = process_metrics();
    EXPECT_GT(value(after, "process_cpu_seconds_total"), 0);
    const auto rss = value(after, "process_resident_memory_bytes");
    EXPECT_GT(rss, 1 << 20);
    EXPECT_GE(value(after, "process_virtual_memory_bytes"), rss);
    struct rlimit limit {};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
    EXPECT_EQ(value(after, "process_max_fds"), static_cast<double>(limit.rlim_cur));
    const auto fds = value(after, "process_open_fds");
    EXPECT_GE(fds, 3);
    const int fd = ::open("/dev/null", O_RDONLY);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(value(process_metrics(), "process_open_fds"), fds + 1);
    ::close(fd);
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const auto start = value(after, "process_start_time_seconds");
    EXPECT_LE(start, now + 1);
    EXPECT_GT(start, now - 600) << "this test process started minutes ago at most";
}

TEST(Metrics, GapsPerStreamFromZero) {
    Metrics m("consume", "g", 0ms, "c");
    m.add_gap_stream("outbox:orders");
    m.add_gap_stream("odd\"stream\n");
    m.count_gap("outbox:orders");
    m.count_gap("outbox:orders");
    const auto text = m.render();
    const std::string labels = "mode=\"consume\",consumer=\"c\",group=\"g\"";
    EXPECT_NE(text.find("# TYPE pg_outbox_relay_gaps_total counter\n"), std::string::npos);
    EXPECT_NE(text.find("\npg_outbox_relay_gaps_total{" + labels + ",stream=\"outbox:orders\"} 2\n"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("\npg_outbox_relay_gaps_total{" + labels + ",stream=\"odd\\\"stream\\n\"} 0\n"),
              std::string::npos)
        << text;
    Metrics publish("publish", "g");
    EXPECT_EQ(publish.render().find("pg_outbox_relay_gaps_total"), std::string::npos);
}

namespace {

std::size_t count_of(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

}  // namespace

// Several groups of one process in one text: each family once, its
// samples together, a series per group; build_info and the process
// metrics once. One group renders as it always did.
TEST(Metrics, SeveralGroupsInOneText) {
    MetricsSet set;
    EXPECT_EQ(set.render().find("pg_outbox_relay_leader"), std::string::npos) << "no group yet";
    auto& a = set.add("orders/0", std::chrono::milliseconds(0));
    EXPECT_EQ(set.render().substr(0, set.render().find("process_")),
              a.render().substr(0, a.render().find("process_")));
    auto& b = set.add("orders/1", std::chrono::milliseconds(0));
    a.leader = true;
    a.lag_events = 5;
    b.events_published = 7;
    b.count_error("redis_WRONGTYPE");
    b.set_extension("0.2.0", "sql");
    const auto text = set.render();
    EXPECT_EQ(sample(text, "pg_outbox_relay_leader{mode=\"publish\",group=\"orders/0\"}"), "1");
    EXPECT_EQ(sample(text, "pg_outbox_relay_leader{mode=\"publish\",group=\"orders/1\"}"), "0");
    EXPECT_EQ(sample(text, "pg_outbox_relay_lag_events{mode=\"publish\",group=\"orders/0\"}"), "5");
    EXPECT_EQ(sample(text, "pg_outbox_relay_lag_events{mode=\"publish\",group=\"orders/1\"}"), std::nullopt);
    EXPECT_EQ(sample(text, "pg_outbox_relay_events_published_total{mode=\"publish\",group=\"orders/1\"}"), "7");
    const std::string errors = "pg_outbox_relay_errors_total{mode=\"publish\",group=";
    EXPECT_EQ(sample(text, errors + "\"orders/1\",kind=\"redis_WRONGTYPE\"}"), "1");
    EXPECT_EQ(sample(text, errors + "\"orders/0\",kind=\"redis_WRONGTYPE\"}"), "0");
    EXPECT_EQ(sample(text, "pg_outbox_relay_build_info{version=\"" PG_OUTBOX_VERSION
                           "\",extension_version=\"0.2.0\",engine=\"sql\"}"),
              "1");
    EXPECT_EQ(count_of(text, "pg_outbox_relay_build_info{"), 1u);
    EXPECT_EQ(count_of(text, "\nprocess_open_fds "), 1u);
    // Each family's HELP and TYPE once, followed by all its samples.
    std::istringstream lines(text);
    std::string family;
    std::set<std::string> seen;
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("# TYPE ", 0) == 0) {
            family = line.substr(7, line.find(' ', 7) - 7);
            EXPECT_TRUE(seen.insert(family).second) << "twice: " << family;
        } else if (!line.empty() && line[0] != '#') {
            const auto name = line.substr(0, line.find_first_of("{ "));
            EXPECT_EQ(name, family) << line;
        }
    }
    EXPECT_GE(seen.size(), 15u);
    EXPECT_EQ(count_of(text, "\npg_outbox_relay_redis_batches_total{"), 4u);
}

// A leader whose lease was not renewed for --lease no longer says it
// leads, whatever its connection looks like: /health fails saying so, and
// pg_outbox_relay_leader is 0; a renewal makes it a leader again.
TEST(Metrics, LeaderStopsLeadingPastItsLease) {
    Metrics m("publish", "g", 0ms);
    m.heartbeat();
    m.pg_connected = true;
    m.redis_connected = true;
    m.set_lease(200ms);
    m.leader = true;
    EXPECT_FALSE(m.leads()) << "never renewed";
    m.lease_renewed(std::chrono::steady_clock::now());
    EXPECT_TRUE(m.leads());
    EXPECT_EQ(m.health(60s).text, "ok leader\n");
    EXPECT_NE(m.render().find("pg_outbox_relay_leader{mode=\"publish\",group=\"g\"} 1"), std::string::npos)
        << m.render();
    m.lease_renewed(std::chrono::steady_clock::now() - 250ms);
    EXPECT_FALSE(m.leads());
    const auto h = m.health(60s);
    EXPECT_FALSE(h.ok);
    EXPECT_EQ(h.text.find("leader"), std::string::npos) << h.text;
    EXPECT_NE(h.text.find("not leading"), std::string::npos) << h.text;
    EXPECT_NE(m.render().find("pg_outbox_relay_leader{mode=\"publish\",group=\"g\"} 0"), std::string::npos)
        << m.render();
    m.lease_renewed(std::chrono::steady_clock::now());
    EXPECT_EQ(m.health(60s).text, "ok leader\n");
    m.leader = false;
    EXPECT_EQ(m.health(60s).text, "ok standby\n");
}

// /health with several groups: ok only when every group is, a line each.
TEST(Metrics, HealthOfSeveralGroups) {
    MetricsSet set;
    EXPECT_FALSE(set.health(60s).ok);
    EXPECT_EQ(set.health(60s).text, "starting\n");
    auto& a = set.add("a", 0ms);
    for (auto* m : {&a}) {
        m->heartbeat();
        m->pg_connected = true;
        m->redis_connected = true;
        m->leader = true;
    }
    EXPECT_EQ(set.health(60s).text, "ok leader\n") << "one group: its own answer";
    auto& b = set.add("b\n", 0ms);
    EXPECT_FALSE(set.health(60s).ok);
    EXPECT_EQ(set.health(60s).text, "a: ok leader\nb\\n: starting\n");
    b.heartbeat();
    b.pg_connected = true;
    b.redis_connected = true;
    EXPECT_TRUE(set.health(60s).ok);
    EXPECT_EQ(set.health(60s).text, "a: ok leader\nb\\n: ok standby\n");
    a.set_failed("PostgreSQL: group \"a\" does not exist\n(SQLSTATE 42704)");
    EXPECT_FALSE(set.health(60s).ok);
    EXPECT_EQ(set.health(60s).text,
              "a: failed: PostgreSQL: group \"a\" does not exist\\n(SQLSTATE 42704)\nb\\n: ok standby\n");
    a.clear_failed();
    EXPECT_TRUE(set.health(60s).ok);
}

// A thread's log context starts each of its text lines ("[orders/1] ")
// and is the "group" of its JSON lines; other threads' lines have none.
TEST(Log, ContextNamesTheThreadsGroup) {
    std::ostringstream out;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
    spdlog::logger logger("test", sink);
    logger.set_formatter(make_text_formatter());
    std::thread([&] {
        set_log_context("orders/1\n");
        EXPECT_EQ(log_context(), "orders/1\n");
        logger.info("leading");
    }).join();
    logger.info("main");
    logger.flush();
    const auto text = out.str();
    EXPECT_NE(text.find(" info [orders/1\\n] leading\n"), std::string::npos) << text;
    EXPECT_NE(text.find(" info main\n"), std::string::npos) << text;
    EXPECT_EQ(log_context(), "");
}

// The same in JSON: a "group" member on the lines of a thread with a
// context, none on the others'.
TEST(Log, JsonLinesNameTheThreadsGroup) {
    ::testing::internal::CaptureStderr();
    setup_logging("info", LogFormat::json);
    std::thread([] {
        set_log_context("orders/1");
        spdlog::info("leading");
    }).join();
    spdlog::info("main");
    spdlog::default_logger()->flush();
    const auto text = ::testing::internal::GetCapturedStderr();
    std::istringstream lines(text);
    std::vector<nlohmann::json> parsed;
    for (std::string line; std::getline(lines, line);) parsed.push_back(nlohmann::json::parse(line));
    ASSERT_EQ(parsed.size(), 2u) << text;
    EXPECT_EQ(parsed[0]["msg"], "leading");
    EXPECT_EQ(parsed[0]["group"], "orders/1");
    EXPECT_EQ(parsed[1]["msg"], "main");
    EXPECT_FALSE(parsed[1].contains("group"));
}
