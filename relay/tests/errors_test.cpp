#include <gtest/gtest.h>

#include "pg_outbox/backoff.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/group_session.hpp"

using namespace pg_outbox;
using namespace std::chrono_literals;

TEST(Errors, TransientSqlstates) {
    for (const char* s : {"08000", "08006", "08001", "40001", "40P01", "57P01", "57P02", "57P03", "53300"})
        EXPECT_TRUE(is_transient_sqlstate(s)) << s;
    for (const char* s : {"42704", "55000", "22023", "42501", "XX000", "", "08"})
        EXPECT_FALSE(is_transient_sqlstate(s)) << s;
}

TEST(Errors, PgErrorRetryable) {
    EXPECT_TRUE(PgError("gone", "", true).retryable());
    EXPECT_TRUE(PgError("shutdown", "57P01", false).retryable());
    EXPECT_FALSE(PgError("no group", "42704", false).retryable());
    EXPECT_FALSE(PgError("ahead", "55000", false).retryable());
}

TEST(Errors, PgErrorCarriesTheStatement) {
    EXPECT_EQ(PgError("failed", "OB002", false, "pg_outbox_fetch").statement(), "pg_outbox_fetch");
    EXPECT_EQ(PgError("gone", "", true).statement(), "");
}

TEST(Errors, RedisErrorCode) {
    EXPECT_EQ(RedisError(RedisError::Kind::io, "reset").code(), "io");
    EXPECT_EQ(RedisError(RedisError::Kind::reply, "OOM command not allowed").code(), "OOM");
    EXPECT_EQ(RedisError(RedisError::Kind::reply, "READONLY You can't write").code(), "READONLY");
    EXPECT_EQ(RedisError(RedisError::Kind::reply, "weird error").code(), "other");
}

TEST(Backoff, GrowsWithJitterAndCaps) {
    Backoff b(100ms, 1000ms);
    for (int i = 0; i < 20; ++i) {
        auto d = b.next();
        EXPECT_GE(d.count(), 1);
        EXPECT_LE(d, 1000ms);
    }
    b.reset();
    auto first = b.next();
    EXPECT_GE(first, 50ms);
    EXPECT_LE(first, 100ms);
}

TEST(Errors, ConsumeFaults) {
    for (const char* s : {"22021", "22P02", "22P05", "23505", "P0001", "OB001", "54000", "57014", "XX000", "", "4"})
        EXPECT_EQ(classify_sqlstate(s), Fault::entry) << s;
    for (const char* s : {"42883", "42601", "42501", "42P01", "42703", "28000", "3F000", "3D000", "25006", "OB005"})
        EXPECT_EQ(classify_sqlstate(s), Fault::configuration) << s;
    // A handler that misuses the transaction or the session (a function
    // it calls commits, or EXECUTEs transaction control): the same for
    // every entry, never the entry's.
    for (const char* s : {"25001", "25P01", "25P02", "25000", "2D000", "3B000", "3B001", "0B000", "26000", "0A000"})
        EXPECT_EQ(classify_sqlstate(s), Fault::configuration) << s;
    for (const char* s : {"08006", "40001", "40P01", "57P01", "57P03", "53300"})
        EXPECT_EQ(classify_sqlstate(s), Fault::transient) << s;
    EXPECT_STREQ(to_string(Fault::configuration), "configuration");
}

TEST(Errors, EventTooLargeNamesItsPosition) {
    EXPECT_EQ(too_large_position("outbox_fetch_packed (statement pg_outbox_fetch): ERROR:  event at position "
                                 "1785-3 of group \"g\" is too large to publish\nDETAIL:  ..."),
              "1785-3");
    EXPECT_EQ(too_large_position("event at position 18446744073709551615-9223372036854775807 of group \"a/1\""),
              "18446744073709551615-9223372036854775807");
    EXPECT_EQ(too_large_position("event at position x-1 of group"), "");
    EXPECT_EQ(too_large_position(""), "");
}
