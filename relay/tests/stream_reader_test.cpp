// The Redis side of consume mode, on a throwaway Redis and without
// PostgreSQL: a StreamReader's group creation, reads with their gap
// checks, claims, trim reports and acknowledgements.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/stream_reader.hpp"
#include "servers.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

class StreamReaderTest : public ::testing::Test {
protected:
    void SetUp() override {
        config_.consumer = "accounting";
        config_.consumer_group = "accounting";
        config_.streams = {"in:a", "in:b"};
        config_.block = 10ms;
        config_.consume_batch_size = 100;
        redis_ = std::make_unique<RedisServer>();
        admin_ = std::make_unique<RedisConnection>(redis_->connect());
    }

    // A reader for a worker, on a connection of its own, as a relay's.
    struct Reader {
        Reader(const Config& config, const RedisServer& server)
            : connection(server.connect()), reader(config, metrics, stop) {
            reader.reset(&connection);
        }
        Metrics metrics{"consume", "accounting", 0ms, "accounting"};
        std::atomic<bool> stop{false};
        RedisNode connection;
        StreamReader reader;
    };

    std::unique_ptr<Reader> reader(const std::string& worker) {
        config_.worker = worker;
        return std::make_unique<Reader>(config_, *redis_);
    }

    // Appends an entry with this id, as a relay does when "prev" is given.
    void add(const std::string& stream, const std::string& id, const std::string& prev = "") {
        std::vector<std::string_view> argv{"XADD", stream, id, "event_id", id, "topic", "t"};
        if (!prev.empty()) {
            argv.emplace_back("prev");
            argv.emplace_back(prev);
        }
        admin_->command(argv);
    }

    // The ids a read returns, and the gaps it reports.
    struct Read {
        std::vector<std::string> ids;
        std::vector<Gap> gaps;
    };
    Read read(Reader& r) {
        Read out;
        for (const auto& e : r.reader.read(config_.streams, [&](const Gap& g) { out.gaps.push_back(g); }))
            out.ids.push_back(e.stream + " " + e.id);
        return out;
    }

    // How many entries of the stream are pending for the group.
    long long pending(const std::string& stream) {
        auto r = admin_->command({"XPENDING", stream, "accounting"});
        return r->element[0]->integer;
    }

    Config config_;
    std::unique_ptr<RedisServer> redis_;
    std::unique_ptr<RedisConnection> admin_;
};

}  // namespace

// The group is created on each stream (and the stream with it) from
// --start-id; a group that exists already is kept as it is.
TEST_F(StreamReaderTest, EnsureGroupsCreatesMissingGroupsAndKeepsExistingOnes) {
    add("in:a", "5-1");
    admin_->command({"XGROUP", "CREATE", "in:a", "accounting", "$"});
    auto r = reader("w1");
    r->reader.ensure_groups();
    r->reader.ensure_groups();  // once per connection: nothing sent again
    auto groups = admin_->command({"XINFO", "GROUPS", "in:b"});
    ASSERT_EQ(groups->elements, 1u);
    EXPECT_EQ(reply_text(map_field(groups->element[0], "name")), "accounting");
    // The existing group was not moved back to --start-id.
    EXPECT_TRUE(read(*r).ids.empty());
    add("in:b", "6-1");
    EXPECT_EQ(read(*r).ids, (std::vector<std::string>{"in:b 6-1"}));
}

// A group that cannot be created (the key holds something else) is a
// Redis error naming the command and the stream.
TEST_F(StreamReaderTest, EnsureGroupsOnAKeyThatIsNoStreamThrows) {
    admin_->command({"SET", "in:b", "text"});
    auto r = reader("w1");
    try {
        r->reader.ensure_groups();
        FAIL() << "no error";
    } catch (const RedisError& e) {
        EXPECT_NE(std::string(e.what()).find("XGROUP CREATE in:b: WRONGTYPE"), std::string::npos) << e.what();
    }
}

