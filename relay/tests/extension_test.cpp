// The relay finds pg_outbox through outbox.engine(), on either engine and
// wherever CREATE EXTENSION ... SCHEMA put the API, and refuses (exit 2,
// saying why) a database without pg_outbox, with another version than its
// own, or whose "outbox" schema its role may not use.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/extension.hpp"
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

// Makes outbox.engine() say another version (its engine and schema kept),
// as a database of another version of pg_outbox would.
void say_version(PgConnection& db, const std::string& version) {
    db.exec("SELECT set_config('pg_outbox_test.version', $1, false)", {version});
    db.exec(R"(DO $$
        DECLARE
            e record;
        BEGIN
            SELECT * INTO e FROM outbox.engine();
            EXECUTE format('CREATE OR REPLACE FUNCTION outbox.engine(OUT engine text, OUT version text, '
                           'OUT api_schema name) LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
                           format('SELECT %L::text, %L::text, %L::name', e.engine,
                                  current_setting('pg_outbox_test.version'), e.api_schema));
        END $$)");
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
    db.exec("CREATE EXTENSION " + extension_name() + " SCHEMA \"Ob Schema\"");
    // The schema's name, not the identifier the script was given.
    EXPECT_EQ(query_column(db, "SELECT api_schema FROM outbox.engine()")[0], "Ob Schema");
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
    // The engine, its version and the API's schema, said once at start.
    const auto said = "on the " + engine() + " engine";
    for (const auto* p : {publisher.get(), consumer.get()}) {
        const auto log = p->log();
        const auto at = log.find(said);
        EXPECT_NE(at, std::string::npos) << log;
        EXPECT_EQ(log.find(said, at + 1), std::string::npos) << log;
        EXPECT_NE(log.find("its API in schema \"Ob Schema\""), std::string::npos) << log;
    }
}

// use_extension() reads outbox.engine(): the engine the database has, its
// version, and the API's schema quoted; with SearchPath::pin the session
// resolves nothing through a schema anyone may create objects in.
TEST(Extension, FoundThroughTheEngineFunction) {
    PgServer pg;
    pg.create_database("app");
    PgConnection db(pg.conninfo("app"), "tests");
    const auto expected = query_column(db, "SELECT version FROM outbox.engine()")[0];
    PgConnection session(pg.conninfo("app"), "tests");
    session.exec("SET search_path = public");
    const auto found = use_extension(session, SearchPath::pin);
    EXPECT_EQ(found.engine, engine());
    EXPECT_EQ(found.version, expected);
    EXPECT_EQ(found.schema, "public");
    EXPECT_EQ(query_column(session, "SHOW search_path")[0], "pg_catalog, pg_temp");
    PgConnection kept(pg.conninfo("app"), "tests");
    kept.exec("SET search_path = public");
    EXPECT_EQ(use_extension(kept, SearchPath::keep).engine, engine());
    EXPECT_EQ(query_column(kept, "SHOW search_path")[0], "public");
}

