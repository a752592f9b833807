// Integration tests of the relay's settings and outputs: a setting that
// cannot work exits 2 at once naming it, and nothing else is held up,
// lost, duplicated or revealed (passwords, forged metrics or log lines).
#include <gtest/gtest.h>

#include <signal.h>

#include <nlohmann/json.hpp>

#include <sstream>
#include <thread>

#include <httplib.h>

#include "fixture.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

class SettingsTest : public RelayTest {
protected:
    // A series of the relay's /metrics ("name{labels}"), -1 when absent.
    static double metric(int port, const std::string& series) {
        httplib::Client client("127.0.0.1", port);
        auto res = client.Get("/metrics");
        if (!res || res->status != 200) return -1;
        const auto at = res->body.find("\n" + series + " ");
        if (at == std::string::npos) return -1;
        return std::stod(res->body.substr(at + series.size() + 2));
    }

    static std::string series(const std::string& name, const std::string& extra = "") {
        return name + "{mode=\"publish\",group=\"g\"" + extra + "}";
    }

    static httplib::Result health(int port) { return httplib::Client("127.0.0.1", port).Get("/health"); }

    // A relay with only the given arguments (no defaults of the fixture).
    Process& start_bare(const std::vector<std::string>& args) {
        std::vector<std::string> all{PG_OUTBOX_RELAY_BINARY};
        all.insert(all.end(), args.begin(), args.end());
        return start_process(all);
    }
};

bool every_line_starts_with_a_timestamp(const std::string& log) {
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);)
        if (line.size() < 4 || line.compare(0, 2, "20") != 0) return false;
    return true;
}

}  // namespace

// An option value libpq refuses only when it connects (an unknown
// service), or one the relay checks first (sslmode), exits 2 at once
// naming --pg; it was retried forever.
TEST_F(SettingsTest, PgSettingRefusedAtConnectExits2) {
    for (const std::string& dsn : std::vector<std::string>{
             "service=pg_outbox_no_such_service host=127.0.0.1 password=Sekr3t-pw",
          "host=127.0.0.1 port=" + std::to_string(pg_->port()) + " dbname=app sslmode=bogus password=Sekr3t-pw",
          "host=127.0.0.1 dbname=app password=Super Sekr3t-pw"}) {
        auto& relay = start_bare({"publish", "--group", "g", "--pg", dsn, "--redis", redis_->address()});
        EXPECT_EQ(relay.wait(10s), 2) << dsn << "\n" << relay.log();
        EXPECT_NE(relay.log().find("--pg"), std::string::npos) << relay.log();
        EXPECT_EQ(relay.log().find("Sekr3t"), std::string::npos) << relay.log();
    }
}

// The connection string in the log has its password masked, URIs too.
TEST_F(SettingsTest, PgPasswordIsNeverLogged) {
    auto pg = connect();
    pg.exec("ALTER ROLE relay_user PASSWORD 'Sekr3t-pw'");
    auto& kv = start_relay({"--pg", pg_->conninfo("app", "relay_user") + " password=Sekr3t-pw"});
    auto& uri = start_relay({"--pg", "postgresql://relay_user:Sekr3t-pw@127.0.0.1:" + std::to_string(pg_->port()) +
                                         "/app"});
    emit(3);
    ASSERT_TRUE(wait_all_published());
    for (auto* relay : {&kv, &uri}) {
        EXPECT_TRUE(eventually([&] { return relay->log().find("password=********") != std::string::npos; }, 5s))
            << relay->log();
        EXPECT_EQ(relay->log().find("Sekr3t"), std::string::npos) << relay->log();
    }
}

// Redis wanting a password, refusing one, or lacking the database: exit
// 2 at the first connection naming the setting, the password never shown
// (they were retried forever).
TEST_F(SettingsTest, RedisAuthAndDatabaseErrorsExit2) {
    RedisServer secured(false, {"--requirepass", "Sekr3t-pw"});
    const auto address = secured.address();
    struct Case {
        std::vector<std::string> args;
        std::string names;
    };
    const std::vector<Case> cases{
        {{"--redis", address}, "--redis-password"},
        {{"--redis", address, "--redis-password", "Wr0ng-guess"}, "--redis-password"},
        {{"--redis", "redis://:Wr0ng-guess@" + address}, "--redis"},
        {{"--redis", address, "--redis-password", "Sekr3t-pw", "--redis-db", "20"}, "--redis-db"},
        {{"--redis", "redis://:Sekr3t-pw@" + address + "/20"}, "SELECT 20"},
    };
    for (const auto& c : cases) {
        auto& relay = start_relay(c.args);
        EXPECT_EQ(relay.wait(10s), 2) << relay.log();
        const auto log = relay.log();
        EXPECT_NE(log.find(c.names), std::string::npos) << log;
        EXPECT_EQ(log.find("Sekr3t"), std::string::npos) << log;
        EXPECT_EQ(log.find("Wr0ng"), std::string::npos) << log;
    }
}

