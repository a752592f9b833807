// Redis's error replies as typed exceptions (redis_error.hpp), and the
// pipeline reader: each code its class, MOVED and ASK parsed once with
// their hostile variants, the message as the callers wrote it before.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <typeinfo>
#include <vector>

#include "pg_outbox/redis.hpp"
#include "pg_outbox/redis_error.hpp"

using namespace pg_outbox;

namespace {

// A reply as hiredis allocates it, freed by freeReplyObject().
RedisReply make_reply(int type, std::string_view text) {
    auto* r = static_cast<redisReply*>(std::calloc(1, sizeof(redisReply)));
    r->type = type;
    if (type == REDIS_REPLY_ERROR || type == REDIS_REPLY_STATUS || type == REDIS_REPLY_STRING) {
        r->str = static_cast<char*>(std::malloc(text.size() + 1));
        std::memcpy(r->str, text.data(), text.size());
        r->str[text.size()] = '\0';
        r->len = text.size();
    }
    return RedisReply(r);
}

// The exception throw_error() throws for "text", caught as its base.
template <class F>
std::exception_ptr caught(F&& f) {
    try {
        f();
    } catch (...) {
        return std::current_exception();
    }
    return nullptr;
}

}  // namespace

// Each code Redis answers with has its class; every class is a
// ReplyError and a RedisError of kind reply, with the reply's first word
// as code().
TEST(RedisErrorTest, EachCodeHasItsClass) {
    struct Case {
        const char* text;
        bool (*is)(const std::exception_ptr&);
        const char* code;
    };
    const Case cases[] = {
        {"OOM command not allowed when used memory > 'maxmemory'.", error_is<OomError>, "OOM"},
        {"READONLY You can't write against a read only replica.", error_is<ReadOnlyError>, "READONLY"},
        {"NOSCRIPT No matching script. Please use EVAL.", error_is<NoScriptError>, "NOSCRIPT"},
        {"BUSYGROUP Consumer Group name already exists", error_is<BusyGroupError>, "BUSYGROUP"},
        {"WRONGTYPE Operation against a key holding the wrong kind of value", error_is<WrongTypeError>,
         "WRONGTYPE"},
        {"NOGROUP No such key 's' or consumer group 'g'", error_is<NoGroupError>, "NOGROUP"},
        {"LOADING Redis is loading the dataset in memory", error_is<LoadingError>, "LOADING"},
        {"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
         error_is<MasterDownError>, "MASTERDOWN"},
        {"TRYAGAIN Multiple keys request during rehashing of slot", error_is<TryAgainError>, "TRYAGAIN"},
        {"CLUSTERDOWN The cluster is down", error_is<ClusterDownError>, "CLUSTERDOWN"},
        {"NOPERM this user has no permissions to run the 'multi' command", error_is<NoPermError>, "NOPERM"},
        {"NOAUTH Authentication required.", error_is<AuthError>, "NOAUTH"},
        {"WRONGPASS invalid username-password pair or user is disabled.", error_is<AuthError>, "WRONGPASS"},
        {"MOVED 3999 127.0.0.1:6381", error_is<MovedError>, "MOVED"},
        {"ASK 3999 127.0.0.1:6381", error_is<AskError>, "ASK"},
        {"ERR unknown command 'FOO'", error_is<ReplyError>, "ERR"},
        {"EXECABORT Transaction discarded because of previous errors.", error_is<ReplyError>, "EXECABORT"},
        {"BUSY Redis is busy running a script.", error_is<ReplyError>, "BUSY"},
    };
    for (const auto& c : cases) {
        const auto reply = make_reply(REDIS_REPLY_ERROR, c.text);
        const auto e = caught([&] { throw_error(*reply); });
        ASSERT_TRUE(e) << c.text;
        EXPECT_TRUE(c.is(e)) << c.text;
        EXPECT_TRUE(error_is<ReplyError>(e)) << c.text;
        try {
            std::rethrow_exception(e);
        } catch (const ReplyError& r) {
            EXPECT_EQ(r.kind(), RedisError::Kind::reply);
            EXPECT_EQ(r.code(), c.code);
            EXPECT_EQ(std::string(r.what()), c.text);
            EXPECT_EQ(r.text(), c.text);
        }
        // The text alone gives the same, and make_error() keeps it.
        EXPECT_TRUE(c.is(make_error(c.text))) << c.text;
    }
    // A class is not mistaken for another.
    EXPECT_FALSE(error_is<OomError>(make_error("READONLY x")));
    EXPECT_FALSE(error_is<RedirectionError>(make_error("TRYAGAIN x")));
    EXPECT_FALSE(error_is<MovedError>(make_error("ASK 1 h:1")));
    EXPECT_FALSE(error_is<ReplyError>(nullptr));
}