// outbox.engine() taken out of its extension, as the SQL engine installed
// by psql -f has it (no pg_extension row): the relay publishes; with
// another version, the hint says how that installation is updated.
TEST(Extension, EngineFunctionOutsideAnExtension) {
    TempDir dir("pg_outbox_script_");
    PgServer pg;
    RedisServer redis;
    pg.create_database("app");
    PgConnection db(pg.conninfo("app"), "tests");
    db.exec("ALTER EXTENSION " + extension_name() + " DROP FUNCTION outbox.engine()");
    db.exec("SELECT outbox_group_create('g', start_at => 'beginning')");
    db.exec("SELECT outbox_emit('t', 'k', '{}')");
    auto publisher = relay({"publish", "--group", "g", "--pg", pg.conninfo("app"), "--redis", redis.address(),
                            "--poll-interval", "50ms", "--stream", "s"},
                           dir.path() + "/publish.log");
    auto c = redis.connect();
    EXPECT_TRUE(eventually([&] { return read_stream(c, "s").size() == 1; }, 30s)) << publisher->log();
    publisher.reset();

    say_version(db, "0.0.9");
    auto other = relay({"publish", "--group", "g", "--pg", pg.conninfo("app"), "--redis", redis.address()},
                       dir.path() + "/other.log");
    EXPECT_EQ(other->wait(20s), 2) << other->log();
    EXPECT_NE(other->log().find("has pg_outbox 0.0.9"), std::string::npos) << other->log();
    if (engine() == "sql")
        EXPECT_NE(other->log().find("run the SQL engine's script of"), std::string::npos) << other->log();
    else
        EXPECT_NE(other->log().find("ALTER EXTENSION pg_outbox UPDATE"), std::string::npos) << other->log();
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
    // A schema "outbox" of the application's own, without outbox.engine().
    {
        PgConnection plain(pg.conninfo("plain"), "tests");
        plain.exec("CREATE SCHEMA outbox");
        plain.exec("CREATE FUNCTION outbox.engine(x int) RETURNS int LANGUAGE sql AS 'SELECT x'");
    }
    auto foreign = relay({"publish", "--group", "g", "--pg", pg.conninfo("plain"), "--redis", redis.address()},
                         dir.path() + "/foreign.log");
    EXPECT_EQ(foreign->wait(20s), 2) << foreign->log();
    EXPECT_NE(foreign->log().find("pg_outbox is not installed in database \"plain\""), std::string::npos)
        << foreign->log();

    PgConnection db(pg.conninfo("app"), "tests");
    say_version(db, "0.0.9");
    auto other = relay({"publish", "--group", "g", "--pg", pg.conninfo("app"), "--redis", redis.address()},
                       dir.path() + "/other.log");
    EXPECT_EQ(other->wait(20s), 2) << other->log();
    EXPECT_NE(other->log().find("has pg_outbox 0.0.9"), std::string::npos) << other->log();
    EXPECT_NE(other->log().find("ALTER EXTENSION " + extension_name() + " UPDATE"), std::string::npos)
        << other->log();
}

// Version 0.1.0 has no outbox.engine(): the relay still says which
// version the database has, and how to update it (C engine only: the SQL
// engine has no version before 0.2.0).
TEST(Extension, VersionBeforeTheEngineFunctionExitsTwo) {
    TempDir dir("pg_outbox_old_");
    PgServer pg;
    RedisServer redis;
    {
        PgConnection admin(pg.conninfo("postgres"), "tests");
        admin.exec("CREATE DATABASE app");
    }
    PgConnection db(pg.conninfo("app"), "tests");
    db.exec("CREATE EXTENSION pg_outbox VERSION '0.1.0'");
    auto old = relay({"publish", "--group", "g", "--pg", pg.conninfo("app"), "--redis", redis.address()},
                     dir.path() + "/old.log");
    EXPECT_EQ(old->wait(20s), 2) << old->log();
    EXPECT_NE(old->log().find("database \"app\" has pg_outbox 0.1.0;"), std::string::npos) << old->log();
    EXPECT_NE(old->log().find("ALTER EXTENSION pg_outbox UPDATE"), std::string::npos) << old->log();
}

