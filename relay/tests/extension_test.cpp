// The relay finds pg_outbox wherever CREATE EXTENSION ... SCHEMA put it,
// and refuses (exit 2, saying why) a database without the extension or
// with another version than its own.
#include <gtest/gtest.h>

#include <memory>

#include "fixture.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<Process> relay(const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv{PG_OUTBOX_RELAY_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<Process>(argv, log);
}

}  // namespace

// Installed in schema "ob": publish and consume work, and the consume
// handler still finds the application's own function in "public".
TEST(Extension, AnySchema) {
    TempDir dir("pg_outbox_schema_");
    PgServer pg;
    RedisServer redis;
    {
        PgConnection admin(pg.conninfo("postgres"), "tests");
        admin.exec("CREATE DATABASE app");
    }
    PgConnection db(pg.conninfo("app"), "tests");
    db.exec("CREATE SCHEMA ob");
    db.exec("CREATE EXTENSION pg_outbox SCHEMA ob");
    db.exec("SELECT ob.outbox_group_create('g', start_at => 'beginning')");
    db.exec("SELECT ob.inbox_consumer_create('c', 'postgres')");
    db.exec("CREATE TABLE public.seen (key text)");
    db.exec("CREATE FUNCTION public.note(key text) RETURNS void LANGUAGE sql AS $$ INSERT INTO public.seen VALUES (key) $$");
    for (int i = 0; i < 5; ++i) db.exec("SELECT ob.outbox_emit('t', 'k' || $1, '{}')", {std::to_string(i)});

    auto publisher = relay({"publish", "--group", "g", "--pg", pg.conninfo("app"), "--redis", redis.address(),
                            "--poll-interval", "50ms", "--stream", "s"},
                           dir.path() + "/publish.log");
    auto consumer = relay({"consume", "--consumer", "c", "--stream", "s", "--pg", pg.conninfo("app"), "--redis",
                           redis.address(), "--handler", "SELECT note($2)", "--block", "100ms"},
                          dir.path() + "/consume.log");
    EXPECT_TRUE(eventually([&] { return query_column(db, "SELECT count(*) FROM public.seen")[0] == "5"; }, 30s))
        << publisher->log() << consumer->log();
    EXPECT_TRUE(publisher->running()) << publisher->log();
    EXPECT_TRUE(consumer->running()) << consumer->log();
}

TEST(Extension, MissingOrOtherVersionExitsTwo) {
    TempDir dir("pg_outbox_version_");
    PgServer pg;
    RedisServer redis;
    pg.create_database("app");
    {
        PgConnection admin(pg.conninfo("postgres"), "tests");
        admin.exec("CREATE DATABASE plain");
    }
    auto missing = relay({"publish", "--group", "g", "--pg", pg.conninfo("plain"), "--redis", redis.address()},
                         dir.path() + "/missing.log");
    EXPECT_EQ(missing->wait(20s), 2) << missing->log();
    EXPECT_NE(missing->log().find("pg_outbox is not installed in database \"plain\""), std::string::npos)
        << missing->log();

    PgConnection db(pg.conninfo("app"), "tests");
    db.exec("UPDATE pg_extension SET extversion = '0.0.9' WHERE extname = 'pg_outbox'");
    auto other = relay({"publish", "--group", "g", "--pg", pg.conninfo("app"), "--redis", redis.address()},
                       dir.path() + "/other.log");
    EXPECT_EQ(other->wait(20s), 2) << other->log();
    EXPECT_NE(other->log().find("has pg_outbox 0.0.9"), std::string::npos) << other->log();
    EXPECT_NE(other->log().find("ALTER EXTENSION pg_outbox UPDATE"), std::string::npos) << other->log();
}
