// Unit tests of the metrics text, the health answer and the log lines:
// names from outside cannot forge a series or a log line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>
#include <thread>

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
