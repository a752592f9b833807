// handler_refusal(): the consume handlers that cannot run inside
// inbox_consume() are told from their words, whatever the case, the
// white space and the comments around them, and nothing else is.
#include <gtest/gtest.h>

#include <string>

#include "pg_outbox/consumer.hpp"

using namespace pg_outbox;

namespace {

void expect_refused(const std::string& handler, const std::string& naming) {
    const auto why = handler_refusal(handler);
    ASSERT_TRUE(why) << handler;
    EXPECT_NE(why->find(naming), std::string::npos) << handler << ": " << *why;
}

}  // namespace

TEST(Handler, TransactionControlIsRefused) {
    for (const char* h : {"COMMIT", "commit", "  COMMIT;", "END", "ABORT", "BEGIN", "START TRANSACTION",
                          "ROLLBACK", "ROLLBACK TO SAVEPOINT s", "SAVEPOINT s", "RELEASE SAVEPOINT s",
                          "COMMIT PREPARED 'x'", "ROLLBACK PREPARED 'x'", "/* a */ -- b\n\tCommit",
                          "/* nested /* comment */ COMMIT */ ROLLBACK"})
        expect_refused(h, "transaction control");
    expect_refused("PREPARE TRANSACTION 'x'", "PREPARE TRANSACTION is transaction control");
}

TEST(Handler, WhatCannotRunInATransactionBlockIsRefused) {
    expect_refused("VACUUM", "VACUUM cannot run inside a transaction block");
    expect_refused("vacuum (analyze) app.t", "VACUUM");
    expect_refused("CLUSTER", "CLUSTER without a table");
    expect_refused("CLUSTER VERBOSE", "CLUSTER without a table");
    expect_refused("CLUSTER (VERBOSE);", "CLUSTER without a table");
    expect_refused("CREATE DATABASE x", "CREATE DATABASE");
    expect_refused("DROP DATABASE x", "DROP DATABASE");
    expect_refused("CREATE TABLESPACE t LOCATION '/x'", "CREATE TABLESPACE");
    expect_refused("DROP TABLESPACE t", "DROP TABLESPACE");
    expect_refused("ALTER SYSTEM SET work_mem = '1MB'", "ALTER SYSTEM");
    expect_refused("CREATE INDEX CONCURRENTLY i ON t (x)", "CREATE INDEX CONCURRENTLY");
    expect_refused("CREATE UNIQUE INDEX CONCURRENTLY i ON t (x)", "CREATE INDEX CONCURRENTLY");
    expect_refused("DROP INDEX CONCURRENTLY i", "DROP INDEX CONCURRENTLY");
    expect_refused("REINDEX TABLE CONCURRENTLY t", "REINDEX CONCURRENTLY");
    expect_refused("REINDEX (CONCURRENTLY) TABLE t", "REINDEX CONCURRENTLY");
    expect_refused("REINDEX DATABASE app", "REINDEX DATABASE");
    expect_refused("REINDEX SYSTEM app", "REINDEX SYSTEM");
    expect_refused("REINDEX SCHEMA app", "REINDEX SCHEMA");
    expect_refused("COPY t FROM STDIN", "COPY from or to the client");
    expect_refused("copy (SELECT $1) TO stdout", "COPY from or to the client");
}

TEST(Handler, WhatChangesTheSessionIsRefused) {
    for (const char* h : {"SET search_path = accounting", "SET SESSION search_path = x", "SET ROLE other",
                          "SET SESSION AUTHORIZATION other", "set statement_timeout to 0",
                          "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"})
        expect_refused(h, "SET changes the worker's session");
    expect_refused("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", "SET TRANSACTION must come before");
    expect_refused("RESET ALL", "RESET changes the worker's session");
    expect_refused("RESET search_path", "RESET changes the worker's session");
    expect_refused("DISCARD ALL", "DISCARD changes the worker's session");
    expect_refused("DISCARD PLANS", "DISCARD");
    expect_refused("DEALLOCATE ALL", "DEALLOCATE changes the worker's session");
    expect_refused("DEALLOCATE PREPARE x", "DEALLOCATE");
    expect_refused("PREPARE p AS SELECT $1", "PREPARE changes the worker's session");
    expect_refused("LISTEN ch", "LISTEN");
}

TEST(Handler, EverythingElsePasses) {
    for (const char* h : {"SELECT apply($1, $2, $3, $4, $5)", "INSERT INTO t VALUES ($1)",
                          "WITH x AS (SELECT $1) INSERT INTO t SELECT * FROM x", "CALL app.apply($1, $2, $3, $4, $5)",
                          "UPDATE t SET n = n + 1 WHERE k = $2", "DELETE FROM t WHERE k = $2",
                          "SET LOCAL search_path = app", "SET CONSTRAINTS ALL DEFERRED", "NOTIFY ch",
                          "LOCK TABLE t", "CLUSTER t", "CLUSTER VERBOSE t USING i", "REINDEX TABLE t",
                          "CREATE INDEX i ON t (x)", "DROP INDEX i", "COPY t FROM '/tmp/x'", "ANALYZE t",
                          "UNLISTEN *", "SELECT 'COMMIT'", "SELECT $$VACUUM$$", "SELECT \"commit\" FROM t",
                          "-- COMMIT\nSELECT 1", "/* VACUUM */ SELECT 1", "SELECT 1 -- ROLLBACK",
                          "SELECT E'\\'' || 'COMMIT'", "SELECT $tag$ COMMIT $tag$", "(SELECT 1)",
                          "EXPLAIN SELECT 1", "SELECT commit FROM t", "SELECT $1 /* unterminated"})
        EXPECT_FALSE(handler_refusal(h)) << h << ": " << *handler_refusal(h);
}
