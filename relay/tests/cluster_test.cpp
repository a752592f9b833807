// Integration tests of publish mode against a Redis Cluster of 3 masters
// and 3 replicas on loopback, with writers running: slots migrated, a
// master killed behind a replica that lagged, a master stopped and
// started again. After each, every stream holds its topic's committed
// events exactly once, in feed order.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "fixture.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/position.hpp"
#include "pg_outbox/redis_cluster.hpp"
#include "pg_outbox/stream_pool.hpp"
#include "pg_outbox/stream_writer.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

// The slot the stream of a topic lives in.
int stream_slot(const std::string& topic) { return key_slot("outbox:" + topic); }

// A topic whose stream's slot lies in [from, to].
std::string topic_in_slots(int from, int to, const std::string& prefix) {
    for (int i = 0;; ++i) {
        const auto t = prefix + std::to_string(i);
        const int slot = stream_slot(t);
        if (from <= slot && slot <= to) return t;
    }
}

class ClusterTest : public RelayTest {
protected:
    void SetUp() override {
        RelayTest::SetUp();
        cluster_ = std::make_unique<RedisClusterServers>();
        // redis-cli --cluster create gives the masters 0-5460,
        // 5461-10922 and 10923-16383. "low" lies in the first slots,
        // which a reshard moves first; the others spread over the
        // masters, two per master.
        topics_ = {topic_in_slots(0, 40, "low"),       topic_in_slots(100, 5460, "a"),
                   topic_in_slots(5461, 10922, "b"),   topic_in_slots(10923, 16383, "c"),
                   topic_in_slots(5461, 10922, "bb"),  topic_in_slots(10923, 16383, "cc")};
    }

    void TearDown() override {
        stop_writers();
        processes_.clear();
        cluster_.reset();
        RelayTest::TearDown();
    }

    Process& start_cluster_relay() {
        return start_relay({"--redis", cluster_->url(), "--redis-timeout", "1s", "--batch-size", "50"});
    }

    // Writers: transactions of 1 to 4 events on random topics (so that a
    // batch spans streams on several nodes), until stop_writers().
    void start_writers(int n = 2) {
        for (int w = 0; w < n; ++w) {
            writers_.emplace_back([this, w] {
                auto pg = connect();
                std::mt19937 rng(static_cast<unsigned>(w));
                while (!done_) {
                    pg.exec("BEGIN");
                    const int k = 1 + static_cast<int>(rng() % 4);
                    for (int i = 0; i < k; ++i)
                        pg.exec("SELECT outbox_emit($1, $2, '{\"w\": 1}')",
                                {topics_[rng() % topics_.size()], "w" + std::to_string(w)});
                    pg.exec("COMMIT");
                    std::this_thread::sleep_for(3ms);
                }
            });
        }
    }

    void stop_writers() {
        done_ = true;
        for (auto& t : writers_)
            if (t.joinable()) t.join();
        writers_.clear();
    }

    // Every committed event's id, by topic, in feed order.
    std::map<std::string, std::vector<std::string>> committed() {
        auto pg = connect();
        auto r = pg.exec("SELECT topic, event_id FROM outbox.event ORDER BY txid, seq");
        std::map<std::string, std::vector<std::string>> out;
        for (int i = 0; i < r.rows(); ++i) out[std::string(r.get(i, 0))].emplace_back(r.get(i, 1));
        return out;
    }

    std::size_t cluster_published_count() {
        try {
            std::size_t n = 0;
            for (const auto& t : topics_) n += cluster_->read_stream("outbox:" + t).size();
            return n;
        } catch (const std::exception&) {
            return 0;  // a node going away, a slot migrating: ask again
        }
    }

    bool wait_cluster_published(std::chrono::milliseconds timeout = 60s) {
        return eventually([&] { return cluster_published_count() >= committed_count(); }, timeout, 200ms);
    }

    // The history check: each stream holds exactly its topic's committed
    // events, once each, in feed order, each under its position as id.
    void expect_exactly_once_in_order() {
        const auto want = committed();
        std::size_t total = 0, want_total = 0;
        for (const auto& t : topics_) {
            std::vector<std::string> got;
            std::string prev = "0-0";  // each entry names the one before it in its stream
            for (const auto& e : cluster_->read_stream("outbox:" + t)) {
                got.push_back(e.fields.at("event_id"));
                EXPECT_EQ(e.id, e.fields.at("position")) << "outbox:" << t;
                EXPECT_EQ(e.fields.count("prev") ? e.fields.at("prev") : "(none)", prev) << "outbox:" << t << " " << e.id;
                prev = e.id;
            }
            total += got.size();
            const auto it = want.find(t);
            EXPECT_EQ(got, it == want.end() ? std::vector<std::string>{} : it->second) << "stream outbox:" << t;
        }
        for (const auto& [t, ids] : want) want_total += ids.size();
        EXPECT_EQ(total, want_total);
        EXPECT_GT(want_total, 100u) << "the writers wrote too little to test anything";
    }

    std::unique_ptr<RedisClusterServers> cluster_;
    std::vector<std::string> topics_;
    std::atomic<bool> done_{false};
    std::vector<std::thread> writers_;
};

}  // namespace