// redis://user:password@host:port/db: AUTH as an ACL user, SELECT db;
// the password is not logged.
TEST_F(SettingsTest, RedisUrlWithAclUserAndDatabase) {
    RedisServer secured(false, {"--requirepass", "Sekr3t-pw"});
    {
        auto admin = secured.connect();
        auto r = admin.command({"ACL", "SETUSER", "alice", "on", ">al1ce-pw", "~*", "&*", "+@all"});
        ASSERT_EQ(r->type, REDIS_REPLY_STATUS) << reply_text(r.get());
    }
    auto& relay = start_relay({"--redis", "redis://alice:al1ce-pw@" + secured.address() + "/2"});
    emit(3);
    auto admin = secured.connect();
    ASSERT_TRUE(eventually(
        [&] {
            admin.command({"SELECT", "2"});
            std::size_t n = 0;
            for (const auto& t : kTopics) n += read_stream(admin, "outbox:" + t).size();
            return n == 3;
        },
        20s))
        << relay.log();
    admin.command({"SELECT", "0"});
    EXPECT_EQ(admin.command({"DBSIZE"})->integer, 0);
    EXPECT_EQ(relay.log().find("al1ce-pw"), std::string::npos) << relay.log();
    EXPECT_TRUE(relay.running());
}

// ":port" listens on every interface, IPv4 and IPv6 (it listened on
// [::1] only); a port in use exits 2 (SO_REUSEPORT let a second relay
// share it).
TEST_F(SettingsTest, MetricsAddressEveryInterfaceAndPortInUse) {
    const int port = free_port();
    auto& first = start_relay({"--metrics-address", ":" + std::to_string(port)});
    // /health answers 503 until the relay is connected: wait for 200 on
    // IPv4, then ask on IPv6 (comparing two answers taken at different
    // moments of the start would race with it).
    ASSERT_TRUE(eventually(
        [&] {
            auto res = health(port);
            return res && res->status == 200;
        },
        30s))
        << first.log();
    auto v6 = httplib::Client("::1", port).Get("/health");
    ASSERT_TRUE(v6) << "not listening on [::1]";
    EXPECT_EQ(v6->status, 200) << v6->body;
    auto& second = start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    EXPECT_EQ(second.wait(10s), 2) << second.log();
    EXPECT_NE(second.log().find("--metrics-address"), std::string::npos) << second.log();
    EXPECT_TRUE(first.running());
    auto& bad = start_relay({"--metrics-address", "127.0.0.1:99999"});
    EXPECT_EQ(bad.wait(10s), 2) << bad.log();
}