// The message is the reply after the caller's context and before its
// detail, as the callers wrote it by hand before; the code stays the
// reply's whatever the context.
TEST(RedisErrorTest, ContextAndDetail) {
    const auto reply = make_reply(REDIS_REPLY_ERROR, "OOM command not allowed");
    try {
        throw_error(*reply, "XINFO STREAM s", "event e at 0/1 to stream \"s\"");
        FAIL() << "no exception";
    } catch (const OomError& e) {
        EXPECT_STREQ(e.what(), "XINFO STREAM s: OOM command not allowed (event e at 0/1 to stream \"s\")");
        EXPECT_EQ(e.code(), "OOM");
        EXPECT_EQ(e.text(), "OOM command not allowed");
    }
    try {
        throw_error(*reply, "MULTI");
        FAIL() << "no exception";
    } catch (const RedisError& e) {
        EXPECT_STREQ(e.what(), "MULTI: OOM command not allowed");
        EXPECT_EQ(e.code(), "OOM");
    }
}

// A MOVED or ASK is parsed once, into the error: slot, host and port, an
// IPv6 host bare (as Redis prints it) or in brackets, an empty host.
TEST(RedisErrorTest, RedirectionsCarryTheirSlotAndAddress) {
    try {
        throw_error("MOVED 16383 10.0.0.2:7001");
        FAIL() << "no exception";
    } catch (const MovedError& e) {
        EXPECT_EQ(e.slot(), 16383);
        EXPECT_EQ(e.host(), "10.0.0.2");
        EXPECT_EQ(e.port(), 7001);
        EXPECT_EQ(e.redirect().kind, Redirect::Kind::moved);
    }
    try {
        throw_error("ASK 0 ::1:7000");
        FAIL() << "no exception";
    } catch (const AskError& e) {
        EXPECT_EQ(e.slot(), 0);
        EXPECT_EQ(e.host(), "::1");
        EXPECT_EQ(e.port(), 7000);
        EXPECT_EQ(e.redirect().kind, Redirect::Kind::ask);
    }
    try {
        throw_error("MOVED 12 [fe80::1:2]:6379");
        FAIL() << "no exception";
    } catch (const RedirectionError& e) {
        EXPECT_EQ(e.host(), "fe80::1:2");
        EXPECT_EQ(e.port(), 6379);
    }
    try {
        throw_error("MOVED 4 :6380");
        FAIL() << "no exception";
    } catch (const MovedError& e) {
        EXPECT_EQ(e.host(), "");  // the node does not know its endpoint
        EXPECT_EQ(e.port(), 6380);
    }
}

// A redirection that does not parse is never followed: it is a plain
// ReplyError with the code it starts with.
TEST(RedisErrorTest, HostileRedirectionsAreNotFollowed) {
    for (const char* text :
         {"MOVED", "MOVED ", "MOVED 1", "MOVED 1 ", "MOVED 1 host", "MOVED 1 host:", "MOVED x host:1",
          "MOVED -1 host:1", "MOVED 16384 host:1", "MOVED 99999999999999999999 host:1", "MOVED 1 host:0",
          "MOVED 1 host:65536", "MOVED 1 host:1x", "MOVED 1 host:1 trailing", "MOVED  1 host:1",
          "MOVED 1.5 host:1", "MOVED 0x10 host:1", "ASK", "ASK 1 [::1:7000", "ASK 1 [::1]x:7000", "ASK 1 ho\nst:1",
          "ASK one two:3"}) {
        const auto e = make_error(text);
        EXPECT_TRUE(error_is<ReplyError>(e)) << text;
        EXPECT_FALSE(error_is<RedirectionError>(e)) << text;
        try {
            std::rethrow_exception(e);
        } catch (const ReplyError& r) {
            EXPECT_EQ(r.code(), std::string(text).rfind("ASK", 0) == 0 ? "ASK" : "MOVED") << text;
        }
    }
    // A NUL inside the host, and a host longer than any name.
    EXPECT_FALSE(error_is<RedirectionError>(make_error(std::string("MOVED 1 h\0st:1", 14))));
    EXPECT_FALSE(error_is<RedirectionError>(make_error("MOVED 1 " + std::string(256, 'h') + ":1")));
    EXPECT_TRUE(error_is<MovedError>(make_error("MOVED 1 " + std::string(255, 'h') + ":1")));
}

