// The relay finds pg_outbox wherever CREATE EXTENSION ... SCHEMA put it,
// and refuses (exit 2, saying why) a database without the extension or
// with another version than its own.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/position.hpp"

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

// Installed in schema "Ob Schema" (a name that must be quoted, as the
// relay's statements quote it): publish and consume work, and the consume
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
    db.exec("CREATE SCHEMA \"Ob Schema\"");
    db.exec("CREATE EXTENSION pg_outbox SCHEMA \"Ob Schema\"");
    db.exec("SELECT \"Ob Schema\".outbox_group_create('g', start_at => 'beginning')");
    db.exec("SELECT \"Ob Schema\".inbox_consumer_create('c', 'postgres')");
    db.exec("CREATE TABLE public.seen (key text)");
    db.exec("CREATE FUNCTION public.note(key text) RETURNS void LANGUAGE sql AS $$ INSERT INTO public.seen VALUES (key) $$");
    for (int i = 0; i < 5; ++i) db.exec("SELECT \"Ob Schema\".outbox_emit('t', 'k' || $1, '{}')", {std::to_string(i)});

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

// A position has one definition per language: position.c in the extension
// (behind outbox.parse_position) and Position::parse in the relay. On the
// same texts they agree: every position the extension accepts, the relay
// reads as the same pair; the relay's domain is wider only where Redis
// stream ids are (a sequence up to 2^64 - 1, more digits with leading
// zeros), and the extension refuses those loudly.
TEST(Extension, PositionParsersAgree) {
    PgServer pg;
    {
        PgConnection admin(pg.conninfo("postgres"), "tests");
        admin.exec("CREATE DATABASE app");
    }
    PgConnection db(pg.conninfo("app"), "tests");
    db.exec("CREATE EXTENSION pg_outbox");
    const std::vector<std::string> texts{
        "0-0", "1-1", "1042-3", "007-08", "18446744073709551615-9223372036854775807",
        "18446744073709551616-1", "1-9223372036854775808", "1-18446744073709551615",
        "99999999999999999999-1", "000000000000000000001-1", "1-0000000000000000001",
        "", "-", "1-", "-1", "1--1", "+1-1", "1-+1", " 1-1", "1-1 ", "1-1\n", "a-1", "1-b", "1.5-1", "1e3-1",
        "١-١", "1-2-3", "0x10-1"};
    for (const auto& t : texts) {
        std::optional<Position> ours = Position::parse(t);
        std::string sql_txid, sql_seq;
        bool sql_ok = true;
        try {
            auto r = db.exec("SELECT txid::text, seq::text FROM outbox.parse_position($1)", {t});
            sql_txid = std::string(r.get(0, 0));
            sql_seq = std::string(r.get(0, 1));
        } catch (const PgError& e) {
            sql_ok = false;
            EXPECT_EQ(e.sqlstate(), "22023") << "\"" << t << "\": " << e.what();
        }
        if (sql_ok) {
            ASSERT_TRUE(ours) << "the extension accepts \"" << t << "\", the relay does not";
            EXPECT_EQ(std::to_string(ours->major), sql_txid) << t;
            EXPECT_EQ(std::to_string(ours->minor), sql_seq) << t;
        } else if (ours) {
            // Only a Redis id's wider range: a sequence above 2^63 - 1, or
            // a part longer than the extension's digits.
            const auto dash = t.find('-');
            const bool wider = ours->minor > 9223372036854775807ULL || dash > 20 || t.size() - dash - 1 > 19;
            EXPECT_TRUE(wider) << "the relay accepts \"" << t << "\", the extension refuses it";
        }
    }
}
