// The Redis write paths of publish mode, on a throwaway Redis and without
// PostgreSQL: a StreamWriter given batches as a fetch would decode them.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/redis_target.hpp"
#include "pg_outbox/stream_writer.hpp"
#include "servers.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

// An event at position "major-minor" on a topic, as a fetch decodes it.
Event event(std::uint64_t major, std::uint64_t minor, const std::string& topic, std::size_t pad = 0) {
    Event e;
    e.parsed = Position{major, minor};
    e.position = e.parsed.to_string();
    e.event_id = "event-" + e.position;
    e.topic = topic;
    e.key = "k" + std::to_string(minor);
    e.payload = "{\"pad\": \"" + std::string(pad, 'x') + "\"}";
    e.created_at = "2026-12-01T00:00:00.000000Z";
    return e;
}

// Events at positions major-1 ... major-n, on topics in turn.
std::vector<Event> batch(std::uint64_t major, std::size_t n, const std::vector<std::string>& topics,
                         std::size_t pad = 0) {
    std::vector<Event> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(event(major, i + 1, topics[i % topics.size()], pad));
    return out;
}

const std::vector<std::string> kThree{"orders", "payments", "audit"};

class StreamWriterTest : public ::testing::Test {
protected:
    void SetUp() override {
        config_.group = "g";
        config_.retry_min = 20ms;
        redis_ = std::make_unique<RedisServer>();
    }

    // A writer on a connection of its own, as a relay's.
    struct Writer {
        Writer(const Config& config, const RedisServer& server)
            : target(server.connect()), writer(config, metrics, stop) {
            writer.reset(target);
        }
        Metrics metrics{"publish", "g"};
        std::atomic<bool> stop{false};
        RedisNode target;
        StreamWriter writer;
    };

    std::unique_ptr<Writer> writer() { return std::make_unique<Writer>(config_, *redis_); }

    // Every stream of these topics holds exactly the events of these
    // batches, each once, with its position as id and its own event id,
    // in feed order.
    void expect_exactly(const std::vector<std::vector<Event>>& batches, const std::vector<std::string>& topics) {
        auto redis = redis_->connect();
        for (const auto& topic : topics) {
            std::vector<std::string> want;
            for (const auto& b : batches)
                for (const auto& e : b)
                    if (e.topic == topic) want.push_back(e.position + " " + e.event_id);
            std::vector<std::string> got;
            std::string prev = "0-0";  // each entry names the one before it
            for (const auto& entry : read_stream(redis, "outbox:" + topic)) {
                got.push_back(entry.id + " " + entry.fields.at("event_id"));
                EXPECT_EQ(entry.fields.count("prev") ? entry.fields.at("prev") : "(none)", prev) << entry.id;
                prev = entry.id;
            }
            EXPECT_EQ(got, want) << topic;
        }
    }

    std::int64_t used_memory() {
        auto redis = redis_->connect();
        auto r = redis.command({"INFO", "memory"});
        const std::string info(reply_text(r.get()));
        return std::stoll(info.substr(info.find("used_memory:") + 12));
    }

    Config config_;
    std::unique_ptr<RedisServer> redis_;
};

}  // namespace

// A batch spanning three streams: each stream gets its share, with the
// positions as ids, in feed order; write() returns each stream's last
// position. The first batch of a connection takes the fast path.
TEST_F(StreamWriterTest, BatchAcrossThreeStreamsInOrder) {
    auto w = writer();
    const auto first = batch(100, 30, kThree);
    const auto written = w->writer.write(first);
    EXPECT_EQ(written.size(), 3u);
    EXPECT_EQ(written.at("outbox:orders"), "100-28");
    EXPECT_EQ(written.at("outbox:payments"), "100-29");
    EXPECT_EQ(written.at("outbox:audit"), "100-30");
    const auto second = batch(101, 7, kThree);
    EXPECT_EQ(w->writer.write(second).at("outbox:orders"), "101-7");
    expect_exactly({first, second}, kThree);
    EXPECT_EQ(w->metrics.events_published, 37u);
    EXPECT_EQ(w->metrics.events_already_published, 0u);
    EXPECT_EQ(w->metrics.transaction_batches, 2u);
    EXPECT_EQ(w->metrics.script_batches, 0u);
}

// Topics routed to one stream by the template share it, in feed order.
TEST_F(StreamWriterTest, TopicsSharingAStream) {
    config_.stream_template = "{group}:all";
    auto w = writer();
    const auto b = batch(7, 12, kThree);
    EXPECT_EQ(w->writer.write(b).at("g:all"), "7-12");
    auto redis = redis_->connect();
    const auto entries = read_stream(redis, "g:all");
    ASSERT_EQ(entries.size(), b.size());
    for (std::size_t i = 0; i < b.size(); ++i) EXPECT_EQ(entries[i].id, b[i].position);
}