// The relay's hash slots are the cluster's, hostile keys included.
TEST_F(ClusterTest, SlotsAgreeWithClusterKeyslot) {
    auto c = cluster_->node(0).connect();
    for (const std::string& key : std::vector<std::string>{"", "{", "}", "{}", "}{", "{}{}", "foo{}{bar}", "foo{{bar}}zap", "{user1000}.following",
          "outbox:{orders}", "a{b}c{d}", std::string("nul\0{x}", 7), "\xff\xfe{\x80}", "{{}}", "x{y"}) {
        auto r = c.command({"CLUSTER", "KEYSLOT", key});
        EXPECT_EQ(r->integer, key_slot(key)) << key;
    }
}

// 200 slots, one stream's among them, move from one master to another
// while the relay publishes: MOVED and ASK send each stream's share to
// the node that has it.
TEST_F(ClusterTest, ReshardWhilePublishing) {
    const std::size_t from = cluster_->master_of(0), to = cluster_->master_of(6000);
    ASSERT_EQ(cluster_->master_of(stream_slot(topics_[0])), from);
    auto& relay = start_cluster_relay();
    start_writers();
    std::this_thread::sleep_for(1500ms);
    std::string log;
    ASSERT_EQ(cluster_->reshard(from, to, 200, &log), 0) << log;
    ASSERT_TRUE(cluster_->wait_ok());
    EXPECT_EQ(cluster_->master_of(stream_slot(topics_[0])), to);
    std::this_thread::sleep_for(1s);
    // And back, the other way.
    ASSERT_EQ(cluster_->reshard(to, from, 100, &log), 0) << log;
    ASSERT_TRUE(cluster_->wait_ok());
    std::this_thread::sleep_for(1s);
    stop_writers();
    ASSERT_TRUE(wait_cluster_published()) << relay.log();
    expect_exactly_once_in_order();
    EXPECT_TRUE(relay.running()) << relay.log();
}

// A master is killed while its replica lags behind it (the link cut
// for a moment): the replica, promoted, lacks the last entries of some
// streams.
// The relay notices, stream by stream, and publishes exactly those again.
TEST_F(ClusterTest, MasterKilledBehindALaggingReplica) {
    const std::size_t master = cluster_->master_of(stream_slot(topics_[1]));
    const std::size_t replica = cluster_->replica_of(master);
    auto& relay = start_cluster_relay();
    start_writers();
    std::this_thread::sleep_for(1500ms);
    // The replica drops its link to the master and cannot make it again
    // (AUTH with a password the master does not have; a SIGSTOP would not
    // do: the kernel's socket buffer keeps what the master sent for the
    // replica to read later): for 700 ms the master takes writes its
    // replica never sees.
    auto r = cluster_->node(replica).connect();
    r.command({"CONFIG", "SET", "masterauth", "not-the-password"});
    r.command({"CLIENT", "KILL", "TYPE", "master"});
    std::this_thread::sleep_for(700ms);
    cluster_->node(master).signal(SIGKILL);
    ASSERT_TRUE(cluster_->wait_ok(30s)) << cluster_->node(replica).log();
    EXPECT_EQ(cluster_->master_of(stream_slot(topics_[1])), replica);
    std::this_thread::sleep_for(1500ms);
    stop_writers();
    ASSERT_TRUE(wait_cluster_published()) << relay.log();
    expect_exactly_once_in_order();
    const auto log = relay.log();
    EXPECT_TRUE(log.find("is behind") != std::string::npos || log.find("lost entries") != std::string::npos)
        << "the relay did not notice the lost entries:\n" << log;
}

// A master is stopped (its replica takes over), then started again (it
// rejoins as a replica, empty, and syncs from the new master).
TEST_F(ClusterTest, NodeStoppedAndRestarted) {
    const std::size_t master = cluster_->master_of(stream_slot(topics_[2]));
    const std::size_t replica = cluster_->replica_of(master);
    auto& relay = start_cluster_relay();
    start_writers();
    std::this_thread::sleep_for(1500ms);
    cluster_->node(master).stop();
    ASSERT_TRUE(cluster_->wait_ok(30s)) << cluster_->node(replica).log();
    EXPECT_EQ(cluster_->master_of(stream_slot(topics_[2])), replica);
    std::this_thread::sleep_for(1s);
    cluster_->node(master).start();
    ASSERT_TRUE(cluster_->wait_ok(30s));
    ASSERT_TRUE(cluster_->wait_synced());  // the restarted node, a replica now
    std::this_thread::sleep_for(1500ms);
    stop_writers();
    ASSERT_TRUE(wait_cluster_published()) << relay.log();
    expect_exactly_once_in_order();
    EXPECT_TRUE(relay.running()) << relay.log();
}

namespace {

// Consume mode on a cluster: a consumer reads every stream, each from its
// master, and applies the events through the inbox into a projection.
class ClusterConsumeTest : public ClusterTest {
protected:
    void SetUp() override {
        ClusterTest::SetUp();
        sink_ = pg_->create_database("sink");
        PgConnection db(sink_, "tests");
        db.exec("CREATE ROLE consumer_user LOGIN IN ROLE outbox_consumer");
        db.exec("CREATE TABLE projection (event_id uuid, topic text)");
        db.exec(R"(CREATE FUNCTION apply_event(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
            RETURNS void LANGUAGE sql AS $$ INSERT INTO projection VALUES (event_id, topic) $$)");
        db.exec("GRANT ALL ON projection TO consumer_user");
        db.exec("SELECT inbox_consumer_create('accounting', 'consumer_user')");
    }

