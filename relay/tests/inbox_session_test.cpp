// The PostgreSQL side of consume mode, on a throwaway PostgreSQL and
// without Redis: an InboxSession's settings checks, its batches applied
// through inbox_consume(), the isolate fallback, held entries and dead
// letters, with a sink that records what the session settles and holds.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/extension.hpp"
#include "pg_outbox/inbox_session.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/pg.hpp"
#include "servers.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;

namespace {

const char* const kHandler = "SELECT apply_event($1, $2, $3, $4, $5)";

// What the session handed to its caller.
struct Recorder : EntrySink {
    void settled(const std::vector<const StreamEntry*>& entries) override {
        for (const auto* e : entries) settled_ids.push_back(e->id);
    }
    void held(const StreamEntry& e, std::string_view sqlstate, std::string_view message) override {
        held_ids.push_back(e.id + " " + std::string(sqlstate));
        last_message = std::string(message);
    }
    std::vector<std::string> settled_ids;
    std::vector<std::string> held_ids;
    std::string last_message;
};

std::vector<std::string> ids(const std::vector<const StreamEntry*>& entries) {
    std::vector<std::string> out;
    for (const auto* e : entries) out.push_back(e->id);
    return out;
}

class InboxSessionTest : public ::testing::Test {
protected:
    void SetUp() override {
        pg_ = std::make_unique<PgServer>();
        sink_ = pg_->create_database("sink");
        auto db = admin();
        db.exec("CREATE ROLE consumer_user LOGIN IN ROLE outbox_consumer");
        db.exec("CREATE TABLE projection (event_id uuid, topic text, key text, n int)");
        db.exec("CREATE TABLE fail_keys (key text PRIMARY KEY)");
        db.exec(R"(CREATE FUNCTION apply_event(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
            RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM fail_keys f WHERE f.key = apply_event.key) THEN
                    RAISE EXCEPTION 'handler refuses key %', key;
                END IF;
                INSERT INTO projection VALUES (event_id, topic, key, (payload->>'n')::int);
            END $$)");
        db.exec("GRANT ALL ON projection, fail_keys TO consumer_user");
        db.exec("SELECT inbox_consumer_create('accounting', 'consumer_user')");
        config_.consumer = "accounting";
        config_.streams = {"in:a"};
        config_.handler = kHandler;
        config_.max_deliveries = 3;
    }

    PgConnection admin() { return PgConnection(sink_, "tests"); }

    // A session on a connection of its own, set up as the relay's.
    struct Session {
        Session(const Config& config, const std::string& conninfo)
            : pg(conninfo, "pg_outbox_relay consume accounting"), session(config, metrics, sink) {
            pg.pin_settings(true);
            extension = use_extension(pg, SearchPath::keep);
            session.connected(pg, extension);
        }
        Metrics metrics{"consume", "accounting"};
        Recorder sink;
        PgConnection pg;
        Extension extension;
        InboxSession session;
    };

    std::unique_ptr<Session> session() {
        return std::make_unique<Session>(config_, pg_->conninfo("sink", "consumer_user"));
    }

    // An entry as a relay writes it: event id n (a uuid), key "k<n>".
    static StreamEntry entry(int n) {
        StreamEntry e;
        e.stream = "in:a";
        e.id = "1-" + std::to_string(n);
        char uuid[37];
        std::snprintf(uuid, sizeof uuid, "00000000-0000-4000-8000-%012d", n);
        e.fields = {{"event_id", uuid},
                    {"topic", "orders"},
                    {"key", "k" + std::to_string(n)},
                    {"payload", "{\"n\": " + std::to_string(n) + "}"}};
        return e;
    }

    long long count(const std::string& sql) {
        auto db = admin();
        return std::stoll(query_column(db, sql)[0]);
    }

    Config config_;
    std::unique_ptr<PgServer> pg_;
    std::string sink_;
};

}  // namespace