// A consumer name with '"}' (a registered one cannot hold control
// characters) and a worker name with newlines forge neither a series in
// /metrics nor a line in the log, text or JSON.
TEST_F(SettingsTest, HostileConsumerNameForgesNoSeriesOrLogLine) {
    const std::string hostile = "evil\"} 1 fake_series{a=\"b\"} 42";
    const std::string worker = "evil\"} 1\nfake_series{a=\"b\"} 42\n2099-01-01T00:00:00 info forged";
    {
        PgConnection db(pg_->conninfo("app"), "tests");
        db.exec("SELECT inbox_consumer_create($1, 'postgres')", {hostile});
    }
    const int port = free_port();
    std::vector<std::string> args{"consume", "--consumer", hostile, "--pg", pg_->conninfo("app"),
                                  "--redis", redis_->address(), "--stream", "outbox:orders", "--worker", worker,
                                  "--handler", "SELECT $1, $2, $3, $4, $5", "--block", "100ms"};
    auto text_args = args;
    text_args.insert(text_args.end(), {"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    auto& text = start_bare(text_args);
    auto json_args = args;
    json_args.insert(json_args.end(), {"--log-format", "json"});
    auto& json = start_bare(json_args);
    std::string body;
    ASSERT_TRUE(eventually(
        [&] {
            auto res = httplib::Client("127.0.0.1", port).Get("/metrics");
            if (!res) return false;
            body = res->body;
            return body.find("pg_outbox_relay_redis_connected{") != std::string::npos &&
                   text.log().find("connected to Redis") != std::string::npos &&
                   json.log().find("connected to Redis") != std::string::npos;
        },
        10s))
        << text.log() << json.log();
    std::istringstream lines(body);
    for (std::string line; std::getline(lines, line);) {
        // The process metrics and build_info carry no name from outside.
        if (line.rfind("process_", 0) == 0 || line.rfind("pg_outbox_relay_build_info{", 0) == 0) continue;
        EXPECT_TRUE(line.empty() || line[0] == '#' || line.rfind("pg_outbox_relay_", 0) == 0) << line;
        if (!line.empty() && line[0] != '#')
            EXPECT_NE(line.find("{mode=\"consume\",consumer=\"evil\\\"} 1 fake_series{a=\\\"b\\\"} 42\","
                                "group=\"evil\\\"} 1 fake_series{a=\\\"b\\\"} 42\""),
                      std::string::npos)
                << line;
    }
    EXPECT_TRUE(every_line_starts_with_a_timestamp(text.log())) << text.log();
    EXPECT_NE(text.log().find("\"evil\"} 1\\nfake_series"), std::string::npos) << text.log();
    std::istringstream json_lines(json.log());
    int parsed = 0;
    for (std::string line; std::getline(json_lines, line); ++parsed) {
        const auto j = nlohmann::json::parse(line, nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << line;
        EXPECT_TRUE(j.contains("msg")) << line;
    }
    EXPECT_GT(parsed, 1);
    EXPECT_NE(json.log().find("evil\\\"} 1\\nfake_series"), std::string::npos) << json.log();
}

// A stream whose name holds a comma is one stream: --stream is repeated
// for several, never split (a comma split it in two).
TEST_F(SettingsTest, ConsumeStreamNameWithComma) {
    {
        auto redis = redis_->connect();
        auto r = redis.command({"XADD", "orders,eu", "*", "event_id", "6a0d9f0e-5b1c-4f7e-9d3a-2f1b8c7d6e5f", "topic",
                                "orders", "payload", "{\"n\": 1}"});
        ASSERT_EQ(r->type, REDIS_REPLY_STRING);
    }
    const int port = free_port();
    {
        PgConnection db(pg_->conninfo("app"), "tests");
        db.exec("SELECT inbox_consumer_create('accounting', 'postgres')");
    }
    auto& consumer = start_bare({"consume", "--consumer", "accounting", "--pg", pg_->conninfo("app"), "--redis",
                                 redis_->address(), "--stream", "orders,eu", "--stream", "outbox:audit",
                                 "--handler", "SELECT $1, $2, $3, $4, $5", "--block", "100ms", "--metrics-address",
                                 "127.0.0.1:" + std::to_string(port)});
    const std::string applied = "pg_outbox_relay_events_applied_total{mode=\"consume\",consumer=\"accounting\","
                                "group=\"accounting\"}";
    EXPECT_TRUE(eventually([&] { return metric(port, applied) == 1; }, 20s)) << consumer.log();
    auto redis = redis_->connect();
    EXPECT_EQ(redis.command({"EXISTS", "orders"})->integer, 0);
    EXPECT_EQ(redis.command({"EXISTS", "eu"})->integer, 0);
    EXPECT_NE(consumer.log().find("holds a comma"), std::string::npos) << consumer.log();
}

// A batch Redis refuses forever (a key of another type under a stream's
// name): /health answers 503 with the reason after --stuck-after (it
// said "200 ok leader"), and 200 again once the batch is published.
TEST_F(SettingsTest, StuckLeaderFailsHealthWithWrongtype) {
    {
        auto redis = redis_->connect();
        redis.command({"SET", "outbox:orders", "not a stream"});
    }
    emit(3);
    const int port = free_port();
    auto& relay = start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port), "--stuck-after", "1s"});
    ASSERT_TRUE(eventually([&] { return metric(port, series("pg_outbox_relay_leader")) == 1; }, 10s)) << relay.log();
    std::string body;
    ASSERT_TRUE(eventually(
        [&] {
            auto res = health(port);
            if (!res) return false;
            body = res->body;
            return res->status == 503;
        },
        10s))
        << body << relay.log();
    EXPECT_EQ(body.rfind("stuck: ", 0), 0u) << body;
    EXPECT_NE(body.find("WRONGTYPE"), std::string::npos) << body;
    EXPECT_GE(metric(port, series("pg_outbox_relay_stalled_seconds")), 1);
    EXPECT_LT(published_count(), 3u);
    {
        auto redis = redis_->connect();
        redis.command({"DEL", "outbox:orders"});
    }
    ASSERT_TRUE(wait_all_published()) << relay.log();
    EXPECT_TRUE(eventually(
        [&] {
            auto res = health(port);
            return res && res->status == 200 && res->body == "ok leader\n";
        },
        10s));
    EXPECT_EQ(metric(port, series("pg_outbox_relay_stalled_seconds")), 0);
}