// New entries of every stream come with their fields, each stream's in
// order; they are pending until acknowledged, and an acknowledgement
// rides with the next command.
TEST_F(StreamReaderTest, ReadReturnsNewEntriesThatStayPendingUntilAcknowledged) {
    auto r = reader("w1");
    r->reader.ensure_groups();
    EXPECT_TRUE(read(*r).ids.empty());  // nothing yet: waits --block
    add("in:a", "1-1", "0-0");
    add("in:b", "1-2", "0-0");
    add("in:a", "1-3", "1-1");
    std::vector<StreamEntry> entries;
    std::vector<Gap> gaps;
    entries = r->reader.read(config_.streams, [&](const Gap& g) { gaps.push_back(g); });
    ASSERT_EQ(entries.size(), 3u);
    EXPECT_TRUE(gaps.empty());
    EXPECT_EQ(entries[0].stream + " " + entries[0].id, "in:a 1-1");
    EXPECT_EQ(entries[1].stream + " " + entries[1].id, "in:a 1-3");
    EXPECT_EQ(entries[2].stream + " " + entries[2].id, "in:b 1-2");
    EXPECT_EQ(*entries[1].field("prev"), "1-1");
    EXPECT_EQ(*entries[1].field("event_id"), "1-3");
    EXPECT_EQ(entries[1].deliveries, 1);
    EXPECT_EQ(pending("in:a"), 2);
    EXPECT_TRUE(read(*r).ids.empty());  // read once

    r->reader.ack({&entries[0], &entries[2]});
    EXPECT_EQ(r->reader.oldest_pending_idle("in:b"), 0);  // the next command: the acknowledgement's reply read
    EXPECT_EQ(pending("in:a"), 1);
    EXPECT_EQ(pending("in:b"), 0);
}

// A read without waiting (the worker has parked keys to drain) returns
// none at once when nothing is new: no XREAD BLOCK is sent; with entries,
// it reads them as any read does.
TEST_F(StreamReaderTest, ReadWithoutWaitingSendsNoBlockingXread) {
    auto r = reader("w1");
    r->reader.ensure_groups();
    auto xreads = [&] {
        auto info = admin_->command({"INFO", "commandstats"});
        const std::string text(reply_text(info.get()));
        const auto at = text.find("cmdstat_xread:calls=");
        return at == std::string::npos ? 0L : std::stol(text.substr(at + 20));
    };
    const auto before = xreads();
    auto none = r->reader.read(config_.streams, [](const Gap&) {}, false);
    EXPECT_TRUE(none.empty());
    EXPECT_EQ(xreads(), before);
    EXPECT_TRUE(read(*r).ids.empty());  // waits --block: one XREAD
    EXPECT_EQ(xreads(), before + 1);
    add("in:a", "1-1", "0-0");
    auto one = r->reader.read(config_.streams, [](const Gap&) {}, false);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0].id, "1-1");
}

// An entry whose prev is beyond the group's last entry read reveals a
// gap: handed over, counted and logged, and the entries are returned.
// Entries missing after the last one read are found by the read that
// follows, from the group's position read with it.
TEST_F(StreamReaderTest, ReadReportsGapsFromPrev) {
    auto r = reader("w1");
    r->reader.ensure_groups();
    add("in:a", "1-1", "0-0");
    EXPECT_EQ(read(*r).ids.size(), 1u);
    add("in:a", "1-5", "1-4");  // 1-2 ... 1-4 never reached the stream
    add("in:b", "2-1");         // no prev: not checked
    const auto got = read(*r);
    EXPECT_EQ(got.ids, (std::vector<std::string>{"in:a 1-5", "in:b 2-1"}));
    ASSERT_EQ(got.gaps.size(), 1u);
    EXPECT_EQ(got.gaps[0].stream, "in:a");
    EXPECT_EQ(got.gaps[0].range(), "(1-1 1-4]");
    EXPECT_EQ(got.gaps[0].found, "1-5");
    EXPECT_NE(got.gaps[0].reason().find("entry 1-5 names 1-4 as the entry before it"), std::string::npos);
    EXPECT_NE(r->metrics.render().find("pg_outbox_relay_gaps_total{mode=\"consume\",consumer=\"accounting\","
                                       "group=\"accounting\",stream=\"in:a\"} 1"),
              std::string::npos)
        << r->metrics.render();
}

