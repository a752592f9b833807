// What pg_outbox does when preloaded, in throwaway instances: the
// maintenance background worker starts, maintains, reloads its settings and
// stops cleanly; relays are woken by one notification when they wait, not
// one per commit; and a fetch that waits in the server is woken by commits
// that emitted.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "servers.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

// Every database with the extension is maintained, without naming any:
// two created after the server started (one a consumer's, with the inbox
// only), not one without the extension; runs hold no connection between
// them, so DROP DATABASE is not held up.
TEST(MaintenanceWorker, EveryDatabaseWithTheExtensionIsMaintained) {
    PgServer pg({"shared_preload_libraries = 'pg_outbox'", "pg_outbox.maintenance_interval = '200ms'"});
    const auto app = pg.create_database("app");
    const auto ledger = pg.create_database("ledger");
    PgConnection admin(pg.conninfo("postgres"), "tests");
    admin.exec("CREATE DATABASE plain");

    ASSERT_TRUE(eventually(
        [&] {
            return query_column(admin, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_outbox launcher'")[0] == "1";
        },
        30s))
        << pg.log();

    // It maintains each: with small partitions and none left, it makes the
    // headroom by itself, and moves an event out of the default partition.
    for (const auto& conninfo : {app, ledger}) {
        PgConnection db(conninfo, "tests");
        db.exec("UPDATE outbox.config SET partition_width = 100, premake = 2");
        db.exec("SELECT outbox_drop_empty_partitions()");
        db.exec("SELECT outbox_emit('t', 'k', '{}')");
    }
    for (const auto& conninfo : {app, ledger}) {
        PgConnection db(conninfo, "tests");
        ASSERT_TRUE(eventually(
            [&] {
                return query_column(db, "SELECT count(*) FROM outbox.event_default")[0] == "0" &&
                       query_column(db, "SELECT count(*) >= 2 FROM outbox.partition_bounds() "
                                        "WHERE upper > pg_current_xact_id()")[0] == "t";
            },
            30s))
            << pg.log();
        EXPECT_EQ(query_column(db, "SELECT count(*) FROM outbox.feed")[0], "1");
        EXPECT_EQ(query_column(db, "SELECT last_finished_at IS NOT NULL FROM outbox.maintenance")[0], "t");
    }
    EXPECT_NE(pg.log().find("pg_outbox maintenance: moved"), std::string::npos);
    // "plain", without the extension, is looked at and left alone.
    EXPECT_EQ(pg.log().find("FATAL"), std::string::npos) << pg.log();
    EXPECT_EQ(pg.log().find("plain"), std::string::npos) << pg.log();

    // A maintained database can be dropped: no run holds it for long.
    ASSERT_TRUE(eventually(
        [&] {
            try {
                admin.exec("DROP DATABASE ledger");
                return true;
            } catch (const std::exception&) {
                return false;
            }
        },
        10s, 50ms))
        << pg.log();

    // SIGHUP: the new interval is taken.
    admin.exec("ALTER SYSTEM SET pg_outbox.maintenance_interval = '300ms'");
    admin.exec("SELECT pg_reload_conf()");
    ASSERT_TRUE(eventually(
        [&] { return pg.log().find("reloaded its settings, running every 300 ms") != std::string::npos; }, 20s))
        << pg.log();

    // A fast shutdown stops it cleanly.
    pg.stop();
    const auto log = pg.log();
    EXPECT_NE(log.find("pg_outbox launcher stopping"), std::string::npos) << log;
    EXPECT_EQ(log.find("terminated by signal"), std::string::npos) << log;
}

// Installing the extension wakes the launcher: a database gets its first
// maintenance run at once, not a full interval (nor ten, for a database
// already found without it) later.
TEST(MaintenanceWorker, InstallStartsMaintenanceAtOnce) {
    PgServer pg({"shared_preload_libraries = 'pg_outbox'", "pg_outbox.maintenance_interval = '10min'"});
    PgConnection admin(pg.conninfo("postgres"), "tests");
    admin.exec("CREATE DATABASE late");
    std::this_thread::sleep_for(500ms);
    PgConnection db(pg.conninfo("late"), "tests");
    db.exec("CREATE EXTENSION pg_outbox");
    ASSERT_TRUE(eventually(
        [&] { return query_column(db, "SELECT last_finished_at IS NOT NULL FROM outbox.maintenance")[0] == "t"; },
        20s))
        << pg.log();
}

// Preloaded, committing emitters notify only when a relay asked for it:
// the first commit of a database, then the first after each
// outbox_relay_waiting().
TEST(RelayWakeup, OneNotificationPerWaitNotPerCommit) {
    PgServer pg({"shared_preload_libraries = 'pg_outbox'"});
    const auto conninfo = pg.create_database("app");
    PgConnection listener(conninfo, "tests");
    PgConnection writer(conninfo, "tests");
    PgConnection relay(conninfo, "tests");
    listener.listen("pg_outbox");

    auto notifications_after = [&](int commits) {
        for (int i = 0; i < commits; ++i) writer.exec("SELECT outbox_emit('t', 'k', '{}')");
        int n = 0;
        while (const int got = listener.wait_for_notification(300ms)) n += got;
        return n;
    };
    EXPECT_EQ(notifications_after(20), 1);  // the first commit finds the flag armed
    EXPECT_EQ(notifications_after(20), 0);  // nobody waits
    EXPECT_EQ(query_column(relay, "SELECT outbox_relay_waiting()")[0], "t");
    EXPECT_EQ(notifications_after(20), 1);
    EXPECT_EQ(notifications_after(5), 0);
    // A transaction that emitted nothing never notifies.
    EXPECT_EQ(query_column(relay, "SELECT outbox_relay_waiting()")[0], "t");
    writer.exec("SELECT 1");
    EXPECT_EQ(notifications_after(0), 0);
    EXPECT_EQ(notifications_after(1), 1);
}

// Not preloaded, every committing transaction that emitted notifies (the
// C engine); the SQL engine notifies once after a relay asked.
TEST(RelayWakeup, WithoutPreloadEveryCommitNotifies) {
    PgServer pg;
    const auto conninfo = pg.create_database("app");
    PgConnection listener(conninfo, "tests");
    PgConnection writer(conninfo, "tests");
    listener.listen("pg_outbox");
    EXPECT_EQ(query_column(writer, "SELECT outbox_relay_waiting()")[0], "f");
    for (int i = 0; i < 5; ++i) writer.exec("SELECT outbox_emit('t', 'k', '{}')");
    int n = 0;
    while (const int got = listener.wait_for_notification(300ms)) n += got;
    // The SQL engine notifies once a relay asked, as the C engine does
    // preloaded (its flag in a sequence instead of shared memory).
    EXPECT_EQ(n, engine() == "sql" ? 1 : 5);
    if (engine() == "sql") {
        EXPECT_EQ(query_column(writer, "SELECT outbox_relay_waiting()")[0], "f");
        writer.exec("SELECT outbox_emit('t', 'k', '{}')");
        writer.exec("SELECT outbox_emit('t', 'k', '{}')");
        n = 0;
        while (const int got = listener.wait_for_notification(300ms)) n += got;
        EXPECT_EQ(n, 1);
    }
}

// Preloaded, an empty fetch with a wait sleeps in the server until a commit
// that emitted wakes it, and returns that commit's events then; in both
// orders. A commit that emitted nothing wakes nobody.
TEST(RelayWakeup, FetchSleepsUntilACommitThatEmitted) {
    PgServer pg({"shared_preload_libraries = 'pg_outbox'"});
    const auto conninfo = pg.create_database("app");
    PgConnection writer(conninfo, "tests");
    for (const std::string group : {"xid8", "commit"}) {
        writer.exec("SELECT outbox_group_create($1, ordering => $1)", {group});
        auto fetched = std::async(std::launch::async, [&] {
            PgConnection relay(conninfo, "tests");
            // As a relay does: a fetch that takes the leadership writes the
            // group's row, and so does not wait.
            relay.exec("SELECT outbox_lead($1)", {group});
            const auto t0 = std::chrono::steady_clock::now();
            auto r = relay.exec("SELECT key FROM outbox_fetch($1, 10, NULL, '10 s')", {group});
            return std::make_pair(r.rows() == 1 ? std::string(r.get(0, 0)) : std::string("rows: ") +
                                                                                 std::to_string(r.rows()),
                                  std::chrono::steady_clock::now() - t0);
        });
        // The fetch sleeps: a commit without events leaves it asleep.
        ASSERT_EQ(fetched.wait_for(500ms), std::future_status::timeout);
        writer.exec("SELECT pg_current_xact_id()");
        ASSERT_EQ(fetched.wait_for(500ms), std::future_status::timeout);
        writer.exec("SELECT outbox_emit('t', 'woke-' || $1, '{}')", {group});
        ASSERT_EQ(fetched.wait_for(30s), std::future_status::ready) << group;
        const auto [key, took] = fetched.get();
        EXPECT_EQ(key, "woke-" + group);
        EXPECT_LT(took, 8s) << group;  // woken, well before the wait's end
    }
}
