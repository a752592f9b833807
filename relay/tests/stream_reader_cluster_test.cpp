// The Redis side of consume mode on a Redis Cluster (3 masters, no
// replicas, on loopback) and without PostgreSQL: a StreamReader reads the
// streams slot by slot, each slot's with the group's position on its
// master, and acknowledges, claims and reports trimmed ranges on the
// master of each stream's slot.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "pg_outbox/metrics.hpp"
#include "pg_outbox/redis_cluster.hpp"
#include "pg_outbox/stream_reader.hpp"
#include "servers.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

class StreamReaderClusterTest : public ::testing::Test {
protected:
    void SetUp() override {
        servers_ = std::make_unique<RedisClusterServers>(3, 0);
        config_.redis = RedisAddress::parse(servers_->url());
        config_.consumer = "accounting";
        config_.consumer_group = "accounting";
        config_.worker = "w1";
        // Two streams sharing a slot (one transaction), two more elsewhere.
        config_.streams = {"{in}:a", "{in}:b", "in:c", "in:d"};
        config_.block = 20ms;
        admin_ = std::make_unique<RedisCluster>(parse_cluster_url(servers_->url()), "", 2s);
    }

    void add(const std::string& stream, const std::string& id, const std::string& prev) {
        admin_->command(stream, {"XADD", stream, id, "event_id", id, "prev", prev});
    }

    Config config_;
    std::unique_ptr<RedisClusterServers> servers_;
    std::unique_ptr<RedisCluster> admin_;
};

}  // namespace

TEST_F(StreamReaderClusterTest, ReadsEverySlotFindsGapsAndSettlesOnEachMaster) {
    std::set<int> masters;
    for (const auto& s : config_.streams) masters.insert(static_cast<int>(servers_->master_of(key_slot(s))));
    ASSERT_GT(masters.size(), 1u) << "the streams should span masters";

    Metrics metrics("consume", "accounting");
    std::atomic<bool> stop{false};
    StreamReader reader(config_, metrics, stop);
    RedisCluster target(parse_cluster_url(servers_->url()), "", 2s);
    reader.reset(&target);
    EXPECT_TRUE(reader.reachable());
    reader.ensure_groups();
    std::vector<Gap> gaps;
    auto read = [&] { return reader.read(config_.streams, [&](const Gap& g) { gaps.push_back(g); }); };
    EXPECT_TRUE(read().empty());  // each slot waits its share of --block

    for (const auto& s : config_.streams) add(s, "1-1", "0-0");
    auto entries = read();
    ASSERT_EQ(entries.size(), 4u);
    std::set<std::string> streams;
    for (const auto& e : entries) streams.insert(e.stream);
    EXPECT_EQ(streams.size(), 4u);
    EXPECT_TRUE(gaps.empty());

    add("{in}:b", "1-9", "1-8");  // 1-2 ... 1-8 missing
    add("in:d", "1-2", "1-1");
    auto more = read();
    ASSERT_EQ(more.size(), 2u);
    ASSERT_EQ(gaps.size(), 1u);
    EXPECT_EQ(gaps[0].stream, "{in}:b");
    EXPECT_EQ(gaps[0].range(), "(1-1 1-8]");

    // Acknowledged on each stream's master: nothing left pending there.
    std::vector<const StreamEntry*> all;
    for (const auto& e : entries) all.push_back(&e);
    for (const auto& e : more) all.push_back(&e);
    reader.ack(all);
    for (const auto& s : config_.streams) {
        auto p = admin_->command(s, {"XPENDING", s, "accounting"});
        EXPECT_EQ(p->element[0]->integer, 0) << s;
    }

    // Claims and trim reports go to the stream's master too.
    add("in:c", "2-1", "1-1");
    ASSERT_EQ(read().size(), 1u);
    auto page = reader.claim("in:c", "0", "0-0");
    ASSERT_TRUE(page);
    ASSERT_EQ(page->entries.size(), 1u);
    reader.count_deliveries("in:c", page->entries);
    EXPECT_EQ(page->entries[0].deliveries, 2);
    for (const auto* id : {"3-1", "3-2", "3-3"}) add("in:d", id, "0-0");
    admin_->command("in:d", {"XTRIM", "in:d", "MAXLEN", "1"});
    const auto trimmed = reader.trimmed_unread("in:d");
    ASSERT_TRUE(trimmed);
    EXPECT_EQ(trimmed->lost, 2);
    reader.skip_trimmed(*trimmed);
    EXPECT_FALSE(reader.trimmed_unread("in:d"));
}