// Another worker's pending entries idle long enough are claimed in id
// order with their delivery counts (the claim's own included); entries
// deleted from the stream while pending come back as deleted ids, once.
TEST_F(StreamReaderTest, ClaimTakesIdleEntriesWithDeliveriesAndReportsDeletedOnes) {
    auto dead = reader("dead");
    dead->reader.ensure_groups();
    for (const auto* id : {"1-1", "1-2", "1-3"}) add("in:a", id);
    ASSERT_EQ(read(*dead).ids.size(), 3u);
    admin_->command({"XDEL", "in:a", "1-2"});

    auto r = reader("w1");
    // Deleted entries are reported whatever their idle time, and dropped
    // from the pending list: reported once.
    auto early = r->reader.claim("in:a", "3600000", "0-0");
    ASSERT_TRUE(early);
    EXPECT_TRUE(early->entries.empty());  // not idle for an hour
    EXPECT_EQ(early->deleted, (std::vector<std::string>{"1-2"}));
    auto page = r->reader.claim("in:a", "0", "0-0");
    ASSERT_TRUE(page);
    EXPECT_EQ(page->cursor, "0-0");
    ASSERT_EQ(page->entries.size(), 2u);
    EXPECT_EQ(page->entries[0].id, "1-1");
    EXPECT_EQ(page->entries[1].id, "1-3");
    EXPECT_EQ(*page->entries[1].field("event_id"), "1-3");
    EXPECT_TRUE(page->deleted.empty());
    r->reader.count_deliveries("in:a", page->entries);
    EXPECT_EQ(page->entries[0].deliveries, 2);
    EXPECT_EQ(page->entries[1].deliveries, 2);
    EXPECT_EQ(r->metrics.entries_reclaimed, 2u);

    // Released, an entry's delivery goes back to what it was before.
    r->reader.release(page->entries[0]);
    auto p = admin_->command({"XPENDING", "in:a", "accounting", "-", "+", "10"});
    ASSERT_EQ(p->elements, 2u);
    EXPECT_EQ(reply_text(p->element[0]->element[1]), "w1");
    EXPECT_EQ(p->element[0]->element[3]->integer, 1);
}

// Pages of --consume-batch-size: the cursor goes on where the page ended.
TEST_F(StreamReaderTest, ClaimGoesByPages) {
    config_.consume_batch_size = 2;
    auto dead = reader("dead");
    dead->reader.ensure_groups();
    for (const auto* id : {"1-1", "1-2", "1-3"}) add("in:a", id);
    ASSERT_EQ(read(*dead).ids.size(), 2u);
    ASSERT_EQ(read(*dead).ids.size(), 1u);
    auto r = reader("w1");
    auto first = r->reader.claim("in:a", "0", "0-0");
    ASSERT_EQ(first->entries.size(), 2u);
    EXPECT_EQ(first->cursor, "1-3");
    auto second = r->reader.claim("in:a", "0", first->cursor);
    ASSERT_EQ(second->entries.size(), 1u);
    EXPECT_EQ(second->entries[0].id, "1-3");
    EXPECT_EQ(second->cursor, "0-0");
}