// Entries found already present count once however often their batch is
// retried (it counted 3 more at each retry).
TEST_F(SettingsTest, AlreadyPublishedCountsEachEntryOnce) {
    auto& first = start_relay();
    emit(3);
    ASSERT_TRUE(wait_all_published());
    first.signal(SIGTERM);
    ASSERT_EQ(first.wait(10s), 0) << first.log();
    {
        auto pg = connect();
        pg.exec("SELECT outbox_rewind('g', 'beginning')");
        auto redis = redis_->connect();
        redis.command({"SET", "outbox:refunds", "not a stream"});
        pg.exec("SELECT outbox_emit('refunds', 'r1', '{\"n\": 99}')");
    }
    const int port = free_port();
    auto& relay = start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    ASSERT_TRUE(eventually(
        [&] { return metric(port, series("pg_outbox_relay_errors_total", ",kind=\"redis_WRONGTYPE\"")) >= 4; },
        20s))
        << relay.log();
    EXPECT_EQ(metric(port, series("pg_outbox_relay_events_already_published_total")), 3);
    {
        auto redis = redis_->connect();
        redis.command({"DEL", "outbox:refunds"});
    }
    ASSERT_TRUE(eventually([&] { return metric(port, series("pg_outbox_relay_events_published_total")) == 1; }, 20s))
        << relay.log();
    EXPECT_EQ(metric(port, series("pg_outbox_relay_events_already_published_total")), 3);
    auto redis = redis_->connect();
    EXPECT_EQ(read_stream(redis, "outbox:refunds").size(), 1u);
    EXPECT_EQ(published_count(), 3u);
}

// A relay pointed at a hot standby publishes nothing and says why, until
// the standby is promoted; then it publishes (with --no-listen it used to
// publish a batch from the standby, then fail on outbox_advance).
TEST_F(SettingsTest, HotStandbyPublishesNothingUntilPromoted) {
    auto standby = PgServer::standby_of(*pg_);
    const int port = free_port();
    auto& relay = start_relay({"--pg", standby->conninfo("app", "relay_user"), "--no-listen", "--metrics-address",
                               "127.0.0.1:" + std::to_string(port)});
    emit(5);
    PgConnection replica(standby->conninfo("app"), "tests");
    ASSERT_TRUE(eventually([&] { return query_column(replica, "SELECT count(*) FROM outbox.event")[0] == "5"; }, 20s));
    ASSERT_TRUE(eventually([&] { return relay.log().find("PostgreSQL is a standby") != std::string::npos; }, 10s))
        << relay.log();
    std::this_thread::sleep_for(2s);
    EXPECT_EQ(published_count(), 0u) << relay.log();
    EXPECT_TRUE(relay.running());
    auto res = health(port);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 503);
    EXPECT_NE(res->body.find("standby"), std::string::npos) << res->body;
    EXPECT_EQ(metric(port, series("pg_outbox_relay_pg_in_recovery")), 1);
    const auto log = relay.log();
    std::size_t said = 0;
    for (auto at = log.find("PostgreSQL is a standby"); at != std::string::npos;
         at = log.find("PostgreSQL is a standby", at + 1))
        ++said;
    EXPECT_EQ(said, 1u) << "said once, not at every check";
    standby->promote();
    ASSERT_TRUE(wait_all_published()) << relay.log();
    EXPECT_EQ(published_count(), 5u);
    EXPECT_NE(relay.log().find("PostgreSQL is a primary now"), std::string::npos) << relay.log();
    EXPECT_EQ(metric(port, series("pg_outbox_relay_pg_in_recovery")), 0);
}