// A role that is no member of pg_outbox's roles may not use the schema
// "outbox": publish and consume say so, and which role to grant, at once.
TEST(Extension, RoleWithoutTheSchemaExitsTwo) {
    TempDir dir("pg_outbox_stranger_");
    PgServer pg;
    RedisServer redis;
    pg.create_database("app");
    PgConnection db(pg.conninfo("app"), "tests");
    db.exec("CREATE ROLE stranger LOGIN");
    auto publisher = relay({"publish", "--group", "g", "--pg", pg.conninfo("app", "stranger"), "--redis",
                            redis.address()},
                           dir.path() + "/publish.log");
    auto consumer = relay({"consume", "--consumer", "c", "--stream", "s", "--pg", pg.conninfo("app", "stranger"),
                           "--redis", redis.address(), "--handler", "SELECT 1"},
                          dir.path() + "/consume.log");
    for (auto* p : {publisher.get(), consumer.get()}) {
        EXPECT_EQ(p->wait(20s), 2) << p->log();
        EXPECT_NE(p->log().find("role \"stranger\" may not use schema \"outbox\" of database \"app\""),
                  std::string::npos)
            << p->log();
        EXPECT_NE(p->log().find("GRANT outbox_relay TO stranger"), std::string::npos) << p->log();
    }
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
    db.exec("CREATE EXTENSION " + extension_name());
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

// The relay needs no superuser and no file on the server: on a database
// whose pg_outbox belongs to a role that is no superuser (as a managed
// service's admin role, which installs the SQL engine from its script), a
// relay in outbox_relay alone publishes and runs partition maintenance
// (outbox_maintain(): on the SQL engine the only maintenance besides
// pg_cron), and a worker in outbox_consumer alone applies through the inbox.
TEST(Extension, OrdinaryRolesOnly) {
    TempDir dir("pg_outbox_roles_");
    PgServer pg;
    RedisServer redis;
    {
        // CREATE EXTENSION needs a superuser: the owner is one while it
        // installs, and no more afterwards.
        PgConnection admin(pg.conninfo("postgres"), "tests");
        admin.exec("CREATE ROLE app_admin LOGIN CREATEROLE SUPERUSER");
        admin.exec("CREATE DATABASE app OWNER app_admin");
        PgConnection installer(pg.conninfo("app", "app_admin"), "tests");
        installer.exec("CREATE EXTENSION " + extension_name());
        admin.exec("ALTER ROLE app_admin NOSUPERUSER");
    }
    PgConnection db(pg.conninfo("app", "app_admin"), "tests");
    ASSERT_EQ(query_column(db, "SELECT rolsuper::text FROM pg_roles WHERE rolname = current_user")[0], "false");
    db.exec("GRANT outbox_admin TO app_admin");
    db.exec("CREATE ROLE relay_user LOGIN IN ROLE outbox_relay");
    db.exec("CREATE ROLE writer LOGIN IN ROLE outbox_writer");
    db.exec("CREATE ROLE worker LOGIN IN ROLE outbox_consumer");
    // No partition left: the events land in the default partition, and
    // only the relay's maintenance moves them out.
    db.exec("UPDATE outbox.config SET partition_width = 100, premake = 2");
    db.exec("SELECT outbox_drop_empty_partitions()");
    db.exec("SELECT outbox_group_create('g', start_at => 'beginning')");
    db.exec("SELECT inbox_consumer_create('c', 'worker')");
    db.exec("CREATE TABLE public.seen (key text)");
    db.exec("GRANT INSERT ON public.seen TO worker");
    db.exec("CREATE FUNCTION public.note(key text) RETURNS void LANGUAGE sql AS $$ INSERT INTO public.seen VALUES (key) $$");
    {
        PgConnection writer(pg.conninfo("app", "writer"), "tests");
        for (int i = 0; i < 3; ++i) writer.exec("SELECT outbox_emit('t', 'k' || $1, '{}')", {std::to_string(i)});
    }
    ASSERT_EQ(query_column(db, "SELECT count(*) FROM outbox.event_default")[0], "3");

    auto publisher = relay({"publish", "--group", "g", "--pg", pg.conninfo("app", "relay_user"), "--redis",
                            redis.address(), "--poll-interval", "50ms", "--maintain-interval", "200ms", "--stream",
                            "s"},
                           dir.path() + "/publish.log");
    auto consumer = relay({"consume", "--consumer", "c", "--stream", "s", "--pg", pg.conninfo("app", "worker"),
                           "--redis", redis.address(), "--handler", "SELECT public.note($2)", "--block", "100ms"},
                          dir.path() + "/consume.log");
    EXPECT_TRUE(eventually([&] { return query_column(db, "SELECT count(*) FROM public.seen")[0] == "3"; }, 30s))
        << publisher->log() << consumer->log();
    EXPECT_TRUE(eventually([&] { return query_column(db, "SELECT count(*) FROM outbox.event_default")[0] == "0"; },
                           30s))
        << publisher->log();
    EXPECT_TRUE(eventually(
        [&] { return publisher->log().find("partition maintenance: moved outbox.event_") != std::string::npos; }, 10s))
        << publisher->log();
    EXPECT_TRUE(publisher->running()) << publisher->log();
    EXPECT_TRUE(consumer->running()) << consumer->log();
    EXPECT_EQ(publisher->log().find("permission denied"), std::string::npos) << publisher->log();
    EXPECT_EQ(consumer->log().find("permission denied"), std::string::npos) << consumer->log();
}
