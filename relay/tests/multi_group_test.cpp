// Integration tests of one relay process publishing several groups or
// shards: a thread each, with its own connections, leadership, faults and
// metrics; "<group>/*" for every shard of a group.
#include <gtest/gtest.h>

#include <signal.h>

#include <httplib.h>

#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "fixture.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

constexpr int kShards = 4;

class MultiGroupTest : public RelayTest {
protected:
    void SetUp() override {
        RelayTest::SetUp();
        auto pg = connect();
        pg.exec("SELECT outbox_group_create('orders', start_at => 'beginning', shards => " + std::to_string(kShards) +
                ")");
    }

    // A relay publishing these groups; "extra" may override the defaults
    // (a flag given twice takes the last, --group excepted).
    Process& start_groups(const std::vector<std::string>& groups, const std::vector<std::string>& extra = {}) {
        std::vector<std::string> args{PG_OUTBOX_RELAY_BINARY, "publish"};
        for (const auto& g : groups) {
            args.push_back("--group");
            args.push_back(g);
        }
        const std::vector<std::string> defaults{"--pg",
                                                pg_->conninfo("app", "relay_user"),
                                                "--redis",
                                                redis_->address(),
                                                "--stream",
                                                "outbox:{topic}:{shard}",
                                                "--poll-interval",
                                                "50ms",
                                                "--retry-min",
                                                "20ms",
                                                "--retry-max",
                                                "300ms",
                                                "--stats-interval",
                                                "500ms",
                                                "--batch-size",
                                                "50",
                                                "--log-level",
                                                "debug"};
        args.insert(args.end(), defaults.begin(), defaults.end());
        args.insert(args.end(), extra.begin(), extra.end());
        return start_process(args);
    }

    // Emits events in transactions of 1 to 3, from 4 writers at once,
    // with keys spread over the shards (some without a key).
    void emit_concurrently(int transactions_each, unsigned seed) {
        std::vector<std::thread> writers;
        for (unsigned w = 0; w < 4; ++w) {
            writers.emplace_back([&, w] {
                auto pg = connect();
                std::mt19937 rng(seed * 10 + w);
                for (int t = 0; t < transactions_each; ++t) {
                    pg.exec("BEGIN");
                    for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n; ++i) {
                        const auto key = rng() % 5 == 0 ? std::string() : "k" + std::to_string(rng() % 40);
                        pg.exec("SELECT outbox_emit($1, nullif($2, ''), '{}')", {kTopics[rng() % kTopics.size()], key});
                    }
                    pg.exec("COMMIT");
                }
            });
        }
        for (auto& t : writers) t.join();
    }

    // Every entry of every shard's streams, by stream.
    std::map<std::string, std::vector<Entry>> shard_streams() {
        auto redis = redis_->connect();
        std::map<std::string, std::vector<Entry>> out;
        for (int s = 0; s < kShards; ++s)
            for (const auto& t : kTopics) {
                const auto key = "outbox:" + t + ":" + std::to_string(s);
                out[key] = read_stream(redis, key);
            }
        return out;
    }

    std::size_t entries() {
        std::size_t n = 0;
        for (const auto& [key, list] : shard_streams()) n += list.size();
        return n;
    }

    // Every committed event is in the stream of its shard, once, and each
    // stream holds its shard's events of its topic in feed order.
    void expect_every_event_once_in_order() {
        auto pg = connect();
        auto r = pg.exec("SELECT event_id::text, 'outbox:' || topic || ':' || outbox.shard_of(topic, key, " +
                         std::to_string(kShards) + ") FROM outbox.event ORDER BY txid, seq");
        std::map<std::string, std::vector<std::string>> want;  // stream -> event ids in feed order
        for (int i = 0; i < r.rows(); ++i) want[std::string(r.get(i, 1))].emplace_back(r.get(i, 0));
        std::set<std::string> seen;
        std::size_t total = 0;
        for (const auto& [key, list] : shard_streams()) {
            std::vector<std::string> got;
            for (const auto& e : list) {
                got.push_back(e.fields.at("event_id"));
                EXPECT_EQ(e.id, e.fields.at("position"));
                EXPECT_TRUE(seen.insert(e.fields.at("event_id")).second) << "twice: " << e.fields.at("event_id");
            }
            total += got.size();
            const auto it = want.find(key);
            EXPECT_EQ(got, it == want.end() ? std::vector<std::string>{} : it->second) << key;
        }
        EXPECT_EQ(total, static_cast<std::size_t>(r.rows()));
    }

    static std::string metrics_text(int port) {
        auto res = httplib::Client("127.0.0.1", port).Get("/metrics");
        return res && res->status == 200 ? res->body : std::string();
    }

    // A series of a relay's /metrics, -1 when absent.
    static double metric(int port, const std::string& series) {
        const auto body = metrics_text(port);
        const auto at = body.find("\n" + series + " ");
        if (at == std::string::npos) return -1;
        return std::stod(body.substr(at + series.size() + 2));
    }

    static std::string leader(const std::string& group) {
        return "pg_outbox_relay_leader{mode=\"publish\",group=\"" + group + "\"}";
    }

    static std::string shard(int s) { return "orders/" + std::to_string(s); }

    static httplib::Result health(int port) { return httplib::Client("127.0.0.1", port).Get("/health"); }
};