    Process& start_consumer(const std::vector<std::string>& extra_streams = {},
                            const std::vector<std::string>& extra_args = {}) {
        std::vector<std::string> args{PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting",
                                      "--pg", pg_->conninfo("sink", "consumer_user"),
                                      "--redis", cluster_->url(), "--redis-timeout", "1s",
                                      "--handler", "SELECT apply_event($1, $2, $3, $4, $5)", "--block", "200ms",
                                      // Entries the dead master had acknowledged, pending again
                                      // on the promoted replica, come back by XAUTOCLAIM.
                                      "--min-idle", "2s", "--claim-interval", "500ms",
                                      "--retry-min", "20ms", "--retry-max", "300ms", "--log-level", "debug"};
        for (const auto& t : topics_) args.insert(args.end(), {"--stream", "outbox:" + t});
        for (const auto& s : extra_streams) args.insert(args.end(), {"--stream", s});
        args.insert(args.end(), extra_args.begin(), extra_args.end());
        return start_process(args);
    }

    long long sink_count(const std::string& sql) {
        PgConnection db(sink_, "tests");
        return std::stoll(query_column(db, sql)[0]);
    }

    std::string sink_;
};

}  // namespace

// A master is killed while a publisher and a consumer run: the consumer
// follows the failover, and the inbox applies each event once.
TEST_F(ClusterConsumeTest, ConsumerFollowsAFailover) {
    auto& relay = start_cluster_relay();
    auto& consumer = start_consumer();
    start_writers();
    std::this_thread::sleep_for(1500ms);
    const std::size_t master = cluster_->master_of(stream_slot(topics_[3]));
    cluster_->node(master).signal(SIGKILL);
    ASSERT_TRUE(cluster_->wait_ok(30s));
    std::this_thread::sleep_for(1500ms);
    stop_writers();
    ASSERT_TRUE(wait_cluster_published()) << relay.log();
    const auto want = static_cast<long long>(committed_count());
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(DISTINCT event_id) FROM projection") >= want; },
                           60s, 200ms))
        << consumer.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), want);
    EXPECT_EQ(sink_count("SELECT count(DISTINCT event_id) FROM projection"), want);
    expect_exactly_once_in_order();
    EXPECT_TRUE(consumer.running()) << consumer.log();
}

// Gaps are found per slot as on one server: a read of a slot's streams
// is a transaction on its master with the group's position in each. An
// entry deleted before the group read it (a gap within one read), and an
// entry whose prev names one the group never got after the group had
// read up to the entry before (a gap across reads, two streams of one
// slot read together), are each reported once, as a dead letter of the
// range; a hostile prev beside them is dead-lettered alone, and every
// other entry is applied.
TEST_F(ClusterConsumeTest, GapsAreFoundPerSlot) {
    auto& relay = start_cluster_relay();
    {
        auto pg = connect();
        for (int i = 0; i < 8; ++i)
            for (const auto& t : topics_) pg.exec("SELECT outbox_emit($1, 'k', '{}')", {t});
    }
    ASSERT_TRUE(wait_cluster_published()) << relay.log();
    const std::string deleted_from = "outbox:" + topics_[1];
    const auto before = cluster_->read_stream(deleted_from);
    ASSERT_EQ(before.size(), 8u);
    {
        auto c = cluster_->node(cluster_->master_of(key_slot(deleted_from))).connect();
        c.command({"XDEL", deleted_from, before[4].id});
    }

    // Two streams of one slot, written as a hostile producer would.
    const std::string gap = "{h}:gap", bad = "{h}:bad";
    ASSERT_EQ(key_slot(gap), key_slot(bad));
    auto h = cluster_->node(cluster_->master_of(key_slot(gap))).connect();
    auto add = [&](const std::string& stream, const std::string& id, int n, const std::string& prev) {
        const std::string uuid = "00000000-0000-4000-8000-" + std::string(10, '0') + std::to_string(10 + n);
        h.command({"XADD", stream, id, "event_id", uuid, "topic", "t", "key", "k", "payload", "{}", "prev", prev});
    };
    add(gap, "5-1", 1, "0-0");
    add(gap, "5-2", 2, "5-1");
    add(bad, "5-1", 3, "0-0");
    add(bad, "5-2", 4, "abc");
    add(bad, "5-3", 5, "5-2");
    auto& consumer = start_consumer({gap, bad});
    const auto relayed = static_cast<long long>(committed_count()) - 1;
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") == relayed + 4; }, 30s, 100ms))
        << consumer.log();
    // The group has read "{h}:gap" up to 5-2; 5-3 never comes.
    add(gap, "5-4", 6, "5-3");
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") == relayed + 5; }, 30s, 100ms))
        << consumer.log();
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 3; }, 10s, 100ms))
        << consumer.log();
    PgConnection db(sink_, "tests");
    auto dead = query_column(db, "SELECT stream || ' ' || entry_id || ' ' || coalesce(sqlstate, '-') "
                                 "FROM outbox.dead_letters");
    std::sort(dead.begin(), dead.end());
    EXPECT_EQ(dead, (std::vector<std::string>{deleted_from + " (" + before[3].id + " " + before[4].id + "] -",
                                              "{h}:bad 5-2 22P02", "{h}:gap (5-2 5-3] -"}));
    const auto log = consumer.log();
    for (const auto& line : {"stream \"" + deleted_from + "\": gap (" + before[3].id + " " + before[4].id + "]",
                             std::string("stream \"{h}:gap\": gap (5-2 5-3]")}) {
        EXPECT_NE(log.find(line), std::string::npos) << log;
        EXPECT_EQ(log.find(line, log.find(line) + 1), std::string::npos) << "reported twice: " << line;
    }
    EXPECT_EQ(sink_count("SELECT count(DISTINCT event_id) FROM projection"), relayed + 5);
    EXPECT_TRUE(consumer.running()) << consumer.log();
}

