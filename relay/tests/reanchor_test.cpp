// A database restored into another cluster, whose transaction ids are
// lower than the old cluster's: the relay refuses to go on (the cursor is
// ahead of the server) and says how to fix it; outbox_reanchor() makes
// the group go on from the new server's horizon, appending to the same
// streams with ids above every entry it wrote before. In both orders.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <thread>

#include "fixture.hpp"
#include "pg_outbox/position.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> kPreload = {"shared_preload_libraries = 'pg_outbox'"};

std::unique_ptr<Process> start_relay(PgServer& pg, RedisServer& redis, const std::string& group,
                                     const std::string& log) {
    return std::make_unique<Process>(std::vector<std::string>{PG_OUTBOX_RELAY_BINARY, "publish", "--group", group, "--pg", pg.conninfo("app"), "--redis",
                    redis.address(), "--poll-interval", "50ms", "--retry-min", "20ms", "--retry-max", "300ms",
                    "--stream", "outbox:" + group},
                   log);
}

// The ids of a stream, in order.
std::vector<Position> ids(RedisServer& redis, const std::string& stream) {
    auto c = redis.connect();
    std::vector<Position> out;
    for (const auto& e : read_stream(c, stream)) out.push_back(*Position::parse(e.id));
    return out;
}

}  // namespace

TEST(Reanchor, RestoreIntoAnotherClusterGoesOnInTheSameStreams) {
    const auto dir = make_temp_dir("pg_outbox_reanchor_");
    RedisServer redis;
    PgServer old_pg(kPreload);
    old_pg.create_database("app");
    {
        PgConnection db(old_pg.conninfo("app"), "tests");
        db.exec("SELECT outbox_group_create('x', ordering => 'xid8', start_at => 'beginning')");
        db.exec("SELECT outbox_group_create('c', ordering => 'commit', start_at => 'beginning')");
        // The old cluster is far ahead in transaction ids.
        db.exec("CREATE PROCEDURE burn(n int) LANGUAGE plpgsql AS $$ BEGIN FOR i IN 1 .. n LOOP "
                "PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$");
        db.exec("CALL burn(3000)");
        for (int i = 0; i < 10; ++i) db.exec("SELECT outbox_emit('t', 'old-' || $1, '{}')", {std::to_string(i)});
    }
    for (const std::string group : {"x", "c"}) {
        auto relay = start_relay(old_pg, redis, group, dir + "/old-" + group + ".log");
        ASSERT_TRUE(eventually([&] { return ids(redis, "outbox:" + group).size() == 10; }, 30s)) << relay->log();
        relay->signal(SIGTERM);
        EXPECT_EQ(relay->wait(), 0) << relay->log();
    }

    // Dump, and restore into a new cluster.
    const auto dump = dir + "/app.dump";
    ASSERT_EQ(std::system(("/usr/lib/postgresql/15/bin/pg_dump -Fc -f " + dump + " '" + old_pg.conninfo("app") + "'").c_str()), 0);
    PgServer new_pg(kPreload);
    {
        PgConnection admin(new_pg.conninfo("postgres"), "tests");
        admin.exec("CREATE DATABASE app");
    }
    ASSERT_EQ(std::system(("/usr/lib/postgresql/15/bin/pg_restore --exit-on-error -d '" + new_pg.conninfo("app") +
                           "' " + dump).c_str()),
              0);
    old_pg.stop();
    {
        PgConnection db(new_pg.conninfo("app"), "tests");
        for (int i = 0; i < 5; ++i) db.exec("SELECT outbox_emit('t', 'new-' || $1, '{}')", {std::to_string(i)});
    }

    // The xid8 group's cursor is ahead of the new server: the relay stops
    // and names the fix.
    {
        auto relay = start_relay(new_pg, redis, "x", dir + "/refused.log");
        EXPECT_EQ(relay->wait(20s), 1) << relay->log();
        EXPECT_NE(relay->log().find("outbox_reanchor('x')"), std::string::npos) << relay->log();
    }
    for (const std::string group : {"x", "c"}) {
        PgConnection db(new_pg.conninfo("app"), "tests");
        const auto cursor = query_column(db, "SELECT outbox_reanchor($1)", {group})[0];
        const auto before = ids(redis, "outbox:" + group);
        EXPECT_LT(before.back(), *Position::parse(cursor)) << group;
        // New events after the re-anchoring, published into the same stream.
        for (int i = 5; i < 8; ++i) db.exec("SELECT outbox_emit('t', 'new-' || $1, '{}')", {std::to_string(i)});
        auto relay = start_relay(new_pg, redis, group, dir + "/new-" + group + ".log");
        ASSERT_TRUE(eventually([&] { return ids(redis, "outbox:" + group).size() == 13; }, 30s))
            << group << ": " << relay->log();
        const auto after = ids(redis, "outbox:" + group);
        for (std::size_t i = 1; i < after.size(); ++i) EXPECT_LT(after[i - 1], after[i]) << group;
        auto c = redis.connect();
        const auto entries = read_stream(c, "outbox:" + group);
        EXPECT_EQ(entries[10].fields.at("key"), "new-5") << group;
        EXPECT_EQ(entries[12].fields.at("key"), "new-7") << group;
        // Positions given back to the server are taken as the group's own.
        EXPECT_TRUE(eventually([&] {
            return query_column(db, "SELECT cursor FROM outbox.groups WHERE name = $1", {group})[0] == entries[12].id;
        }, 10s)) << group;
        EXPECT_EQ(query_column(db, "SELECT outbox_rewind($1, $2)", {group, entries[11].id})[0], entries[11].id);
        relay->signal(SIGTERM);
        relay->wait();
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}
