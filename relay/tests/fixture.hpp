// A test fixture with a throwaway PostgreSQL (database "app" with the
// extension and a group "g") and Redis, and relay processes.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "servers.hpp"

namespace pg_outbox::testing {

inline const std::vector<std::string> kTopics{"orders", "payments", "audit"};

class RelayTest : public ::testing::Test {
protected:
    void SetUp() override { start_servers(false); }

    void start_servers(bool aof) {
        dir_ = make_temp_dir("pg_outbox_test_");
        pg_ = std::make_unique<PgServer>();
        redis_ = std::make_unique<RedisServer>(aof);
        conninfo_ = pg_->create_database("app");
        PgConnection admin(conninfo_, "tests");
        admin.exec("CREATE ROLE relay_user LOGIN IN ROLE outbox_relay");
        admin.exec("SELECT outbox_group_create('g', start_at => 'beginning')");
    }

    void TearDown() override {
        processes_.clear();
        redis_.reset();
        pg_.reset();
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }

    Process& start_process(const std::vector<std::string>& args) {
        const auto log = dir_ + "/process" + std::to_string(processes_.size()) + ".log";
        processes_.push_back(std::make_unique<Process>(args, log));
        return *processes_.back();
    }

    Process& start_relay(const std::vector<std::string>& extra = {}) {
        std::vector<std::string> args{PG_OUTBOX_RELAY_BINARY, "publish", "--group", "g",
                                      "--pg", pg_->conninfo("app", "relay_user"),
                                      "--redis", redis_->address(), "--poll-interval", "50ms",
                                      "--retry-min", "20ms", "--retry-max", "300ms",
                                      "--stats-interval", "500ms", "--batch-size", "100", "--log-level", "debug"};
        args.insert(args.end(), extra.begin(), extra.end());
        return start_process(args);
    }

    PgConnection connect() { return PgConnection(conninfo_, "tests"); }

    // Emits n committed events, one transaction each, on rotating topics;
    // the payload carries n and an amount.
    void emit(int n, int from = 0) {
        auto pg = connect();
        for (int i = from; i < from + n; ++i)
            pg.exec("SELECT outbox_emit($1, $2, jsonb_build_object('n', $3::int, 'amount', 10))",
                    {kTopics[i % kTopics.size()], "k" + std::to_string(i), std::to_string(i)});
    }

    std::size_t committed_count() {
        auto pg = connect();
        return std::stoul(query_column(pg, "SELECT count(*) FROM outbox.event")[0]);
    }

    std::size_t published_count() {
        auto redis = redis_->connect();
        std::size_t n = 0;
        for (const auto& t : kTopics) n += read_stream(redis, "outbox:" + t).size();
        return n;
    }

    bool wait_all_published(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
        return eventually([&] { return published_count() >= committed_count(); }, timeout,
                          std::chrono::milliseconds(100));
    }

    std::string dir_;
    std::string conninfo_;
    std::unique_ptr<PgServer> pg_;
    std::unique_ptr<RedisServer> redis_;
    std::vector<std::unique_ptr<Process>> processes_;
};

}  // namespace pg_outbox::testing