namespace {

// An event at position "major-minor" on a topic, as a fetch decodes it.
Event event_at(std::uint64_t major, std::uint64_t minor, const std::string& topic) {
    Event e;
    e.parsed = Position{major, minor};
    e.position = e.parsed.to_string();
    e.event_id = "event-" + e.position;
    e.topic = topic;
    e.key = "k" + std::to_string(minor);
    e.payload = "{}";
    e.created_at = "2026-12-01T00:00:00.000000Z";
    return e;
}

std::vector<Event> batch_at(std::uint64_t major, std::size_t n, const std::vector<std::string>& topics) {
    std::vector<Event> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(event_at(major, i + 1, topics[i % topics.size()]));
    return out;
}

// The StreamWriter on a cluster of 3 masters, without PostgreSQL: batches
// as a fetch decodes them, written through slot migrations step by step.
class ClusterWriterTest : public ::testing::Test {
protected:
    void SetUp() override {
        config_.group = "g";
        config_.retry_min = 20ms;
        servers_ = std::make_unique<RedisClusterServers>(3, 0);
        // A topic on each master.
        topics_ = {topic_in_slots(0, 5460, "a"), topic_in_slots(5461, 10922, "b"),
                   topic_in_slots(10923, 16383, "c")};
        cluster_ = std::make_unique<RedisCluster>(parse_cluster_url(servers_->url()), "", 2s);
        writer_ = std::make_unique<StreamWriter>(config_, metrics_, stop_);
        writer_->reset(*cluster_);
    }

    void expect_exactly(const std::vector<std::vector<Event>>& batches) {
        for (const auto& topic : topics_) {
            std::vector<std::string> want, got;
            for (const auto& b : batches)
                for (const auto& e : b)
                    if (e.topic == topic) want.push_back(e.position + " " + e.event_id);
            // Each entry names the one before it, through ASK, MOVED and
            // a batch written again.
            std::string prev = "0-0";
            for (const auto& entry : servers_->read_stream("outbox:" + topic)) {
                got.push_back(entry.id + " " + entry.fields.at("event_id"));
                EXPECT_EQ(entry.fields.count("prev") ? entry.fields.at("prev") : "(none)", prev) << entry.id;
                prev = entry.id;
            }
            EXPECT_EQ(got, want) << topic;
        }
    }

    // Once the slots settled: two more batches (the first ones may meet a
    // redirection and go through the script), then one that is a
    // transaction again; every entry is there once, in order.
    void expect_transactions_again(std::vector<std::vector<Event>>& batches) {
        for (int k = 0; k < 2; ++k) {
            batches.push_back(batch_at(batches.size() + 1, 30, topics_));
            writer_->write(batches.back());
        }
        const auto transactions = metrics_.transaction_batches.load();
        batches.push_back(batch_at(batches.size() + 1, 30, topics_));
        writer_->write(batches.back());
        EXPECT_EQ(metrics_.transaction_batches.load(), transactions + 1);
        expect_exactly(batches);
    }

    Config config_;
    Metrics metrics_{"publish", "g"};
    std::atomic<bool> stop_{false};
    std::unique_ptr<RedisClusterServers> servers_;
    std::vector<std::string> topics_;
    std::unique_ptr<RedisCluster> cluster_;
    std::unique_ptr<StreamWriter> writer_;
};

}  // namespace

// A stream's slot migrates while batches are written: during the
// migration its master answers ASK (the writer sends ASKING and the share
// to the importing node), after it MOVED (the slot map is read again). A
// batch written again after it was half applied (only some streams, part
// of a stream) writes what is missing, once, in order.
TEST_F(ClusterWriterTest, AskMovedAndAHalfAppliedBatchDuplicateNothing) {
    std::vector<std::vector<Event>> batches;
    batches.push_back(batch_at(1, 30, topics_));
    writer_->write(batches.back());
    EXPECT_EQ(metrics_.events_published.load(), 30u);

    const std::string key = "outbox:" + topics_[0];
    const int slot = key_slot(key);
    const std::size_t from = servers_->master_of(slot), to = servers_->master_of(6000);
    ASSERT_NE(from, to);
    const auto from_id = servers_->id(from), to_id = servers_->id(to);
    const auto slot_text = std::to_string(slot);
    auto source = servers_->node(from).connect();
    auto target = servers_->node(to).connect();
    target.command({"CLUSTER", "SETSLOT", slot_text, "IMPORTING", from_id});
    source.command({"CLUSTER", "SETSLOT", slot_text, "MIGRATING", to_id});
    const auto port = std::to_string(servers_->node(to).port());
    source.command({"MIGRATE", "127.0.0.1", port, "", "0", "5000", "KEYS", key});
    // The key is on the importing node now: its old master answers ASK.
    EXPECT_EQ(std::string(reply_text(source.command_raw({"XINFO", "STREAM", key}).get())).rfind("ASK ", 0), 0u);
    batches.push_back(batch_at(2, 30, topics_));
    writer_->write(batches.back());

    for (std::size_t i = 0; i < servers_->size(); ++i) {
        auto c = servers_->node(i).connect();
        c.command({"CLUSTER", "SETSLOT", slot_text, "NODE", to_id});
    }
    EXPECT_EQ(std::string(reply_text(source.command_raw({"XINFO", "STREAM", key}).get())).rfind("MOVED ", 0), 0u);
    batches.push_back(batch_at(3, 30, topics_));
    writer_->write(batches.back());

    // Half applied: the first 10 events of a batch got in (a fault cut
    // the write short), then the whole batch is written again.
    auto half = batch_at(4, 30, topics_);
    writer_->write(std::vector<Event>(half.begin(), half.begin() + 10));
    const auto before = metrics_.events_published.load();
    writer_->write(half);
    batches.push_back(half);
    EXPECT_EQ(metrics_.events_published.load() - before, 20u);
    EXPECT_EQ(metrics_.events_already_published.load(), 10u);
    expect_exactly(batches);
    EXPECT_EQ(servers_->master_of(slot), to);
}

