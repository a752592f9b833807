// Commit-ordered groups on a server that preloads pg_outbox: tickets are
// never issued twice across crashes and restarts, the window between a
// transaction's ticket and its visibility skips nothing, and the relay
// publishes commit order as it is, with stream ids made of tickets.
#include <gtest/gtest.h>

#include <csignal>
#include <thread>

#include "servers.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> kPreload = {"shared_preload_libraries = 'pg_outbox'"};

// The keys of a fetch of the whole backlog, in feed order.
std::string fetch_keys(PgConnection& relay, const std::string& group) {
    std::string keys;
    for (const auto& k : query_column(relay, "SELECT key FROM outbox_fetch($1, 100000)", {group})) keys += k + " ";
    return keys;
}

// Connects, retrying while the server restarts after a crash.
PgConnection connect_when_up(const std::string& conninfo) {
    for (int i = 0;; ++i) {
        try {
            PgConnection c(conninfo, "tests");
            c.exec("SELECT 1");
            return c;
        } catch (const std::exception&) {
            if (i > 300) throw;
            std::this_thread::sleep_for(100ms);
        }
    }
}

}  // namespace

// A commit-order cursor written near the end of bigint around the
// functions (outbox_rewind refuses one): after a restart the ticket
// counter does not start there (it overflowed into negative tickets, and
// every later event was skipped). Commits that emitted and fetches fail
// loudly until the group is re-anchored, then flow again.
TEST(CommitOrder, TicketCounterNeverStartsNearTheEndOfBigint) {
    PgServer pg(kPreload);
    const auto conninfo = pg.create_database("app");
    {
        PgConnection db(conninfo, "tests");
        db.exec("SELECT outbox_group_create('g', start_at => 'beginning', ordering => 'commit')");
        db.exec("UPDATE outbox.groups SET cursor_ticket = 9223372036854775000 WHERE name = 'g'");
    }
    pg.restart();
    {
        auto db = connect_when_up(conninfo);
        try {
            db.exec("SELECT outbox_emit('t', 'refused', '1')");
            ADD_FAILURE() << "a commit took a ticket above the end of bigint";
        } catch (const std::exception& e) {
            EXPECT_NE(std::string(e.what()).find("cannot start above ticket"), std::string::npos) << e.what();
        }
        EXPECT_EQ(query_column(db, "SELECT count(*) FROM outbox.event")[0], "0");
        EXPECT_EQ(query_column(db, "SELECT count(*) FROM outbox.commit_log WHERE ticket < 0")[0], "0");
        db.exec("SELECT outbox_rewind('g', 'beginning')");
        db.exec("SELECT outbox_emit('t', 'after', '1')");
        EXPECT_EQ(fetch_keys(db, "g"), "after ");
        EXPECT_GT(std::stoll(query_column(db, "SELECT max(ticket) FROM outbox.commit_log")[0]), 0);
    }
}

// A reader passes tickets; the server crashes (a backend killed, so the
// postmaster reinitialises shared memory) and restarts cleanly: the
// tickets after each are above every ticket before, and the group reads
// exactly the new events.
TEST(CommitOrder, CrashAndRestartNeverReissueATicket) {
    PgServer pg(kPreload);
    const auto conninfo = pg.create_database("app");
    {
        PgConnection db(conninfo, "tests");
        db.exec("SELECT outbox_group_create('g', start_at => 'beginning', ordering => 'commit')");
        for (int i = 0; i < 3; ++i) db.exec("SELECT outbox_emit('t', 'before-' || $1, '1')", {std::to_string(i)});
        EXPECT_EQ(fetch_keys(db, "g"), "before-0 before-1 before-2 ");
        db.exec("SELECT outbox_advance('g', (SELECT max(pos) FROM outbox_fetch('g', 1000)))");
    }
    auto max_ticket = [](PgConnection& db) { return std::stoll(query_column(db, "SELECT max(ticket) FROM outbox.commit_log")[0]); };

    // Crash: SIGKILL a backend; the postmaster restarts every process.
    long long before;
    {
        PgConnection db(conninfo, "tests");
        before = max_ticket(db);
        PgConnection victim(conninfo, "victim");
        ASSERT_EQ(::kill(victim.backend_pid(), SIGKILL), 0);
    }
    std::this_thread::sleep_for(500ms);
    {
        auto db = connect_when_up(conninfo);
        db.exec("SELECT outbox_emit('t', 'after-crash', '1')");
        EXPECT_GT(max_ticket(db), before);
        EXPECT_EQ(fetch_keys(db, "g"), "after-crash ");
        db.exec("SELECT outbox_advance('g', (SELECT max(pos) FROM outbox_fetch('g', 1000)))");
        before = max_ticket(db);
    }
    EXPECT_NE(pg.log().find("terminated by signal 9"), std::string::npos);

    // A clean restart: the same.
    pg.restart();
    {
        auto db = connect_when_up(conninfo);
        db.exec("SELECT outbox_emit('t', 'after-restart', '1')");
        EXPECT_GT(max_ticket(db), before);
        EXPECT_EQ(fetch_keys(db, "g"), "after-restart ");
    }
}

