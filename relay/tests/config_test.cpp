#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/errors.hpp"

using namespace pg_outbox;
using namespace std::chrono_literals;

namespace {

ParseResult parse(std::vector<const char*> args) {
    args.insert(args.begin(), "pg_outbox_relay");
    return parse_command_line(static_cast<int>(args.size()), args.data());
}

}  // namespace

TEST(Duration, ParsesUnits) {
    EXPECT_EQ(parse_duration("250"), 250ms);
    EXPECT_EQ(parse_duration("250ms"), 250ms);
    EXPECT_EQ(parse_duration("2s"), 2000ms);
    EXPECT_EQ(parse_duration("1m"), 60000ms);
    EXPECT_THROW(parse_duration(""), ConfigError);
    EXPECT_THROW(parse_duration("fast"), ConfigError);
    EXPECT_THROW(parse_duration("-5ms"), ConfigError);
    EXPECT_THROW(parse_duration("5h"), ConfigError);
}

TEST(RedisAddress, ParsesTcpAndUnix) {
    auto a = RedisAddress::parse("10.0.0.5:6380");
    EXPECT_EQ(a.host, "10.0.0.5");
    EXPECT_EQ(a.port, 6380);
    EXPECT_TRUE(a.unix_path.empty());
    EXPECT_EQ(RedisAddress::parse("localhost").port, 6379);
    EXPECT_EQ(RedisAddress::parse("[::1]:7000").host, "::1");
    EXPECT_EQ(RedisAddress::parse("unix:/run/redis.sock").unix_path, "/run/redis.sock");
    EXPECT_EQ(RedisAddress::parse("/tmp/r.sock").unix_path, "/tmp/r.sock");
    EXPECT_EQ(RedisAddress::parse("/tmp/r.sock").to_string(), "unix:/tmp/r.sock");
    EXPECT_THROW(RedisAddress::parse("host:0"), ConfigError);
    EXPECT_THROW(RedisAddress::parse("host:70000"), ConfigError);
    EXPECT_THROW(RedisAddress::parse("host:port"), ConfigError);
    EXPECT_THROW(RedisAddress::parse(":6379"), ConfigError);
    EXPECT_THROW(RedisAddress::parse("unix:"), ConfigError);
}

TEST(StreamKey, ExpandsTopicAndGroupKeepsHashTags) {
    EXPECT_EQ(expand_stream_key("outbox:{topic}", "orders", "g"), "outbox:orders");
    EXPECT_EQ(expand_stream_key("outbox:{{topic}}", "orders", "g"), "outbox:{orders}");
    EXPECT_EQ(expand_stream_key("{group}:{topic}", "orders", "billing"), "billing:orders");
    EXPECT_EQ(expand_stream_key("all-events", "orders", "g"), "all-events");
    EXPECT_EQ(expand_stream_key("{topi", "orders", "g"), "{topi");
}

TEST(CommandLine, PublishWithDefaults) {
    auto r = parse({"publish", "--group", "billing"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->mode, Config::Mode::publish);
    EXPECT_EQ(r.config->group, "billing");
    EXPECT_EQ(r.config->batch_size, 1000);
    EXPECT_EQ(r.config->poll_interval, 500ms);
    EXPECT_EQ(r.config->stream_template, "outbox:{topic}");
    EXPECT_EQ(r.config->id_mode, IdMode::explicit_position);
    EXPECT_EQ(r.config->redis.port, 6379);
    EXPECT_TRUE(r.config->listen);
    EXPECT_EQ(r.config->maintain_interval, 60000ms);
    EXPECT_EQ(parse({"publish", "--group", "g", "--maintain-interval", "0"}).config->maintain_interval, 0ms);
    EXPECT_FALSE(parse({"publish", "--group", "g", "--no-listen"}).config->listen);
}

TEST(CommandLine, CommonOptionsBeforeOrAfterTheMode) {
    auto r = parse({"--redis", "127.0.0.1:7001", "publish", "--group", "g", "--log-level", "debug",
                    "--poll-interval", "2s", "--maxlen", "1000", "--id-mode", "redis", "--log-format", "json"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->redis.port, 7001);
    EXPECT_EQ(r.config->log_level, "debug");
    EXPECT_EQ(r.config->poll_interval, 2000ms);
    EXPECT_EQ(r.config->maxlen, 1000);
    EXPECT_EQ(r.config->id_mode, IdMode::redis_generated);
    EXPECT_EQ(r.config->log_format, LogFormat::json);
}

TEST(CommandLine, EnvironmentVariables) {
    ::setenv("PG_OUTBOX_GROUP", "from-env", 1);
    ::setenv("PG_OUTBOX_BATCH_SIZE", "77", 1);
    auto r = parse({"publish"});
    ::unsetenv("PG_OUTBOX_GROUP");
    ::unsetenv("PG_OUTBOX_BATCH_SIZE");
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->group, "from-env");
    EXPECT_EQ(r.config->batch_size, 77);
}

TEST(CommandLine, BadSettingsExitNonZero) {
    EXPECT_NE(parse({}).exit_code, 0);                                               // no mode
    EXPECT_NE(parse({"publish"}).exit_code, 0);                                      // no group
    EXPECT_NE(parse({"publish", "--group", "g", "--batch-size", "0"}).exit_code, 0);  // out of range
    EXPECT_NE(parse({"publish", "--group", "g", "--batch-size", "x"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--poll-interval", "soon"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--redis", "host:99999"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--log-level", "loud"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--id-mode", "uuid"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--retry-min", "5s", "--retry-max", "1s"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--unknown"}).exit_code, 0);
    EXPECT_FALSE(parse({"publish", "--group", "g", "--batch-size", "0"}).config);
}

TEST(CommandLine, HelpExitsZero) {
    auto r = parse({"--help"});
    EXPECT_FALSE(r.config);
    EXPECT_EQ(r.exit_code, 0);
}

TEST(CommandLine, ConsumeWithDefaults) {
    auto r = parse({"consume", "--consumer", "accounting", "--stream", "outbox:a,outbox:b", "--stream", "outbox:c",
                    "--handler", "SELECT 1"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->mode, Config::Mode::consume);
    EXPECT_EQ(r.config->streams, (std::vector<std::string>{"outbox:a", "outbox:b", "outbox:c"}));
    EXPECT_EQ(r.config->consumer_group, "accounting");
    EXPECT_NE(r.config->worker.find(':'), std::string::npos);
    EXPECT_EQ(r.config->consume_batch_size, 100);
    EXPECT_EQ(r.config->min_idle, 30000ms);
    EXPECT_EQ(r.config->max_deliveries, 5);
    EXPECT_EQ(r.config->start_id, "0");
}

TEST(CommandLine, ConsumeBadSettings) {
    EXPECT_NE(parse({"consume", "--stream", "s", "--handler", "SELECT 1"}).exit_code, 0);
    EXPECT_NE(parse({"consume", "--consumer", "c", "--handler", "SELECT 1"}).exit_code, 0);
    EXPECT_NE(parse({"consume", "--consumer", "c", "--stream", "s"}).exit_code, 0);
    EXPECT_NE(parse({"consume", "--consumer", "c", "--stream", "s", "--handler", "x", "--start", "1-1"}).exit_code, 0);
    EXPECT_NE(parse({"consume", "--consumer", "c", "--stream", "s", "--handler", "x", "--max-deliveries", "0"}).exit_code, 0);
    EXPECT_NE(parse({"consume", "--consumer", "c", "--stream", "s", "--handler", "x", "--min-idle", "later"}).exit_code, 0);
}
