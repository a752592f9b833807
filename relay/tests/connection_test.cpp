// The connections' error boundaries, on throwaway servers: a Redis error
// reply becomes an exception unless read raw, and a PostgreSQL error names
// its statement.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "pg_outbox/config.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/redis_error.hpp"
#include "pg_outbox/redis_target.hpp"
#include "servers.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;

// Error replies become RedisError at the connection, with the reply's
// first word as code; command_raw() returns them as they are.
TEST(RedisConnectionTest, ErrorRepliesThrowUnlessRaw) {
    RedisServer server;
    auto redis = server.connect();
    redis.command({"SET", "text", "not a stream"});
    try {
        redis.command({"XADD", "text", "*", "f", "v"});
        FAIL() << "no exception";
    } catch (const RedisError& e) {
        EXPECT_EQ(e.kind(), RedisError::Kind::reply);
        EXPECT_EQ(e.code(), "WRONGTYPE");
    }
    try {
        redis.command({"XADD", "text", "*", "f", "v"}, "XADD text");
        FAIL() << "no exception";
    } catch (const RedisError& e) {
        EXPECT_EQ(std::string(e.what()).rfind("XADD text: WRONGTYPE", 0), 0u) << e.what();
    }
    auto raw = redis.command_raw({"XADD", "text", "*", "f", "v"});
    EXPECT_EQ(raw->type, REDIS_REPLY_ERROR);
    EXPECT_EQ(reply_text(redis.command({"PING"}).get()), "PONG");  // the connection goes on
}

// The pipeline reader reads every reply of a pipeline, error replies
// included, so that the connection stays in step; get() throws an error
// reply's typed error, raw() hands it over.
TEST(RedisConnectionTest, PipelineReaderReadsEveryReply) {
    RedisServer server;
    auto redis = server.connect();
    redis.append({"SET", "text", "not a stream"});
    redis.append({"XADD", "text", "*", "f", "v"});
    redis.append({"XREADGROUP", "GROUP", "nogroup", "c", "STREAMS", "nostream", ">"});
    redis.append({"GET", "text"});
    const auto replies = redis.read_replies(4);
    ASSERT_EQ(replies.size(), 4u);
    EXPECT_EQ(reply_text(&replies.get(0)), "OK");
    EXPECT_THROW(replies.get(1, "XADD text"), WrongTypeError);
    EXPECT_THROW(replies.get(2), NoGroupError);
    EXPECT_TRUE(is_error(&replies.raw(1)));
    EXPECT_EQ(reply_text(&replies.get(3)), "not a stream");
    EXPECT_EQ(reply_text(redis.command({"PING"}).get()), "PONG");  // the connection goes on
    // command() throws the same classes.
    EXPECT_THROW(redis.command({"XADD", "text", "*", "f", "v"}), WrongTypeError);
    EXPECT_THROW(redis.command({"EVALSHA", std::string(40, 'a'), "0"}), NoScriptError);
    redis.command({"XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"});
    EXPECT_THROW(redis.command({"XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"}), BusyGroupError);
}

// One server behind the target interface: every key on its connection,
// the connection handed to on_connect() at once, no redirection followed,
// transactions not per slot, and the typed errors of the connection.
TEST(RedisConnectionTest, OneServerAsATarget) {
    RedisServer server;
    auto target = RedisTarget::connect(RedisAddress::parse(server.address()), "", 0, std::chrono::seconds(5));
    EXPECT_FALSE(target->per_slot());
    EXPECT_EQ(&target->node_for("a"), &target->node_for("{b}c"));
    int connected = 0;
    target->on_connect([&](RedisConnection& c) {
        ++connected;
        EXPECT_EQ(&c, &target->node_for("a"));
    });
    EXPECT_EQ(connected, 1);
    target->command("k", {"SET", "k", "v"});
    EXPECT_EQ(reply_text(target->command("k", {"GET", "k"}).get()), "v");
    EXPECT_THROW(target->command("k", {"XADD", "k", "*", "f", "v"}, "XADD k"), WrongTypeError);
    EXPECT_TRUE(is_error(target->command_raw("k", {"XADD", "k", "*", "f", "v"}).get()));
    // An acknowledgement's error reply is logged, never thrown, and the
    // next command reads its own reply.
    target->send_unawaited("k", {"XACK", "k", "g", "1-1"}, "XACK k");
    EXPECT_EQ(reply_text(target->command("k", {"PING"}).get()), "PONG");
    EXPECT_EQ(target->redirected(Redirect{Redirect::Kind::ask, 1, "127.0.0.1", 1}, "k"), nullptr);
    EXPECT_FALSE(target->fault());  // not found through Sentinel: still of use
    EXPECT_EQ(reply_text(target->command("k", {"PING"}).get()), "PONG");
    // A cluster's address is no one server's.
    auto cluster = RedisAddress::parse("redis+cluster://127.0.0.1:1,127.0.0.1:2");
    EXPECT_THROW(RedisConnection(cluster, "", 0, std::chrono::seconds(1)), std::logic_error);
}