// A stream cut short on its master (as by a failover to a replica that
// lagged) is found behind by the stream check, on that master only.
TEST_F(ClusterWriterTest, StreamCheckAsksEachStreamsMaster) {
    auto b = batch_at(1, 30, topics_);
    auto written = writer_->write(b);
    std::map<std::string, Position> published;
    for (const auto& [stream, position] : written) published[stream] = *Position::parse(position);
    EXPECT_FALSE(writer_->check_streams(published));
    // The last 2 entries of one stream lost.
    const std::string key = "outbox:" + topics_[1];
    auto c = servers_->node(servers_->master_of(key_slot(key))).connect();
    const auto entries = servers_->read_stream(key);
    ASSERT_GE(entries.size(), 3u);
    c.command({"XDEL", key, entries[entries.size() - 1].id, entries[entries.size() - 2].id});
    c.command({"XSETID", key, entries[entries.size() - 3].id});
    const auto rewind = writer_->check_streams(published);
    ASSERT_TRUE(rewind);
    EXPECT_EQ(rewind->to_string(), entries[entries.size() - 3].id);
}

namespace {

// How many times a node ran a command, from INFO commandstats.
long long calls(RedisClusterServers& servers, std::size_t node, const std::string& command) {
    auto c = servers.node(node).connect();
    auto info = c.command({"INFO", "commandstats"});
    const std::string text(reply_text(info.get()));
    const auto at = text.find("cmdstat_" + command + ":calls=");
    if (at == std::string::npos) return 0;
    return std::stoll(text.substr(at + 8 + command.size() + 7));
}

// Moves a slot, its stream (if any) with it, to another master: IMPORTING
// and MIGRATING, MIGRATE, then SETSLOT ... NODE on every node.
void move_slot(RedisClusterServers& servers, const std::string& key, std::size_t to) {
    const int slot = key_slot(key);
    const std::size_t from = servers.master_of(slot);
    const auto slot_text = std::to_string(slot);
    const auto from_id = servers.id(from), to_id = servers.id(to);
    auto source = servers.node(from).connect();
    auto target = servers.node(to).connect();
    target.command({"CLUSTER", "SETSLOT", slot_text, "IMPORTING", from_id});
    source.command({"CLUSTER", "SETSLOT", slot_text, "MIGRATING", to_id});
    source.command({"MIGRATE", "127.0.0.1", std::to_string(servers.node(to).port()), "", "0", "5000", "KEYS", key});
    for (std::size_t i = 0; i < servers.size(); ++i) {
        auto c = servers.node(i).connect();
        c.command({"CLUSTER", "SETSLOT", slot_text, "NODE", to_id});
    }
}

// The number of EVALSHA (the append script) run by every node.
long long script_calls(RedisClusterServers& servers) {
    long long n = 0;
    for (std::size_t i = 0; i < servers.size(); ++i) n += calls(servers, i, "evalsha");
    return n;
}

}  // namespace

// The fast path per slot: a batch over four streams in four slots, two of
// them on one master, goes as XADDs in one MULTI/EXEC per slot, each under
// WATCH; the look at a master's second slot rides with its first slot's
// transaction, and the next batch needs no look. No script runs.
TEST_F(ClusterWriterTest, EachSlotInATransactionOfItsOwn) {
    topics_.push_back(topic_in_slots(0, 5460, "d"));
    ASSERT_NE(stream_slot(topics_[0]), stream_slot(topics_[3]));
    std::vector<std::vector<Event>> batches;
    for (std::uint64_t b = 1; b <= 3; ++b) {
        batches.push_back(batch_at(b, 40, topics_));
        writer_->write(batches.back());
    }
    expect_exactly(batches);
    EXPECT_EQ(metrics_.transaction_batches.load(), 3u);
    EXPECT_EQ(metrics_.script_batches.load(), 0u);
    EXPECT_EQ(metrics_.events_published.load(), 120u);
    EXPECT_EQ(script_calls(*servers_), 0);
    long long exec = 0;
    for (std::size_t i = 0; i < servers_->size(); ++i) exec += calls(*servers_, i, "exec");
    EXPECT_EQ(exec, 3 * 4);  // one per slot and batch
}

