// Integration tests of a group in operation: one stream template per
// group (a relay with another one exits 2, naming both, in a relay of one
// group and in one of several), the bounded record of the streams a group
// wrote and the relay's bounded checks of them, and the events an open
// transaction holds back, in the relay's metrics.
#include <gtest/gtest.h>

#include <signal.h>

#include <httplib.h>

#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

class GroupOpsTest : public RelayTest {
protected:
    // A series of the relay's /metrics ("name{labels}"), -1 when absent.
    static double metric(httplib::Client& client, const std::string& series) {
        auto res = client.Get("/metrics");
        if (!res || res->status != 200) return -1;
        const auto at = res->body.find("\n" + series + " ");
        if (at == std::string::npos) return -1;
        return std::stod(res->body.substr(at + series.size() + 2));
    }

    static std::string series(const std::string& name) { return name + "{mode=\"publish\",group=\"g\"}"; }

    // Entries in the streams of every topic under a prefix ("outbox:").
    std::size_t entries(const std::string& prefix) {
        auto redis = redis_->connect();
        std::size_t n = 0;
        for (const auto& t : kTopics) n += read_stream(redis, prefix + t).size();
        return n;
    }
};

}  // namespace

// Two relays of one group with two templates used to split the group
// between two sets of streams, silently. The group records the first
// leader's template: a relay with another one exits 2 naming both, as a
// standby at once, and as a new leader before it publishes anything.
// Changing the template is an admin's step with the relays stopped.
TEST_F(GroupOpsTest, ASecondStreamTemplateExits2NamingBoth) {
    auto& first = start_relay();
    emit(20);
    ASSERT_TRUE(wait_all_published()) << first.log();
    auto pg = connect();
    EXPECT_EQ(query_column(pg, "SELECT stream_template FROM outbox_groups('g')")[0], "outbox:{topic}");

    // A standby with another template: refused when it connects.
    auto& other = start_relay({"--stream", "other:{topic}"});
    EXPECT_EQ(other.wait(20s), 2) << other.log();
    EXPECT_NE(other.log().find("--stream \"other:{topic}\": group \"g\" publishes with the stream template "
                               "\"outbox:{topic}\""),
              std::string::npos)
        << other.log();
    EXPECT_TRUE(first.running());

    // A relay that connected before the group recorded a template (here a
    // session of the test leads the group and records it): refused when
    // it takes the lead, before its first batch.
    first.signal(SIGTERM);
    ASSERT_EQ(first.wait(), 0) << first.log();
    pg.exec("SELECT outbox_group_set_stream_template('g', NULL)");
    ASSERT_EQ(query_column(pg, "SELECT outbox_lead('g')")[0], "t");
    auto& late = start_relay({"--stream", "other:{topic}"});
    ASSERT_TRUE(eventually([&] { return late.log().find("standing by") != std::string::npos; }, 10s)) << late.log();
    emit(10, 20);
    EXPECT_EQ(query_column(pg, "SELECT outbox_stream_template('g', 'outbox:{topic}')")[0], "outbox:{topic}");
    pg.exec("SELECT outbox_resign('g')");
    EXPECT_EQ(late.wait(20s), 2) << late.log();
    EXPECT_NE(late.log().find("group \"g\" publishes with the stream template \"outbox:{topic}\""),
              std::string::npos)
        << late.log();
    EXPECT_EQ(entries("other:"), 0u) << "nothing was published to the other template's streams";

    // The documented change: relays stopped, the admin sets the new
    // template, the relays start with it and go on from the cursor.
    EXPECT_EQ(query_column(pg, "SELECT outbox_group_set_stream_template('g', 'other:{topic}')")[0], "outbox:{topic}");
    auto& moved = start_relay({"--stream", "other:{topic}"});
    ASSERT_TRUE(eventually([&] { return entries("other:") == 10; }, 30s)) << moved.log();
    EXPECT_EQ(entries("outbox:"), 20u);
    EXPECT_TRUE(moved.running()) << moved.log();
}

// The same in a relay of several groups and shards: each thread checks its
// group's template, and one that cannot work stops every group (exit 2).
TEST_F(GroupOpsTest, ASecondStreamTemplateStopsAMultiGroupRelay) {
    auto pg = connect();
    pg.exec("SELECT outbox_group_create('orders', start_at => 'beginning', shards => 2)");
    auto publish = [&](const std::string& tmpl) -> Process& {
        return start_process({PG_OUTBOX_RELAY_BINARY, "publish", "--group", "orders/*", "--group", "g", "--pg",
                              pg_->conninfo("app", "relay_user"), "--redis", redis_->address(), "--stream", tmpl,
                              "--poll-interval", "50ms", "--retry-min", "20ms", "--retry-max", "300ms",
                              "--log-level", "debug"});
    };
    auto& first = publish("outbox:{group}:{topic}:{shard}");
    emit(12);
    ASSERT_TRUE(eventually(
        [&] {
            return query_column(pg, "SELECT count(*) FROM outbox_groups() "
                                    "WHERE stream_template = 'outbox:{group}:{topic}:{shard}'")[0] == "3";
        },
        30s))
        << first.log();
    auto& second = publish("x:{group}:{topic}:{shard}");
    EXPECT_EQ(second.wait(30s), 2) << second.log();
    // The first thread to find it stops the others, perhaps before they
    // connect: any group may be the one named.
    const auto log = second.log();
    EXPECT_TRUE(std::regex_search(log, std::regex("--stream \"x:\\{group\\}:\\{topic\\}:\\{shard\\}\": group "
                                                  "\"(g|orders)\" publishes with the stream template "
                                                  "\"outbox:\\{group\\}:\\{topic\\}:\\{shard\\}\"")))
        << log;
    EXPECT_NE(log.find("a setting cannot work: stopping every group"), std::string::npos) << log;
    EXPECT_TRUE(first.running()) << first.log();
}