// A batch applies in one call; the same entries again are duplicates,
// settled all the same; nothing goes through the sink.
TEST_F(InboxSessionTest, AppliesABatchAndSettlesDuplicates) {
    auto s = session();
    const std::vector<StreamEntry> entries{entry(1), entry(2), entry(3)};
    const std::vector<const StreamEntry*> call{&entries[0], &entries[1], &entries[2]};
    std::vector<const StreamEntry*> done;
    s->session.apply(call, done);
    EXPECT_EQ(ids(done), (std::vector<std::string>{"1-1", "1-2", "1-3"}));
    EXPECT_EQ(count("SELECT count(*) FROM projection"), 3);
    EXPECT_EQ(s->metrics.events_applied, 3u);
    done.clear();
    s->session.apply(call, done);
    EXPECT_EQ(done.size(), 3u);
    EXPECT_EQ(s->metrics.events_duplicate, 3u);
    EXPECT_EQ(count("SELECT count(*) FROM projection"), 3);
    EXPECT_TRUE(s->sink.settled_ids.empty());
    EXPECT_TRUE(s->sink.held_ids.empty());
}

// A batch whose handler raises for one entry applies again entry by entry
// (isolate): the others are settled through the sink after their commit;
// the failing one stays pending (neither settled nor held) until its
// last delivery, when it is dead-lettered and settled.
TEST_F(InboxSessionTest, BatchFailingAsOneIsAppliedEntryByEntry) {
    admin().exec("INSERT INTO fail_keys VALUES ('k2')");
    auto s = session();
    std::vector<StreamEntry> entries{entry(1), entry(2), entry(3)};
    std::vector<const StreamEntry*> done;
    s->session.apply({&entries[0], &entries[1], &entries[2]}, done);
    EXPECT_TRUE(done.empty());
    EXPECT_EQ(s->sink.settled_ids, (std::vector<std::string>{"1-1", "1-3"}));
    EXPECT_TRUE(s->sink.held_ids.empty());
    EXPECT_EQ(s->metrics.batches_isolated, 1u);
    EXPECT_EQ(s->metrics.events_failed, 1u);
    EXPECT_EQ(count("SELECT count(*) FROM projection"), 2);
    EXPECT_EQ(count("SELECT count(*) FROM outbox.dead_letters"), 0);

    entries[1].deliveries = 3;  // --max-deliveries
    s->session.apply({&entries[1]}, done);
    EXPECT_TRUE(done.empty());  // settled by the isolated part's commit
    EXPECT_EQ(s->sink.settled_ids, (std::vector<std::string>{"1-1", "1-3", "1-2"}));
    EXPECT_EQ(s->metrics.batches_isolated, 2u);
    EXPECT_EQ(s->metrics.dead_letters, 1u);
    EXPECT_EQ(count("SELECT count(*) FROM outbox.dead_letters WHERE entry_id = '1-2' AND deliveries = 3 AND "
                    "reason LIKE '%handler refuses key k2%' AND sqlstate = 'P0001'"),
              1);
}

// A fault of the configuration (the handler lost a privilege) holds every
// entry of the batch with its SQLSTATE: nothing is settled or
// dead-lettered.
TEST_F(InboxSessionTest, ConfigurationFaultHoldsTheEntries) {
    auto s = session();
    admin().exec("REVOKE ALL ON projection FROM consumer_user");
    const std::vector<StreamEntry> entries{entry(1), entry(2)};
    std::vector<const StreamEntry*> done;
    s->session.apply({&entries[0], &entries[1]}, done);
    EXPECT_TRUE(done.empty());
    EXPECT_TRUE(s->sink.settled_ids.empty());
    EXPECT_EQ(s->sink.held_ids, (std::vector<std::string>{"1-1 42501", "1-2 42501"}));
    EXPECT_NE(s->sink.last_message.find("permission denied"), std::string::npos) << s->sink.last_message;
    EXPECT_EQ(count("SELECT count(*) FROM outbox.dead_letters"), 0);
}