// A command sent unawaited is on the wire at once; its reply, an error
// one included, is read before the next command's, never in its place.
TEST(RedisConnectionTest, UnawaitedRepliesAreReadFirst) {
    RedisServer server;
    auto redis = server.connect();
    auto other = server.connect();
    redis.command({"XADD", "s", "1-1", "f", "v"});
    redis.command({"XGROUP", "CREATE", "s", "g", "0"});
    redis.command({"XREADGROUP", "GROUP", "g", "w", "STREAMS", "s", ">"});
    redis.send_unawaited({"XACK", "s", "g", "1-1"}, "XACK s");
    // Sent already: another connection sees the entry acknowledged.
    auto pending = other.command({"XPENDING", "s", "g"});
    EXPECT_EQ(pending->element[0]->integer, 0);
    redis.send_unawaited({"XACK", "s", "no-such-group", "1-1"}, "XACK s");
    redis.send_unawaited({"XACK", "s", "g", "1-1"}, "XACK s");
    EXPECT_EQ(reply_text(redis.command({"ECHO", "mine"}).get()), "mine");
    redis.send_unawaited({"XACK", "s", "g", "1-1"}, "XACK s");
    redis.append({"ECHO", "a"});
    redis.append({"ECHO", "b"});
    EXPECT_EQ(reply_text(redis.get_reply_raw().get()), "a");
    EXPECT_EQ(reply_text(redis.get_reply_raw().get()), "b");
    // A BLOCK sent after it keeps its allowance: on a connection whose
    // timeout is shorter than the BLOCK, its (empty) reply is still waited
    // for, not taken for a dead link.
    RedisConnection short_wait(RedisAddress::parse(server.address()), "", 0, std::chrono::milliseconds(300));
    short_wait.send_unawaited({"XACK", "s", "g", "1-1"}, "XACK s");
    auto r = short_wait.command({"XREAD", "BLOCK", "1000", "STREAMS", "s", "$"});
    EXPECT_EQ(r->type, REDIS_REPLY_NIL);
}

// A failed exec() carries its SQL text; a failed prepared statement its
// name, which the message shows too, whether run at once or pipelined.
TEST(PgConnectionTest, ErrorsNameTheirStatement) {
    PgServer server;
    PgConnection pg(server.conninfo("postgres"), "tests");
    try {
        pg.exec("SELECT 1 / $1::int", {"0"});
        FAIL() << "no exception";
    } catch (const PgError& e) {
        EXPECT_EQ(e.sqlstate(), "22012");
        EXPECT_EQ(e.statement(), "SELECT 1 / $1::int");
    }
    pg.prepare("divide", "SELECT 1 / $1::int");
    pg.send_prepared("divide", {"1"});
    pg.send_prepared("divide", {"0"});
    EXPECT_EQ(pg.receive().get(0, 0), "1");
    try {
        pg.receive();
        FAIL() << "no exception";
    } catch (const PgError& e) {
        EXPECT_EQ(e.statement(), "divide");
        EXPECT_NE(std::string(e.what()).find("(statement divide)"), std::string::npos) << e.what();
    }
    try {
        pg.prepare("broken", "SELECT FROM nowhere");
        FAIL() << "no exception";
    } catch (const PgError& e) {
        EXPECT_EQ(e.sqlstate(), "42P01");
        EXPECT_EQ(e.statement(), "broken");
    }
}