// A transaction waits for a synchronous standby that never answers: it
// holds its ticket, its commit record is written, but it is not visible
// yet. Later commits wait behind it instead of being read past it; once
// it finishes, everything comes in commit order.
TEST(CommitOrder, TicketToVisibilityWindowSkipsNothing) {
    PgServer pg({kPreload[0], "synchronous_standby_names = 'nobody'", "synchronous_commit = local"});
    const auto conninfo = pg.create_database("app");
    PgConnection admin(conninfo, "tests");
    admin.exec("SELECT outbox_group_create('g', start_at => 'beginning', ordering => 'commit')");

    PgConnection slow(conninfo, "slow");
    slow.exec("SET synchronous_commit = on");
    slow.send("SELECT outbox_emit('t', 'slow', '1')");  // commits, then waits for the standby
    ASSERT_TRUE(eventually(
        [&] {
            return query_column(admin, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")[0] == "1";
        },
        10s));

    PgConnection fast(conninfo, "fast");
    fast.exec("SELECT outbox_emit('t', 'fast', '1')");
    PgConnection relay(conninfo, "relay");
    EXPECT_EQ(fetch_keys(relay, "g"), "");  // "fast" is final only after "slow"
    EXPECT_EQ(query_column(relay, "SELECT waiting FROM outbox_group_stats() WHERE group_name = 'g'")[0], "0");

    // Cancelling the wait lets the commit finish (with a warning).
    admin.exec("SELECT pg_cancel_backend($1)", {std::to_string(slow.backend_pid())});
    EXPECT_EQ(slow.receive().rows(), 1);
    EXPECT_EQ(fetch_keys(relay, "g"), "slow fast ");
}

// The relay publishes a commit-ordered group unchanged: transaction
// "early" took its id first and committed last, so its event comes last;
// stream ids are "<ticket>-<seq>".
TEST(CommitOrder, RelayPublishesInCommitOrder) {
    PgServer pg(kPreload);
    RedisServer redis;
    const auto conninfo = pg.create_database("app");
    PgConnection admin(conninfo, "tests");
    admin.exec("SELECT outbox_group_create('g', ordering => 'commit')");

    PgConnection early(conninfo, "early");
    early.exec("BEGIN");
    early.exec("SELECT outbox_emit('orders', 'early', '1')");
    PgConnection late(conninfo, "late");
    late.exec("SELECT outbox_emit('orders', 'late', '2')");
    late.exec("BEGIN");
    late.exec("SELECT outbox_emit('orders', 'late-2', '3')");
    late.exec("SELECT outbox_emit('orders', 'late-3', '4')");
    late.exec("COMMIT");
    early.exec("COMMIT");

    const TempDir dir("pg_outbox_commit_order");
    Process relay({PG_OUTBOX_RELAY_BINARY, "--pg", conninfo, "--redis", redis.address(), "publish", "--group", "g"},
                  dir.path() + "/relay.log");
    auto r = redis.connect();
    ASSERT_TRUE(eventually([&] { return read_stream(r, "outbox:orders").size() == 4; }, 20s)) << relay.log();
    const auto entries = read_stream(r, "outbox:orders");
    std::vector<std::string> keys;
    for (const auto& e : entries) keys.push_back(e.fields.at("key"));
    EXPECT_EQ(keys, (std::vector<std::string>{"late", "late-2", "late-3", "early"}));
    const auto tickets = query_column(admin, "SELECT ticket || '-' FROM outbox.commit_log ORDER BY ticket");
    ASSERT_EQ(tickets.size(), 3u);
    EXPECT_EQ(entries[0].id, tickets[0] + "1");
    EXPECT_EQ(entries[1].id, tickets[1] + "1");
    EXPECT_EQ(entries[2].id, tickets[1] + "2");
    EXPECT_EQ(entries[3].id, tickets[2] + "1");
    EXPECT_EQ(entries[3].fields.at("position"), entries[3].id);

    // The relay's check of the streams after a FLUSHALL works in commit
    // order too: the group rewinds and republishes.
    ASSERT_TRUE(eventually(
        [&] {
            return query_column(admin, "SELECT cursor FROM outbox.groups WHERE name = 'g'")[0] == entries[3].id;
        },
        10s));
    relay.signal(SIGTERM);
    EXPECT_EQ(relay.wait(), 0);
    r.command({"FLUSHALL"});
    Process again({PG_OUTBOX_RELAY_BINARY, "--pg", conninfo, "--redis", redis.address(), "publish", "--group", "g"},
                  dir.path() + "/again.log");
    ASSERT_TRUE(eventually([&] { return read_stream(r, "outbox:orders").size() == 4; }, 20s)) << again.log();
    EXPECT_EQ(read_stream(r, "outbox:orders")[3].id, entries[3].id);
}