// Texts no server should send: the code is "other" unless the first word
// is 1 to 32 capital letters; the text, whatever its size or bytes, is
// kept whole.
TEST(RedisErrorTest, HostileTexts) {
    EXPECT_EQ(reply_error_code(""), "other");
    EXPECT_EQ(reply_error_code(" OOM"), "other");
    EXPECT_EQ(reply_error_code("oom x"), "other");
    EXPECT_EQ(reply_error_code("OOM2 x"), "other");
    EXPECT_EQ(reply_error_code("PGOUTBOX_FOREIGN x"), "other");
    EXPECT_EQ(reply_error_code(std::string(32, 'A')), std::string(32, 'A'));
    EXPECT_EQ(reply_error_code(std::string(33, 'A') + " x"), "other");
    EXPECT_EQ(reply_error_code("OOM"), "OOM");

    const std::string huge = "OOM " + std::string(1 << 20, 'x');
    try {
        throw_error(huge, "XADD");
        FAIL() << "no exception";
    } catch (const OomError& e) {
        EXPECT_EQ(e.text().size(), huge.size());
        EXPECT_EQ(std::string(e.what()).size(), huge.size() + 6);
    }
    const auto word = make_error(std::string(1 << 20, 'A'));
    EXPECT_TRUE(error_is<ReplyError>(word));
    EXPECT_FALSE(error_is<OomError>(word));
    const std::string with_nul("ERR a\0b", 7);
    try {
        throw_error(*make_reply(REDIS_REPLY_ERROR, with_nul));
        FAIL() << "no exception";
    } catch (const ReplyError& e) {
        EXPECT_EQ(e.text(), with_nul);
        EXPECT_EQ(e.code(), "ERR");
    }
    // An empty error reply, and one without text at all.
    const auto empty = make_error(*make_reply(REDIS_REPLY_ERROR, ""));
    EXPECT_TRUE(error_is<ReplyError>(empty));
    auto none = make_reply(REDIS_REPLY_ERROR, "x");
    std::free(none->str);
    none->str = nullptr;
    none->len = 0;
    EXPECT_TRUE(error_is<ReplyError>(make_error(*none)));
}

// throw_error() of a reply that is no error says what came instead.
TEST(RedisErrorTest, NotAnErrorReply) {
    const auto status = make_reply(REDIS_REPLY_STATUS, "OK");
    try {
        throw_error(*status, "SCRIPT LOAD");
        FAIL() << "no exception";
    } catch (const ReplyError& e) {
        EXPECT_EQ(std::string(e.what()).rfind("SCRIPT LOAD: unexpected reply of type", 0), 0u) << e.what();
        EXPECT_EQ(e.code(), "other");
    }
    EXPECT_FALSE(is_error(status.get()));
    EXPECT_FALSE(is_error(nullptr));
    EXPECT_TRUE(is_error(make_reply(REDIS_REPLY_ERROR, "ERR").get()));
}

// The pipeline reader: get() throws the typed error of an error reply,
// raw() hands it over as it is, the others are read as they are.
TEST(RepliesTest, GetThrowsTypedRawDoesNot) {
    std::vector<RedisReply> v;
    v.push_back(make_reply(REDIS_REPLY_STATUS, "OK"));
    v.push_back(make_reply(REDIS_REPLY_ERROR, "WRONGTYPE Operation against a key holding the wrong kind of value"));
    v.push_back(make_reply(REDIS_REPLY_ERROR, "MOVED 7 127.0.0.1:7002"));
    v.push_back(make_reply(REDIS_REPLY_NIL, ""));
    Replies replies(std::move(v));
    ASSERT_EQ(replies.size(), 4u);
    EXPECT_EQ(reply_text(&replies.get(0)), "OK");
    EXPECT_THROW(replies.get(1), WrongTypeError);
    try {
        replies.get(1, "XADD s");
        FAIL() << "no exception";
    } catch (const WrongTypeError& e) {
        EXPECT_EQ(std::string(e.what()).rfind("XADD s: WRONGTYPE", 0), 0u) << e.what();
    }
    try {
        replies.get(2);
        FAIL() << "no exception";
    } catch (const MovedError& e) {
        EXPECT_EQ(e.slot(), 7);
        EXPECT_EQ(e.port(), 7002);
    }
    EXPECT_TRUE(is_error(&replies.raw(1)));
    EXPECT_EQ(replies.get(3).type, REDIS_REPLY_NIL);
    // Out of range is the caller's mistake, not Redis's.
    EXPECT_THROW(replies.get(4), std::out_of_range);
    EXPECT_THROW(replies.raw(99), std::out_of_range);
    // A reply taken is the caller's; the others stay.
    auto taken = replies.take(0);
    EXPECT_EQ(reply_text(taken.get()), "OK");
    EXPECT_THROW(replies.raw(0), std::logic_error);
    EXPECT_THROW(replies.get(2), MovedError);
    EXPECT_EQ(Replies().size(), 0u);
}
