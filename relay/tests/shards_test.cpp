// Integration tests of sharded groups: a relay per shard, each with its own
// leadership and streams, publishing one group in parallel.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <thread>

#include "fixture.hpp"
#include "pg_outbox/position.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

constexpr int kShards = 3;

class ShardsTest : public RelayTest {
protected:
    void SetUp() override {
        RelayTest::SetUp();
        auto pg = connect();
        pg.exec("SELECT outbox_group_create('s', start_at => 'beginning', shards => " + std::to_string(kShards) +
                ")");
    }

    Process& start_shard_relay(int shard, const std::string& tmpl = "outbox:{topic}:{shard}") {
        return start_process({PG_OUTBOX_RELAY_BINARY, "publish", "--group", "s/" + std::to_string(shard), "--pg",
                              pg_->conninfo("app", "relay_user"), "--redis", redis_->address(), "--stream", tmpl,
                              "--poll-interval", "50ms", "--retry-min", "20ms", "--retry-max", "300ms",
                              "--stats-interval", "500ms", "--batch-size", "50", "--log-level", "debug"});
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
};

// Three relays, one per shard, with writers running: every committed event
// is in exactly one stream, the one of its shard, once, and each stream
// holds its shard's events of its topic in feed order, so every key's
// events are in order.
TEST_F(ShardsTest, ARelayPerShardPublishesEveryEventOnceInOrder) {
    for (int s = 0; s < kShards; ++s) start_shard_relay(s);
    std::vector<std::thread> writers;
    for (int w = 0; w < 4; ++w) {
        writers.emplace_back([&, w] {
            auto pg = connect();
            std::mt19937 rng(w);
            for (int t = 0; t < 100; ++t) {
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
    auto pg = connect();
    const auto committed = std::stoul(query_column(pg, "SELECT count(*) FROM outbox.event")[0]);
    ASSERT_TRUE(eventually([&] { return entries() >= committed; }, 30s)) << entries() << " of " << committed;

    // event id -> (its stream by its shard, position)
    auto r = pg.exec("SELECT event_id::text, 'outbox:' || topic || ':' || outbox.shard_of(topic, key, " +
                     std::to_string(kShards) + "), txid::text || '-' || seq FROM outbox.event ORDER BY txid, seq");
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
    EXPECT_EQ(total, committed);

    // Each shard has its own cursor, moved to its own last event, and its
    // own leader.
    EXPECT_TRUE(eventually(
        [&] { return query_column(pg, "SELECT sum(waiting) FROM outbox.group_stats WHERE group_name = 's'")[0] == "0"; },
        10s));
    EXPECT_EQ(query_column(pg, "SELECT count(DISTINCT leader_pid) FROM outbox.group_stats WHERE group_name = 's'")[0],
              std::to_string(kShards));
}

// A relay for the whole of a sharded group, or one whose streams are not
// per shard, would mix shards in one stream: both are refused at start.
TEST_F(ShardsTest, ShardlessNameOrTemplateIsAConfigError) {
    auto& whole = start_process({PG_OUTBOX_RELAY_BINARY, "publish", "--group", "s", "--pg",
                                 pg_->conninfo("app", "relay_user"), "--redis", redis_->address()});
    EXPECT_EQ(whole.wait(20s), 2);
    EXPECT_NE(whole.log().find("--group s/0 to s/2"), std::string::npos) << whole.log();
    auto& shared = start_shard_relay(1, "outbox:{topic}");
    EXPECT_EQ(shared.wait(20s), 2);
    EXPECT_NE(shared.log().find("put {shard} in the template"), std::string::npos) << shared.log();
    auto& missing = start_shard_relay(7);
    EXPECT_EQ(missing.wait(20s), 1);
    EXPECT_NE(missing.log().find("has no shard 7"), std::string::npos) << missing.log();
}

}  // namespace
