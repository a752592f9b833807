// The maintenance background worker, in a throwaway instance that preloads
// pg_outbox: it starts, maintains, reloads its settings and stops cleanly.
#include <gtest/gtest.h>

#include "servers.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

TEST(MaintenanceWorker, StartsMaintainsReloadsAndStops) {
    PgServer pg({"shared_preload_libraries = 'pg_outbox'", "pg_outbox.database = 'app'",
                 "pg_outbox.maintenance_interval = '200ms'"});
    // The worker starts with the server; the database comes later, which it
    // survives (it restarts until the database exists).
    const auto conninfo = pg.create_database("app");
    PgConnection db(conninfo, "tests");

    ASSERT_TRUE(eventually(
        [&] {
            return query_column(db, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_outbox maintenance'")[0] == "1";
        },
        30s))
        << pg.log();

    // It maintains: with small partitions and none left, it makes the
    // headroom by itself, and moves an event out of the default partition.
    db.exec(R"(DO $$
        DECLARE p record;
        BEGIN
            UPDATE outbox.config SET partition_width = 100, premake = 2;
            FOR p IN SELECT * FROM outbox.partition_bounds() LOOP
                EXECUTE format('ALTER TABLE outbox.event DETACH PARTITION %s', p.relid);
                EXECUTE format('ALTER EXTENSION pg_outbox DROP TABLE %s', p.relid);
                EXECUTE format('DROP TABLE %s', p.relid);
            END LOOP;
        END $$)");
    db.exec("SELECT outbox_emit('t', 'k', '{}')");
    ASSERT_TRUE(eventually(
        [&] {
            return query_column(db, "SELECT count(*) FROM outbox.event_default")[0] == "0" &&
                   query_column(db, "SELECT count(*) >= 2 FROM outbox.partition_bounds() "
                                    "WHERE upper > pg_current_xact_id()")[0] == "t";
        },
        30s))
        << pg.log();
    EXPECT_EQ(query_column(db, "SELECT count(*) FROM outbox.feed")[0], "1");
    EXPECT_NE(pg.log().find("pg_outbox maintenance: moved"), std::string::npos);
    EXPECT_EQ(query_column(db, "SELECT last_finished_at IS NOT NULL FROM outbox.maintenance")[0], "t");

    // SIGHUP: the new interval is taken.
    db.exec("ALTER SYSTEM SET pg_outbox.maintenance_interval = '300ms'");
    db.exec("SELECT pg_reload_conf()");
    ASSERT_TRUE(eventually(
        [&] { return pg.log().find("reloaded its settings, running every 300 ms") != std::string::npos; }, 20s))
        << pg.log();

    // A fast shutdown stops it cleanly.
    pg.stop();
    const auto log = pg.log();
    EXPECT_NE(log.find("pg_outbox maintenance worker stopping"), std::string::npos) << log;
    EXPECT_EQ(log.find("terminated by signal"), std::string::npos) << log;
}