// Another leader wrote the first part of the batch (on every stream)
// before it lost the group: the script skips those entries one by one,
// counts each once as already published, and appends the rest after them.
TEST_F(StreamWriterTest, PartWrittenByAnotherLeaderIsSkippedEntryByEntry) {
    const auto b = batch(200, 60, kThree);
    {
        auto other = writer();
        other->writer.write(std::span<const Event>(b).first(21));
    }
    auto w = writer();
    w->writer.write(b);
    expect_exactly({b}, kThree);
    EXPECT_EQ(w->metrics.events_already_published, 21u);
    EXPECT_EQ(w->metrics.events_published, 39u);
    EXPECT_EQ(w->metrics.script_batches, 1u);
    // The fast path again once the streams are as this writer left them.
    const auto next = batch(201, 9, kThree);
    w->writer.write(next);
    expect_exactly({b, next}, kThree);
    EXPECT_EQ(w->metrics.transaction_batches, 1u);
    EXPECT_EQ(w->metrics.events_already_published, 21u);
}

// A stream written by someone else while it is watched between two
// batches (here another leader writing this batch's first entry): EXEC
// writes nothing, and the script appends the batch, skipping that entry.
TEST_F(StreamWriterTest, ForeignWriteUnderWatchFallsBackToTheScript) {
    auto w = writer();
    const auto first = batch(300, 6, kThree);
    w->writer.write(first);
    ASSERT_EQ(w->metrics.transaction_batches, 1u);
    const auto second = batch(301, 6, kThree);
    {
        auto foreign = redis_->connect();
        const auto key = "outbox:" + second[0].topic;
        const auto top = foreign.command({"XREVRANGE", key, "+", "-", "COUNT", "1"});
        const std::string prev(reply_text(top->element[0]->element[0]));
        std::vector<std::string_view> argv;
        EntryFields fields;
        xadd_argv(argv, key, second[0], prev, {}, fields);
        foreign.command(argv);
    }
    w->writer.write(second);
    expect_exactly({first, second}, kThree);
    EXPECT_EQ(w->metrics.transaction_batches, 1u);
    EXPECT_EQ(w->metrics.script_batches, 1u);
    EXPECT_EQ(w->metrics.events_already_published, 1u);
    EXPECT_EQ(w->metrics.events_published, 11u);
}

// Redis without room for the whole batch: the batch goes in halves (and
// smaller) parts, and every stream still gets its entries in feed order,
// each once.
TEST_F(StreamWriterTest, OomHalvingKeepsOrder) {
    auto admin = redis_->connect();
    admin.command({"CONFIG", "SET", "maxmemory-policy", "noeviction"});
    admin.command({"CONFIG", "SET", "maxmemory", "2mb"});
    const std::string piece(16 * 1024, 'f');
    for (int i = 0; used_memory() < 1500 * 1024; ++i) admin.command({"SET", "filler:" + std::to_string(i), piece});
    auto w = writer();
    const auto b = batch(400, 360, kThree, 500);
    w->writer.write(b);
    expect_exactly({b}, kThree);
    EXPECT_GT(w->metrics.transaction_batches + w->metrics.script_batches, 1u) << "written in one part";
    EXPECT_FALSE(w->metrics.redis_oom);
    EXPECT_EQ(w->metrics.events_published, 360u);
}

// Redis lost a stream's entries (FLUSHALL): the next batch writes nothing
// to it and fails, and the writer asks for the streams to be checked; the
// check says where the group must rewind to, and what Redis holds is what
// the writer expects from then on.
TEST_F(StreamWriterTest, LostEntriesStopTheWriteUntilTheStreamsAreChecked) {
    auto w = writer();
    const auto first = batch(500, 6, kThree);
    const auto written = w->writer.write(first);
    redis_->connect().command({"FLUSHALL"});
    EXPECT_FALSE(w->writer.take_stream_behind());
    const auto second = batch(501, 6, kThree);
    EXPECT_THROW(w->writer.write(second), RedisError);
    EXPECT_TRUE(w->writer.take_stream_behind());
    EXPECT_FALSE(w->writer.take_stream_behind()) << "asked once";
    expect_exactly({}, kThree);
    std::map<std::string, Position> published;
    for (const auto& [stream, last] : written) published[stream] = *Position::parse(last);
    const auto rewind_to = w->writer.check_streams(published);
    ASSERT_TRUE(rewind_to);
    EXPECT_EQ(*rewind_to, Position{});
    // Republished from the rewound cursor, then on.
    w->writer.write(first);
    w->writer.write(second);
    expect_exactly({first, second}, kThree);
    EXPECT_FALSE(w->writer.check_streams(published)) << "nothing behind";
}
