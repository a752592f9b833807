// The history checker (test/soak/check.cpp) on small histories written by
// hand: what it counts for a consumer that parks keys
// (--on-failure park-key), beside what it always counted.
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;

// Four events of key k1 in one shard's stream, in feed order 10-1 .. 13-1,
// and one of key k2.
const char* const kCommitted =
    "e1\tt0\t10-1\t100\ts:{0}:t0\tk1\n"
    "e2\tt0\t11-1\t100\ts:{0}:t0\tk1\n"
    "e3\tt0\t12-1\t100\ts:{0}:t0\tk1\n"
    "e4\tt0\t13-1\t100\ts:{0}:t0\tk1\n"
    "e5\tt0\t14-1\t100\ts:{0}:t0\tk2\n";
const char* const kStreams =
    "s:{0}:t0\t10-1\te1\t10-1\n"
    "s:{0}:t0\t11-1\te2\t11-1\n"
    "s:{0}:t0\t12-1\te3\t12-1\n"
    "s:{0}:t0\t13-1\te4\t13-1\n"
    "s:{0}:t0\t14-1\te5\t14-1\n";

class Checker : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/pg_outbox_check_test.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        write("committed.tsv", kCommitted);
        write("streams.tsv", kStreams);
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    void write(const std::string& name, const std::string& text) { std::ofstream(dir_ + "/" + name) << text; }
    // The checker's output and exit status.
    std::pair<std::string, int> check() {
        const std::string cmd = std::string(PG_OUTBOX_CHECK_BINARY) + " " + dir_ + " 2>&1";
        FILE* p = ::popen(cmd.c_str(), "r");
        std::string out;
        char buf[4096];
        for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
        const int status = ::pclose(p);
        return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
    }
    std::string dir_;
};

TEST_F(Checker, ParkedEntriesAreAccountedNotLost) {
    // e2 failed and waits as a dead letter, e3 and e4 are parked behind it.
    write("applied.tsv", "e1\t101\t1\ne5\t101\t2\n");
    write("dead_letters.tsv", "s:{0}:t0\t11-1\te2\t\n");
    write("parked.tsv", "s:{0}:t0\t12-1\te3\ns:{0}:t0\t13-1\te4\n");
    const auto [out, status] = check();
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("parked: 2\n"), std::string::npos) << out;
    EXPECT_NE(out.find("dead-lettered: 1\n"), std::string::npos) << out;
    EXPECT_NE(out.find("lost (committed, never applied nor dead-lettered nor parked): 0\n"), std::string::npos) << out;
    EXPECT_NE(out.find("key order violations (applied after a later event of their key, or dead-lettered and passed "
                       "over): 0\n"),
              std::string::npos)
        << out;
}

TEST_F(Checker, DeadLetterPassedOverIsAKeyOrderViolation) {
    // e2 was dead-lettered and its key went on: e3 and e4 applied.
    write("applied.tsv", "e1\t101\t1\ne3\t101\t2\ne4\t101\t3\ne5\t101\t4\n");
    write("dead_letters.tsv", "s:{0}:t0\t11-1\te2\t\n");
    write("parked.tsv", "");
    const auto [out, status] = check();
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find("passed over): 1\n"), std::string::npos) << out;
    EXPECT_NE(out.find("verdict: FAIL"), std::string::npos) << out;
}

TEST_F(Checker, SkippedDeadLetterIsNoViolation) {
    // An operator gave e2 up (inbox_skip): the rest of its key applies.
    write("applied.tsv", "e1\t101\t1\ne3\t101\t2\ne4\t101\t3\ne5\t101\t4\n");
    write("dead_letters.tsv", "s:{0}:t0\t11-1\te2\tskipped\n");
    write("parked.tsv", "");
    const auto [out, status] = check();
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("passed over): 0\n"), std::string::npos) << out;
}

TEST_F(Checker, WithoutParkedFileADeadLetterMayBePassedOver) {
    // A consumer that skips (no parked.tsv): today's accounting.
    write("applied.tsv", "e1\t101\t1\ne3\t101\t2\ne4\t101\t3\ne5\t101\t4\n");
    write("dead_letters.tsv", "s:{0}:t0\t11-1\te2\n");
    const auto [out, status] = check();
    EXPECT_EQ(status, 0) << out;
    EXPECT_EQ(out.find("parked:"), std::string::npos) << out;
    EXPECT_NE(out.find("key order violations (applied after a later event of their key): 0\n"), std::string::npos)
        << out;
}

TEST_F(Checker, RedrivenKeyInOrderPasses) {
    // After the redrive e2 applied first, then e3 and e4: in order.
    write("applied.tsv", "e1\t101\t1\ne5\t101\t2\ne2\t109\t3\ne3\t109\t4\ne4\t109\t5\n");
    write("dead_letters.tsv", "s:{0}:t0\t11-1\te2\t\n");
    write("parked.tsv", "");
    const auto [out, status] = check();
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("applied: 5\n"), std::string::npos) << out;
}

TEST_F(Checker, RedrivenOutOfOrderFails) {
    // A redrive that applied e3 before e2 breaks the key's order.
    write("applied.tsv", "e1\t101\t1\ne5\t101\t2\ne3\t109\t3\ne2\t109\t4\ne4\t109\t5\n");
    write("dead_letters.tsv", "s:{0}:t0\t11-1\te2\t\n");
    write("parked.tsv", "");
    const auto [out, status] = check();
    EXPECT_EQ(status, 1) << out;
}

}  // namespace