// A slot moves to another master: between two batches (the stream's old
// master answers the queued XADD with MOVED, the transaction is
// discarded, and the share goes through the script to the new master),
// and while a batch is being written (whichever comes first, the
// transaction or the move, the stream gets each entry once, in order).
// The batch after goes as a transaction again, on the new master.
TEST_F(ClusterWriterTest, SlotMovedBetweenAndDuringBatches) {
    const std::string key = "outbox:" + topics_[0];
    const int slot = key_slot(key);
    const std::size_t home = servers_->master_of(slot), other = servers_->master_of(6000);
    std::vector<std::vector<Event>> batches;
    batches.push_back(batch_at(1, 30, topics_));
    writer_->write(batches.back());
    ASSERT_EQ(metrics_.transaction_batches.load(), 1u);

    move_slot(*servers_, key, other);
    batches.push_back(batch_at(2, 30, topics_));
    writer_->write(batches.back());
    EXPECT_EQ(metrics_.script_batches.load(), 1u);
    EXPECT_EQ(script_calls(*servers_), 1);  // that stream's share only
    batches.push_back(batch_at(3, 30, topics_));
    writer_->write(batches.back());
    EXPECT_EQ(metrics_.transaction_batches.load(), 2u);

    // Back to its first master while the next batch is on its way.
    batches.push_back(batch_at(4, 30, topics_));
    writer_->write(batches.back(), [&] { move_slot(*servers_, key, home); });
    expect_transactions_again(batches);
    EXPECT_EQ(servers_->master_of(slot), home);
    EXPECT_EQ(metrics_.events_already_published.load(), 0u);
}

// A slot being migrated: while its stream is still on the old master, the
// transaction runs there; once MIGRATE moved the stream, the old master
// answers ASK, and the share goes through the script (ASKING) to the
// importing node; when the migration ends, batches are transactions again.
TEST_F(ClusterWriterTest, SlotMigratingStepByStep) {
    const std::string key = "outbox:" + topics_[0];
    const int slot = key_slot(key);
    const std::size_t from = servers_->master_of(slot), to = servers_->master_of(6000);
    const auto from_id = servers_->id(from), to_id = servers_->id(to);
    const auto slot_text = std::to_string(slot);
    std::vector<std::vector<Event>> batches;
    batches.push_back(batch_at(1, 30, topics_));
    writer_->write(batches.back());

    auto source = servers_->node(from).connect();
    auto target = servers_->node(to).connect();
    target.command({"CLUSTER", "SETSLOT", slot_text, "IMPORTING", from_id});
    source.command({"CLUSTER", "SETSLOT", slot_text, "MIGRATING", to_id});
    batches.push_back(batch_at(2, 30, topics_));
    writer_->write(batches.back());
    EXPECT_EQ(metrics_.transaction_batches.load(), 2u);
    EXPECT_EQ(script_calls(*servers_), 0);

    source.command({"MIGRATE", "127.0.0.1", std::to_string(servers_->node(to).port()), "", "0", "5000", "KEYS", key});
    batches.push_back(batch_at(3, 30, topics_));
    writer_->write(batches.back());
    EXPECT_EQ(metrics_.script_batches.load(), 1u);
    EXPECT_EQ(calls(*servers_, to, "asking"), 1);

    for (std::size_t i = 0; i < servers_->size(); ++i) {
        auto c = servers_->node(i).connect();
        c.command({"CLUSTER", "SETSLOT", slot_text, "NODE", to_id});
    }
    expect_transactions_again(batches);
    EXPECT_EQ(servers_->master_of(slot), to);
}

// Someone else writes to a stream: the check of its top id finds the
// stream not as this writer left it (or WATCH sees the write before EXEC),
// and that stream's share goes through the script, which names the
// foreign entry as prev, or refuses to write below it, while the other
// slots' transactions go on.
TEST_F(ClusterWriterTest, TopIdCheckFindsForeignWrites) {
    topics_.push_back(topic_in_slots(0, 5460, "d"));
    const std::string key = "outbox:" + topics_[3];
    auto foreign_add = [&](const std::string& id, const std::string& event_id) {
        auto c = servers_->node(servers_->master_of(key_slot(key))).connect();
        c.command({"XADD", key, id, "event_id", event_id, "topic", topics_[3], "payload", "{}"});
    };
    // While the first batch's look is on its way (the stream is found
    // written, or its WATCH is): a plain XADD would name 0-0 as prev.
    std::vector<std::vector<Event>> batches;
    batches.push_back(batch_at(1, 40, topics_));
    writer_->write(batches.back(), [&] { foreign_add("0-5", "foreign-1"); });
    EXPECT_EQ(metrics_.script_batches.load(), 1u);
    auto entries = servers_->read_stream(key);
    ASSERT_EQ(entries.size(), 11u);
    EXPECT_EQ(entries[0].id, "0-5");
    EXPECT_EQ(entries[1].fields.at("prev"), "0-5");

    // Between batches, an entry at the next batch's first id of that
    // stream: nothing of the stream's share is written, the others are.
    auto second = batch_at(2, 40, topics_);
    const Event* first_d = nullptr;
    for (const auto& e : second)
        if (e.topic == topics_[3] && !first_d) first_d = &e;
    ASSERT_NE(first_d, nullptr);
    foreign_add(first_d->position, "foreign-2");
    try {
        writer_->write(second);
        FAIL() << "a foreign entry at the batch's position was skipped";
    } catch (const RedisError& e) {
        EXPECT_NE(std::string(e.what()).find("PGOUTBOX_FOREIGN " + first_d->position), std::string::npos)
            << e.what();
    }
    entries = servers_->read_stream(key);
    ASSERT_EQ(entries.size(), 12u);
    EXPECT_EQ(entries.back().fields.at("event_id"), "foreign-2");
    for (std::size_t t = 0; t < 3; ++t) {
        const auto other = servers_->read_stream("outbox:" + topics_[t]);
        ASSERT_EQ(other.size(), 20u) << topics_[t];
        EXPECT_EQ(other.back().id, "2-" + std::to_string(37 + t)) << topics_[t];
    }
}