// Entries trimmed before the group read them are found by Redis's counts
// as one range; once skipped, the range is not found again, and the read
// goes on from the first entry left.
TEST_F(StreamReaderTest, TrimmedUnreadRangeIsFoundOnceSkipped) {
    auto r = reader("w1");
    r->reader.ensure_groups();
    add("in:a", "1-1");
    ASSERT_EQ(read(*r).ids.size(), 1u);
    for (const auto* id : {"1-2", "1-3", "1-4", "1-5", "1-6"}) add("in:a", id);
    EXPECT_FALSE(r->reader.trimmed_unread("in:a"));  // nothing lost
    admin_->command({"XTRIM", "in:a", "MAXLEN", "2"});
    const auto trimmed = r->reader.trimmed_unread("in:a");
    ASSERT_TRUE(trimmed);
    EXPECT_EQ(trimmed->stream, "in:a");
    EXPECT_EQ(trimmed->lost, 3);
    EXPECT_EQ(trimmed->range(), "(1-1 1-5)");
    EXPECT_EQ(trimmed->reason(),
              "3 entries with ids after 1-1 and before 1-5 were trimmed from the stream before this consumer group "
              "read them");
    r->reader.skip_trimmed(*trimmed);
    EXPECT_FALSE(r->reader.trimmed_unread("in:a"));
    const auto got = read(*r);
    EXPECT_EQ(got.ids, (std::vector<std::string>{"in:a 1-5", "in:a 1-6"}));
    EXPECT_TRUE(got.gaps.empty());
    // A stream that does not exist tells nothing.
    EXPECT_FALSE(r->reader.trimmed_unread("in:none"));
}

// A worker's oldest pending entry's idle time; 0 with none pending.
TEST_F(StreamReaderTest, OldestPendingIdle) {
    auto r = reader("w1");
    r->reader.ensure_groups();
    EXPECT_EQ(r->reader.oldest_pending_idle("in:a"), 0);
    add("in:a", "1-1");
    ASSERT_EQ(read(*r).ids.size(), 1u);
    EXPECT_TRUE(eventually([&] { return r->reader.oldest_pending_idle("in:a") > 0; }, 10s, 5ms));
}

// Redis refusing XINFO (an ACL): the read goes on without the group's
// position, and gaps are not checked.
TEST_F(StreamReaderTest, ReadWithoutXinfoChecksNoGaps) {
    auto r = reader("w1");
    r->reader.ensure_groups();
    admin_->command({"ACL", "SETUSER", "default", "-xinfo"});
    add("in:a", "1-1", "0-0");
    add("in:a", "1-5", "1-4");
    // The transaction refused, nothing ran: the read goes again at once,
    // without the group's position.
    const auto got = read(*r);
    EXPECT_EQ(got.ids, (std::vector<std::string>{"in:a 1-1", "in:a 1-5"}));
    EXPECT_TRUE(got.gaps.empty());
}

// Redis refusing MULTI (an ACL, a proxy): the group's position and the
// read go as two commands, and gaps are still found.
TEST_F(StreamReaderTest, ReadWithoutMultiStillFindsGaps) {
    auto r = reader("w1");
    r->reader.ensure_groups();
    admin_->command({"ACL", "SETUSER", "default", "-multi", "-exec"});
    add("in:a", "1-1", "0-0");
    EXPECT_EQ(read(*r).ids, std::vector<std::string>{"in:a 1-1"});
    add("in:a", "1-5", "1-4");
    const auto got = read(*r);
    EXPECT_EQ(got.ids, std::vector<std::string>{"in:a 1-5"});
    ASSERT_EQ(got.gaps.size(), 1u);
    EXPECT_EQ(got.gaps[0].range(), "(1-1 1-4]");
}

// A read of a stream whose group is gone (deleted behind the relay's
// back) is a Redis error naming XREADGROUP; the groups are made again
// after the next reset().
TEST_F(StreamReaderTest, ReadOfAMissingGroupThrowsUntilTheGroupsAreMadeAgain) {
    auto r = reader("w1");
    r->reader.ensure_groups();
    admin_->command({"XGROUP", "DESTROY", "in:b", "accounting"});
    try {
        read(*r);
        FAIL() << "no error";
    } catch (const RedisError& e) {
        EXPECT_NE(std::string(e.what()).find("XREADGROUP: NOGROUP"), std::string::npos) << e.what();
    }
    r->reader.reset(&r->connection);
    r->reader.ensure_groups();
    add("in:b", "1-1");
    EXPECT_EQ(read(*r).ids, std::vector<std::string>{"in:b 1-1"});
}