std::size_t count_lines_with(const std::string& log, const std::string& what) {
    std::istringstream lines(log);
    std::size_t n = 0;
    for (std::string line; std::getline(lines, line);)
        if (line.find(what) != std::string::npos) ++n;
    return n;
}

}  // namespace

// One process with --group 'orders/*' publishes every shard of a 4-shard
// group, a thread and a leadership each: every event once, in the stream
// of its shard, each stream in feed order. /metrics has a series per
// shard, /health a line per shard, and each thread's log lines name its
// shard. SIGTERM stops every thread, each resigning its shard.
TEST_F(MultiGroupTest, OneProcessPublishesEveryShardOnceInOrder) {
    const int port = free_port();
    auto& relay = start_groups({"orders/*"}, {"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    emit_concurrently(100, 1);
    auto pg = connect();
    const auto committed = std::stoul(query_column(pg, "SELECT count(*) FROM outbox.event")[0]);
    ASSERT_TRUE(eventually([&] { return entries() >= committed; }, 60s)) << entries() << " of " << committed << "\n"
                                                                         << relay.log();
    expect_every_event_once_in_order();

    // Each shard has its own cursor, moved to its own last event, and its
    // own leader: a backend each, named after its shard.
    EXPECT_TRUE(eventually(
        [&] {
            return query_column(pg, "SELECT sum(waiting) FROM outbox.group_stats WHERE group_name = 'orders'")[0] ==
                   "0";
        },
        10s));
    const auto apps = query_column(pg,
                                   "SELECT a.application_name FROM outbox.group_stats s"
                                   " JOIN pg_stat_activity a ON a.pid = s.leader_pid"
                                   " WHERE s.group_name = 'orders' ORDER BY 1");
    EXPECT_EQ(apps, (std::vector<std::string>{"pg_outbox_relay publish orders/0", "pg_outbox_relay publish orders/1",
                                              "pg_outbox_relay publish orders/2", "pg_outbox_relay publish orders/3"}));

    // A series per shard in one text; a health line per shard.
    const auto text = metrics_text(port);
    for (int s = 0; s < kShards; ++s) EXPECT_EQ(metric(port, leader(shard(s))), 1) << text;
    EXPECT_EQ(text.find("# TYPE pg_outbox_relay_leader"), text.rfind("# TYPE pg_outbox_relay_leader")) << text;
    double published = 0;
    for (int s = 0; s < kShards; ++s)
        published +=
            metric(port, "pg_outbox_relay_events_published_total{mode=\"publish\",group=\"" + shard(s) + "\"}");
    EXPECT_EQ(published, static_cast<double>(committed));
    auto h = health(port);
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200) << h->body;
    EXPECT_EQ(h->body, "orders/0: ok leader\norders/1: ok leader\norders/2: ok leader\norders/3: ok leader\n");

    // Every line of a shard's thread names it.
    const auto log = relay.log();
    for (int s = 0; s < kShards; ++s) {
        EXPECT_EQ(count_lines_with(log, "[" + shard(s) + "] leading group \"" + shard(s) + "\""), 1u) << log;
        EXPECT_EQ(count_lines_with(log, "leading group \"" + shard(s) + "\""), 1u) << log;
        EXPECT_GE(count_lines_with(log, "[" + shard(s) + "] published "), 1u) << log;
    }
    EXPECT_EQ(count_lines_with(log, "] published "), count_lines_with(log, " published ")) << log;

    relay.signal(SIGTERM);
    EXPECT_EQ(relay.wait(20s), 0) << relay.log();
    for (int s = 0; s < kShards; ++s)
        EXPECT_EQ(count_lines_with(relay.log(), "[" + shard(s) + "] resigned the leadership of group \"" + shard(s)),
                  1u)
            << relay.log();
    EXPECT_EQ(query_column(pg, "SELECT count(leader_pid) FROM outbox.group_stats WHERE group_name = 'orders'")[0], "0");
}

// Leadership is per shard: a second process with every shard stands by
// for each while the first leads them all (each shard has one leader);
// when the first is killed (kill -9), the second takes every shard over,
// and nothing is lost or published twice.
TEST_F(MultiGroupTest, LeadershipIsPerShardAcrossProcesses) {
    const int port_a = free_port(), port_b = free_port();
    auto led_by = [&](int port) {
        int n = 0;
        for (int s = 0; s < kShards; ++s) n += metric(port, leader(shard(s))) == 1 ? 1 : 0;
        return n;
    };
    auto& a = start_groups({"orders/*"}, {"--metrics-address", "127.0.0.1:" + std::to_string(port_a)});
    ASSERT_TRUE(eventually([&] { return led_by(port_a) == kShards; }, 20s)) << a.log();
    auto& b = start_groups({"orders/*"}, {"--metrics-address", "127.0.0.1:" + std::to_string(port_b)});
    ASSERT_TRUE(eventually(
        [&] {
            auto h = health(port_b);
            return h && h->status == 200 &&
                   h->body ==
                       "orders/0: ok standby\norders/1: ok standby\norders/2: ok standby\n"
                       "orders/3: ok standby\n";
        },
        20s))
        << b.log();
    for (int s = 0; s < kShards; ++s) {
        EXPECT_EQ(metric(port_a, leader(shard(s))), 1);
        EXPECT_EQ(metric(port_b, leader(shard(s))), 0);
        // Said once, after the first look at the leadership.
        EXPECT_TRUE(eventually(
            [&] {
                return count_lines_with(b.log(),
                                        "[" + shard(s) + "] standing by: group \"" + shard(s) + "\" is led by") == 1;
            },
            10s))
            << b.log();
    }
    auto pg = connect();
    EXPECT_EQ(
        query_column(pg, "SELECT count(DISTINCT leader_pid) FROM outbox.group_stats WHERE group_name = 'orders'")[0],
        std::to_string(kShards));

    emit_concurrently(50, 2);
    const auto committed = [&] { return std::stoul(query_column(pg, "SELECT count(*) FROM outbox.event")[0]); };
    ASSERT_TRUE(eventually([&] { return entries() >= committed(); }, 60s));

    // The leader dies without a word: the other process leads every shard
    // at once (the sessions ended with it), each thread on its own.
    a.signal(SIGKILL);
    a.wait(10s);
    emit_concurrently(50, 3);
    ASSERT_TRUE(eventually([&] { return led_by(port_b) == kShards; }, 20s)) << b.log();
    for (int s = 0; s < kShards; ++s)
        EXPECT_EQ(count_lines_with(b.log(), "[" + shard(s) + "] leading group \"" + shard(s) + "\""), 1u) << b.log();
    ASSERT_TRUE(eventually([&] { return entries() >= committed(); }, 60s)) << entries() << " of " << committed();
    expect_every_event_once_in_order();
    b.signal(SIGTERM);
    EXPECT_EQ(b.wait(20s), 0) << b.log();
}

// Two processes started together, each with every shard, share the
// shards: each shard has exactly one leader between them.
TEST_F(MultiGroupTest, TwoProcessesLeadEachShardOnce) {
    const int port_a = free_port(), port_b = free_port();
    auto& a = start_groups({"orders/*"}, {"--metrics-address", "127.0.0.1:" + std::to_string(port_a)});
    auto& b = start_groups({"orders/*"}, {"--metrics-address", "127.0.0.1:" + std::to_string(port_b)});
    ASSERT_TRUE(eventually(
        [&] {
            for (int s = 0; s < kShards; ++s)
                if (metric(port_a, leader(shard(s))) + metric(port_b, leader(shard(s))) != 1) return false;
            return true;
        },
        20s))
        << a.log() << b.log();
    auto pg = connect();
    EXPECT_EQ(
        query_column(pg, "SELECT count(DISTINCT leader_pid) FROM outbox.group_stats WHERE group_name = 'orders'")[0],
        std::to_string(kShards));
    emit_concurrently(50, 4);
    ASSERT_TRUE(eventually(
        [&] { return entries() >= std::stoul(query_column(pg, "SELECT count(*) FROM outbox.event")[0]); }, 60s));
    expect_every_event_once_in_order();
}

// A --group list that cannot be served exits 2 at once, naming the item:
// a group given twice (however named), an empty name, an unknown group, a
// shard the group lacks, a sharded group without its shard, shards without
// {shard} in the template. Nothing is led meanwhile. A relay of one
// unknown group keeps exiting 1, as it did (its group may be created
// later: the service manager starts it again).
TEST_F(MultiGroupTest, HostileGroupListsExit2) {
    struct Case {
        std::vector<std::string> groups;
        std::string says;
        std::vector<std::string> extra{};
    };
    const std::vector<Case> cases{
        {{"g", "g"}, "--group \"g\" is given twice"},
        {{""}, "--group: the group name must not be empty"},
        {{"g", ""}, "an empty group name"},
        {{"g,,orders/1"}, "an empty group name"},
        {{"orders/*", "orders/3"}, "--group \"orders/3\" names a group or shard that \"orders/*\" names too"},
        {{"g", "g/0"}, "names too"},
        {{"orders/1,orders/1"}, "is given twice"},
        {{"g", "nosuch"}, "--group \"nosuch\": group \"nosuch\" does not exist"},
        {{"nosuch/*"}, "--group \"nosuch/*\": group \"nosuch\" does not exist"},
        {{"g", "orders"}, "--group orders/0 to orders/3"},
        {{"g", "orders/4"}, "group \"orders\" has no shard 4; its shards are orders/0 to orders/3"},
        {{"orders/*"}, "put {shard} in the template", {"--stream", "outbox:{topic}"}},
        {{"orders/x", "g"}, "a shard is named"},
        {{"orders/*/"}, "a shard is named"},
    };
    for (const auto& c : cases) {
        auto& relay = start_groups(c.groups, c.extra);
        EXPECT_EQ(relay.wait(20s), 2) << c.says << "\n" << relay.log();
        EXPECT_NE(relay.log().find(c.says), std::string::npos) << relay.log();
    }
    auto pg = connect();
    EXPECT_EQ(query_column(pg, "SELECT count(leader_pid) FROM outbox.group_stats")[0], "0");
    EXPECT_EQ(published_count(), 0u);

    auto& one = start_groups({"nosuch"});
    EXPECT_EQ(one.wait(20s), 1) << one.log();
    EXPECT_NE(one.log().find("group \"nosuch\" does not exist"), std::string::npos) << one.log();
}

// One group's faults are its own: a stream key of the wrong type holds
// one group's batch (stuck, retried), a group dropped while the relay
// runs ends its thread's run (started again, failing, until it is
// created again); the other group keeps publishing all along, and each
// group catches up once its fault is gone.
TEST_F(MultiGroupTest, OneGroupsFaultLeavesTheOthersPublishing) {
    auto pg = connect();
    pg.exec("SELECT outbox_group_create('a', start_at => 'beginning')");
    pg.exec("SELECT outbox_group_create('b', start_at => 'beginning')");
    pg.exec("SELECT outbox_group_create('c', start_at => 'beginning')");
    auto redis = redis_->connect();
    redis.command({"SET", "outbox:b:orders", "not a stream"});
    const int port = free_port();
    auto& relay = start_groups({"a,b", "c"}, {"--stream", "outbox:{group}:{topic}", "--stuck-after", "1s",
                                              "--metrics-address", "127.0.0.1:" + std::to_string(port)});
    auto count = [&](const std::string& group) {
        std::size_t n = 0;
        for (const auto& t : kTopics) {
            const auto key = "outbox:" + group + ":" + t;
            const auto type = redis.command({"TYPE", key});
            if (std::string(type->str, type->len) == "string") continue;  // b's stream of the wrong type
            n += read_stream(redis, key).size();
        }
        return n;
    };
    emit(30);
    ASSERT_TRUE(eventually([&] { return count("a") == 30 && count("c") == 30; }, 30s)) << relay.log();
    // b is stuck on its batch, a and c are not.
    ASSERT_TRUE(eventually(
        [&] {
            auto h = health(port);
            return h && h->status == 503 && h->body.find("b: stuck") != std::string::npos;
        },
        20s))
        << relay.log();
    auto h = health(port);
    ASSERT_TRUE(h);
    EXPECT_NE(h->body.find("a: ok leader\n"), std::string::npos) << h->body;
    EXPECT_NE(h->body.find("c: ok leader\n"), std::string::npos) << h->body;
    EXPECT_NE(h->body.find("redis_WRONGTYPE"), std::string::npos) << h->body;
    EXPECT_GT(metric(port, "pg_outbox_relay_errors_total{mode=\"publish\",group=\"b\",kind=\"redis_WRONGTYPE\"}"), 0);
    EXPECT_EQ(metric(port, "pg_outbox_relay_errors_total{mode=\"publish\",group=\"a\",kind=\"redis_WRONGTYPE\"}"), 0);

    // c is dropped: its run ends on the fatal error, a's does not.
    pg.exec("SELECT outbox_group_drop('c')");
    ASSERT_TRUE(eventually(
        [&] {
            auto hc = health(port);
            return hc && hc->body.find("c: failed: PostgreSQL: ") != std::string::npos;
        },
        20s))
        << relay.log();
    EXPECT_GE(count_lines_with(relay.log(), "[c] stopped on a fatal error"), 1u) << relay.log();
    EXPECT_EQ(metric(port, leader("c")), 0);
    emit(30, 30);
    ASSERT_TRUE(eventually([&] { return count("a") == 60; }, 30s)) << relay.log();
    EXPECT_EQ(metric(port, leader("a")), 1);
    EXPECT_TRUE(relay.running());

    // b's stream is fixed: b publishes everything, in order, once.
    redis.command({"DEL", "outbox:b:orders"});
    ASSERT_TRUE(eventually([&] { return count("b") == 60; }, 30s)) << relay.log();
    // c is created again: its thread, started again, publishes from the
    // beginning; what it had published is refused as already present.
    pg.exec("SELECT outbox_group_create('c', start_at => 'beginning')");
    ASSERT_TRUE(eventually(
        [&] {
            auto hc = health(port);
            return count("c") == 60 && hc && hc->status == 200;
        },
        30s))
        << relay.log();
    for (const std::string group : {"a", "b", "c"}) {
        std::set<std::string> ids;
        for (const auto& t : kTopics)
            for (const auto& e : read_stream(redis, "outbox:" + group + ":" + t))
                EXPECT_TRUE(ids.insert(e.fields.at("event_id")).second)
                    << group << " twice: " << e.fields.at("event_id");
        EXPECT_EQ(ids.size(), 60u) << group;
    }
    relay.signal(SIGTERM);
    EXPECT_EQ(relay.wait(20s), 0) << relay.log();
}

// A setting that cannot work, found by one group's thread while the
// others publish (here: a group recreated with shards, named without
// one), stops every thread, each resigning, and the process exits 2.
TEST_F(MultiGroupTest, ASettingErrorInOneGroupStopsEveryGroupWithExit2) {
    auto pg = connect();
    pg.exec("SELECT outbox_group_create('x', start_at => 'beginning')");
    auto& relay = start_groups({"g", "x"}, {"--stream", "outbox:{group}:{topic}"});
    emit(6);
    auto redis = redis_->connect();
    ASSERT_TRUE(eventually(
        [&] {
            std::size_t n = 0;
            for (const std::string group : {"g", "x"})
                for (const auto& t : kTopics) n += read_stream(redis, "outbox:" + group + ":" + t).size();
            return n == 12;
        },
        30s))
        << relay.log();
    pg.exec("SELECT outbox_group_drop('x')");
    pg.exec("SELECT outbox_group_create('x', start_at => 'beginning', shards => 2)");
    EXPECT_EQ(relay.wait(30s), 2) << relay.log();
    const auto log = relay.log();
    EXPECT_NE(log.find("[x] --group \"x\": the group has 2 shards"), std::string::npos) << log;
    EXPECT_EQ(count_lines_with(log, "[g] resigned the leadership of group \"g\""), 1u) << log;
    EXPECT_EQ(query_column(pg, "SELECT count(leader_pid) FROM outbox.group_stats")[0], "0");
}

// Redis refusing the relay's AUTH: every thread finds it at its first
// connection, and the process exits 2 naming the setting.
TEST_F(MultiGroupTest, RedisSettingRefusedExits2) {
    RedisServer secured(false, {"--requirepass", "Sekr3t-pw"});
    auto& relay = start_groups({"orders/*", "g"}, {"--redis", secured.address()});
    EXPECT_EQ(relay.wait(20s), 2) << relay.log();
    EXPECT_NE(relay.log().find("--redis-password"), std::string::npos) << relay.log();
    EXPECT_EQ(relay.log().find("Sekr3t"), std::string::npos) << relay.log();
}