// A stream that lost entries on its master (a failover to a replica that
// lagged) while watched: the transaction does not run, and the script
// reports the stream behind without writing to it.
TEST_F(ClusterWriterTest, StreamBehindIsNotWrittenByTheTransaction) {
    std::vector<std::vector<Event>> batches;
    batches.push_back(batch_at(1, 30, topics_));
    writer_->write(batches.back());
    const std::string key = "outbox:" + topics_[1];
    auto c = servers_->node(servers_->master_of(key_slot(key))).connect();
    const auto entries = servers_->read_stream(key);
    ASSERT_EQ(entries.size(), 10u);
    c.command({"XDEL", key, entries[9].id});
    c.command({"XSETID", key, entries[8].id});
    EXPECT_THROW(writer_->write(batch_at(2, 30, topics_)), RedisError);
    EXPECT_TRUE(writer_->take_stream_behind());
    EXPECT_EQ(servers_->read_stream(key).size(), 9u);
    EXPECT_EQ(servers_->read_stream("outbox:" + topics_[0]).size(), 20u);
}

// Masters that refuse MULTI (an ACL): found when each node is first
// connected to, and every batch goes through the script.
TEST_F(ClusterWriterTest, MultiRefusedByAnAclMeansTheScript) {
    for (std::size_t i = 0; i < servers_->size(); ++i) {
        auto c = servers_->node(i).connect();
        c.command({"ACL", "SETUSER", "default", "-multi"});
    }
    std::vector<std::vector<Event>> batches;
    for (std::uint64_t b = 1; b <= 2; ++b) {
        batches.push_back(batch_at(b, 30, topics_));
        writer_->write(batches.back());
    }
    expect_exactly(batches);
    EXPECT_EQ(metrics_.transaction_batches.load(), 0u);
    EXPECT_EQ(metrics_.script_batches.load(), 2u);
}

namespace {

// consume --pool on a cluster: a sharded group's streams spread over the
// masters, their leases and the heartbeat set each on its own key's master.
class ClusterPoolTest : public ClusterConsumeTest {
protected:
    void SetUp() override {
        ClusterConsumeTest::SetUp();
        PgConnection db(sink_, "tests");
        db.exec("CREATE TABLE keyed (seq bigserial PRIMARY KEY, event_id uuid, key text, n int)");
        db.exec(R"(CREATE FUNCTION apply_keyed(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
            RETURNS void LANGUAGE sql AS $$
                INSERT INTO keyed (event_id, key, n) VALUES (event_id, key, (payload->>'n')::int)
            $$)");
        db.exec("GRANT ALL ON keyed, keyed_seq_seq TO consumer_user");
        auto pg = connect();
        pg.exec("SELECT outbox_group_create('p', start_at => 'beginning', shards => 4)");
        for (int s = 0; s < 4; ++s)
            start_process({PG_OUTBOX_RELAY_BINARY, "publish", "--group", "p/" + std::to_string(s), "--pg",
                           pg_->conninfo("app", "relay_user"), "--redis", cluster_->url(), "--redis-timeout", "1s",
                           "--stream", "outbox:{topic}:{shard}", "--poll-interval", "50ms", "--retry-min", "20ms",
                           "--retry-max", "300ms"});
    }

    Process& start_pool_worker(const std::string& worker) {
        return start_process({PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting", "--pg",
                              pg_->conninfo("sink", "consumer_user"), "--redis", cluster_->url(), "--redis-timeout",
                              "1s", "--worker", worker, "--stream", "outbox:keyed:{shard}", "--shards", "4", "--pool",
                              "--pool-lease", "3s", "--pool-renew", "500ms", "--block", "200ms", "--batch-size", "20",
                              "--handler", "SELECT apply_keyed($1, $2, $3, $4, $5)", "--retry-min", "20ms",
                              "--retry-max", "300ms", "--log-level", "debug"});
    }

    void emit_keyed(int n) {
        auto pg = connect();
        for (int i = 0; i < n; ++i) {
            const int key = i % 12;
            pg.exec("SELECT outbox_emit('keyed', $1, jsonb_build_object('n', $2::int))",
                    {"k" + std::to_string(key), std::to_string(next_n_[key]++)});
        }
        emitted_ += n;
    }

    // The worker holding a stream's lease ("" when none), asked of the
    // cluster (redis-cli follows MOVED).
    std::string holder(int shard) {
        std::string out;
        cluster_->redis_cli({"-c", "-p", std::to_string(cluster_->node(0).port()), "GET",
                             StreamPool::lease_key("accounting", "outbox:keyed:" + std::to_string(shard))},
                            &out);
        return out.substr(0, out.find('#'));
    }