// A group writing to ever new streams keeps a bounded record of them (the
// most recently written, pg_outbox.max_group_streams), and its relay checks
// every recorded stream when it starts leading but only a share of them
// (100) at each --stats-interval after that.
TEST_F(GroupOpsTest, TheRecordOfStreamsAndItsChecksAreBounded) {
    auto pg = connect();
    // Loads pg_outbox in this session, which defines the setting (on the C
    // engine).
    EXPECT_EQ(query_column(pg, "SELECT outbox.max_group_streams()")[0], "1000");
    // PostgreSQL 15 takes no ALTER SYSTEM for a setting that no library
    // defines: on the SQL engine, the database's setting, as on a managed
    // service.
    const auto set_streams = [&](const std::string& value) {
        if (engine() == "sql")
            pg.exec("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I " + value + "', current_database()); END $$");
        else
            pg.exec("ALTER SYSTEM " + value);
        pg.exec("SELECT pg_reload_conf()");
    };
    set_streams("SET pg_outbox.max_group_streams = 120");
    constexpr int kStreams = 150;
    for (int i = 0; i < kStreams; ++i)
        pg.exec("SELECT outbox_emit($1, NULL, '{}')", {"t" + std::to_string(1000 + i)});
    auto& relay = start_relay({"--stats-interval", "100ms"});
    auto redis = redis_->connect();
    const std::string last_stream = "outbox:t" + std::to_string(1000 + kStreams - 1);
    ASSERT_TRUE(eventually([&] { return read_stream(redis, last_stream).size() == 1; }, 30s)) << relay.log();
    ASSERT_TRUE(eventually(
        [&] {
            return query_column(pg, "SELECT cursor_position = (SELECT txid || '-' || seq FROM outbox.event "
                                    "ORDER BY txid DESC, seq DESC LIMIT 1) FROM outbox_groups('g')")[0] == "t";
        },
        30s));
    // The 120 streams written last are recorded.
    EXPECT_EQ(query_column(pg, "SELECT count(*) FROM outbox_groups('g'), jsonb_object_keys(streams)")[0], "120");
    EXPECT_EQ(query_column(pg, "SELECT min(k) FROM outbox_groups('g'), jsonb_object_keys(streams) k")[0],
              "outbox:t1030");
    relay.signal(SIGTERM);
    ASSERT_EQ(relay.wait(), 0) << relay.log();

    auto& again = start_relay({"--stats-interval", "100ms"});
    const std::regex share("checked 100 of the 120 streams group \"g\" recorded");
    ASSERT_TRUE(eventually(
        [&] {
            const auto log = again.log();
            return std::distance(std::sregex_iterator(log.begin(), log.end(), share), std::sregex_iterator()) >= 3;
        },
        30s))
        << again.log();
    const auto log = again.log();
    EXPECT_NE(log.find("checked 120 of the 120 streams group \"g\" recorded"), std::string::npos) << log;
    EXPECT_EQ(log.find("checked 120 of the 120", log.find("checked 100 of the 120")), std::string::npos)
        << "only the first check looks at every stream\n"
        << log;
    set_streams("RESET pg_outbox.max_group_streams");
}

// A write transaction held open holds the horizon back: the events
// committed after it wait above it, nothing is published, and waiting,
// lag_events, lag_seconds and stalled_seconds are all 0. The relay's
// held-back metrics show it, and go back to 0 when it ends.
TEST_F(GroupOpsTest, AnOpenTransactionShowsInTheHeldBackMetrics) {
    const int port = free_port();
    start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port), "--stats-interval", "100ms"});
    httplib::Client client("127.0.0.1", port);
    emit(3);
    ASSERT_TRUE(wait_all_published());
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_held_back_events")) == 0; }, 10s));
    EXPECT_EQ(metric(client, series("pg_outbox_relay_held_back_seconds")), 0);

    auto holder = connect();
    holder.exec("BEGIN");
    holder.exec("SELECT pg_catalog.pg_current_xact_id()");
    emit(7, 3);
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_held_back_events")) == 7; }, 10s))
        << metric(client, series("pg_outbox_relay_held_back_events"));
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_held_back_seconds")) >= 1; }, 10s));
    EXPECT_EQ(metric(client, series("pg_outbox_relay_lag_events")), 0);
    EXPECT_EQ(metric(client, series("pg_outbox_relay_lag_seconds")), 0);
    EXPECT_EQ(metric(client, series("pg_outbox_relay_stalled_seconds")), 0);
    EXPECT_EQ(published_count(), 3u);
    auto pg = connect();
    EXPECT_EQ(query_column(pg, "SELECT waiting || ' ' || held_back || ' ' || (held_by_pid IS NOT NULL) "
                               "FROM outbox_group_stats('g')")[0],
              "0 7 true");

    holder.exec("COMMIT");
    ASSERT_TRUE(wait_all_published());
    EXPECT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_held_back_events")) == 0; }, 10s));
    EXPECT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_held_back_seconds")) == 0; }, 10s));
}