// An entry the session is told is malformed is dead-lettered with its raw
// fields and settled into "done"; a dead letter for a range (no fields)
// records NULL fields.
TEST_F(InboxSessionTest, MalformedEntriesAndRangesAreDeadLettered) {
    auto s = session();
    StreamEntry bad = entry(7);
    bad.fields.emplace_back("topic", "again");
    std::vector<const StreamEntry*> done;
    s->session.malformed(bad, "field \"topic\" appears 2 times in the entry", "22023", done);
    EXPECT_EQ(ids(done), std::vector<std::string>{"1-7"});
    EXPECT_EQ(s->metrics.entries_malformed, 1u);
    EXPECT_EQ(count("SELECT count(*) FROM outbox.dead_letters WHERE entry_id = '1-7' AND sqlstate = '22023' AND "
                    "reason = 'malformed entry: field \"topic\" appears 2 times in the entry' AND "
                    "cardinality(fields) = 10"),
              1);

    StreamEntry range;
    range.stream = "in:a";
    range.id = "(1-1 1-4]";
    EXPECT_FALSE(s->session.dead_letter(range, "entries are missing", std::nullopt));
    EXPECT_EQ(count("SELECT count(*) FROM outbox.dead_letters WHERE entry_id = '(1-1 1-4]' AND fields IS NULL AND "
                    "sqlstate IS NULL"),
              1);
    EXPECT_EQ(s->metrics.dead_letters, 2u);
}

// A dead letter that cannot be recorded for a reason of the
// configuration returns its SQLSTATE and message instead of throwing.
TEST_F(InboxSessionTest, DeadLetterRefusedReturnsTheFault) {
    auto s = session();
    admin().exec("SELECT inbox_consumer_set_owner('accounting', 'postgres')");  // not consumer_user's any more
    StreamEntry range;
    range.stream = "in:a";
    range.id = "(1-1 1-4]";
    const auto fault = s->session.dead_letter(range, "entries are missing", std::nullopt);
    ASSERT_TRUE(fault);
    EXPECT_EQ(fault->first, "42501");
    EXPECT_EQ(s->metrics.dead_letters, 0u);
}

// A lost connection is thrown, retryable, for the caller to hold the
// call's entries: nothing is settled or held by the session.
TEST_F(InboxSessionTest, LostConnectionThrowsRetryable) {
    auto s = session();
    admin().exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'consumer_user'");
    const std::vector<StreamEntry> entries{entry(1)};
    std::vector<const StreamEntry*> done;
    try {
        s->session.apply({&entries[0]}, done);
        FAIL() << "no error";
    } catch (const PgError& e) {
        EXPECT_TRUE(e.retryable()) << e.what();
    }
    EXPECT_TRUE(done.empty());
    EXPECT_TRUE(s->sink.settled_ids.empty());
    EXPECT_TRUE(s->sink.held_ids.empty());
}

// The settings are checked on the first connection: a consumer the role
// may not use, a handler that cannot prepare or is refused
// (handler_refusal()) are ConfigErrors naming the option.
TEST_F(InboxSessionTest, FirstConnectionChecksTheSettings) {
    struct Case {
        std::string consumer;
        std::string handler;
        std::string says;
    };
    for (const Case& c : {Case{"nobody", kHandler, "--consumer \"nobody\""},
                          Case{"accounting", "SELECT no_such_function($1)", "--handler"},
                          Case{"accounting", "COMMIT", "--handler: COMMIT is transaction control"},
                          Case{"accounting", "SET search_path = x", "--handler: SET changes the worker's session"}}) {
        config_.consumer = c.consumer;
        config_.handler = c.handler;
        try {
            session();
            ADD_FAILURE() << c.handler << ": no error";
        } catch (const ConfigError& e) {
            EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
        }
    }
    // Checked once: a later session of the same InboxSession is not.
    config_.consumer = "accounting";
    config_.handler = kHandler;
    auto s = session();
    PgConnection again(pg_->conninfo("sink", "consumer_user"), "tests");
    again.pin_settings(true);
    const auto extension = use_extension(again, SearchPath::keep);
    admin().exec("REVOKE ALL ON projection FROM consumer_user");
    s->session.reset();
    s->session.connected(again, extension);  // no check: no ConfigError
    const std::vector<StreamEntry> entries{entry(1)};
    std::vector<const StreamEntry*> done;
    s->session.apply({&entries[0]}, done);
    EXPECT_EQ(s->sink.held_ids, std::vector<std::string>{"1-1 42501"});
}