    void expect_once_in_key_order() {
        EXPECT_EQ(sink_count("SELECT count(*) FROM keyed"), emitted_);
        EXPECT_EQ(sink_count("SELECT count(DISTINCT event_id) FROM keyed"), emitted_);
        EXPECT_EQ(sink_count("SELECT count(*) FROM (SELECT n, row_number() OVER (PARTITION BY key ORDER BY seq) - 1 "
                             "AS rn FROM keyed) x WHERE n <> rn"),
                  0)
            << "events of a key applied out of emit order";
    }

    long long emitted_ = 0;
    std::map<int, int> next_n_;
};

}  // namespace

// Two pool workers share the four shard streams, two each; one is killed
// and the other takes its streams over: each key's events apply once and
// in order throughout.
TEST_F(ClusterPoolTest, WorkersShareShardStreamsAcrossMasters) {
    auto& w1 = start_pool_worker("w1");
    auto& w2 = start_pool_worker("w2");
    emit_keyed(200);
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM keyed") >= emitted_; }, 60s, 200ms))
        << w1.log();
    ASSERT_TRUE(eventually(
        [&] {
            std::map<std::string, int> per_worker;
            for (int s = 0; s < 4; ++s) per_worker[holder(s)]++;
            return per_worker == std::map<std::string, int>{{"w1", 2}, {"w2", 2}};
        },
        30s));
    w1.signal(SIGKILL);
    emit_keyed(200);
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM keyed") >= emitted_; }, 60s, 200ms))
        << w2.log();
    ASSERT_TRUE(eventually(
        [&] {
            for (int s = 0; s < 4; ++s)
                if (holder(s) != "w2") return false;
            return true;
        },
        30s));
    expect_once_in_key_order();
    EXPECT_TRUE(w2.running()) << w2.log();
}

// Parked keys on a cluster: two streams on two slots (two masters), each
// with keys A and B interleaved, A's second event failing. A parks on
// each stream (a key is per stream) while B applies; the parks, the
// drain and the redrive are PostgreSQL's, so nothing new is asked of
// Redis: after the fix, inbox_redrive applies A's events in order on both
// streams.
TEST_F(ClusterConsumeTest, ParkedKeysRedriveInOrderOnEachSlot) {
    {
        PgConnection db(sink_, "tests");
        db.exec("CREATE TABLE ledger (seq bigserial PRIMARY KEY, stream text, key text, n int)");
        db.exec("CREATE TABLE broken (why text)");
        db.exec("INSERT INTO broken VALUES ('bug')");
        db.exec(R"(CREATE OR REPLACE FUNCTION apply_event(topic text, key text, payload jsonb, headers jsonb,
                                                          event_id uuid)
            RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM broken b WHERE b.why = payload->>'fail') THEN
                    RAISE EXCEPTION 'handler refuses event % of key %', payload->>'n', key;
                END IF;
                INSERT INTO ledger (stream, key, n) VALUES (topic, key, (payload->>'n')::int);
            END $$)");
        db.exec("GRANT ALL ON ledger, ledger_seq_seq, broken TO consumer_user");
    }
    const std::vector<std::string> streams{"{h}:ledger", "{x}:ledger"};
    ASSERT_NE(key_slot(streams[0]), key_slot(streams[1]));
    for (const auto& stream : streams) {
        auto c = cluster_->node(cluster_->master_of(key_slot(stream))).connect();
        for (int n = 1; n <= 4; ++n)
            for (const char* key : {"A", "B"}) {
                const std::string uuid = "00000000-0000-4000-8000-" + std::string(8, '0') +
                                         std::to_string(1000 + (stream == streams[0] ? 0 : 100) + n * 2 +
                                                        (key[0] == 'A' ? 0 : 1));
                const bool fail = key[0] == 'A' && n == 2;
                auto r = c.command({"XADD", stream, "*", "event_id", uuid, "topic", stream, "key", key, "payload",
                                    "{\"n\": " + std::to_string(n) + (fail ? ", \"fail\": \"bug\"}" : "}")});
                ASSERT_NE(r->type, REDIS_REPLY_ERROR) << reply_text(r.get());
            }
    }
    auto& consumer = start_consumer(streams, {"--on-failure", "park-key", "--max-deliveries", "1"});
    auto applied = [&](const std::string& stream, const std::string& key) {
        PgConnection db(sink_, "tests");
        return query_column(db, "SELECT coalesce(string_agg(n::text, ' ' ORDER BY seq), '') FROM ledger "
                                "WHERE stream = $1 AND key = $2",
                            {stream, key})[0];
    };
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.parked_keys WHERE state = 'dead'") == 2 &&
                   applied(streams[0], "B") == "1 2 3 4" && applied(streams[1], "B") == "1 2 3 4";
        },
        30s, 100ms))
        << consumer.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_entries"), 4);
    for (const auto& stream : streams) EXPECT_EQ(applied(stream, "A"), "1") << stream;
    {
        PgConnection db(sink_, "tests");
        db.exec("DELETE FROM broken");
        EXPECT_EQ(query_column(db, "SELECT string_agg(result, ' ') FROM inbox_redrive('accounting', 'A')")[0],
                  "requested requested");
    }
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.parked_keys") == 0; }, 30s, 100ms))
        << consumer.log();
    for (const auto& stream : streams) EXPECT_EQ(applied(stream, "A"), "1 2 3 4") << stream;
    EXPECT_TRUE(consumer.running()) << consumer.log();
}
