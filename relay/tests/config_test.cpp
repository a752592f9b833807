#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/pg.hpp"
#include "pg_outbox/stream_writer.hpp"

using namespace pg_outbox;
using namespace std::chrono_literals;

namespace {

ParseResult parse(std::vector<const char*> args) {
    args.insert(args.begin(), "pg_outbox_relay");
    return parse_command_line(static_cast<int>(args.size()), args.data());
}

// The exit code and what was written to stderr.
std::pair<int, std::string> parse_error(std::vector<const char*> args) {
    ::testing::internal::CaptureStderr();
    auto r = parse(std::move(args));
    return {r.exit_code, ::testing::internal::GetCapturedStderr()};
}

std::string config_error(const std::function<void()>& f) {
    try {
        f();
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "(no error)";
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

// A bare address with more than one colon is an IPv6 host on the default
// port; brackets give it a port.
TEST(RedisAddress, BareIpv6IsAHostOnTheDefaultPort) {
    auto a = RedisAddress::parse("::1");
    EXPECT_EQ(a.host, "::1");
    EXPECT_EQ(a.port, 6379);
    EXPECT_EQ(a.to_string(), "[::1]:6379");
    EXPECT_EQ(RedisAddress::parse("fe80::1:6380").host, "fe80::1:6380");
    auto b = RedisAddress::parse("[fe80::1]:6380");
    EXPECT_EQ(b.host, "fe80::1");
    EXPECT_EQ(b.port, 6380);
    EXPECT_EQ(RedisAddress::parse("[::1]").port, 6379);
    EXPECT_THROW(RedisAddress::parse("::1:6380x"), ConfigError);
    EXPECT_THROW(RedisAddress::parse("[::1"), ConfigError);
    EXPECT_THROW(RedisAddress::parse("[nothost]:1"), ConfigError);
    EXPECT_THROW(RedisAddress::parse("[::1]6379"), ConfigError);
}

TEST(RedisAddress, PortsAreStrict) {
    for (const char* bad : {"h:", "h:-1", "h:+1", "h: 1", "h:1 ", "h:65536", "h:0x10", "h:1e3", "h:007000"})
        EXPECT_THROW(RedisAddress::parse(bad), ConfigError) << bad;
    EXPECT_EQ(RedisAddress::parse("h:65535").port, 65535);
    EXPECT_EQ(RedisAddress::parse("h:1").port, 1);
    EXPECT_THROW(RedisAddress::parse("a b:1"), ConfigError);
    EXPECT_THROW(RedisAddress::parse("h/x:1"), ConfigError);
}

TEST(RedisAddress, Urls) {
    auto a = RedisAddress::parse("redis://alice:s%40cret@cache.local:6380/3");
    EXPECT_EQ(a.host, "cache.local");
    EXPECT_EQ(a.port, 6380);
    EXPECT_EQ(a.user, "alice");
    EXPECT_EQ(a.password, "s@cret");
    EXPECT_EQ(a.db, 3);
    EXPECT_EQ(a.to_string(), "cache.local:6380");
    auto b = RedisAddress::parse("redis://:only@[::1]");
    EXPECT_EQ(b.user, "");
    EXPECT_EQ(b.password, "only");
    EXPECT_EQ(b.host, "::1");
    EXPECT_EQ(b.port, 6379);
    EXPECT_FALSE(b.db);
    auto c = RedisAddress::parse("redis://h/");
    EXPECT_EQ(c.host, "h");
    EXPECT_FALSE(c.db);
    EXPECT_TRUE(c.password.empty());
    for (const char* bad : {"redis://", "redis://h:0", "redis://h/x", "redis://h/1?timeout=1", "rediss://h",
                            "http://h", "redis://user@h", "redis://u:@h", "redis://u:%zz@h"})
        EXPECT_THROW(RedisAddress::parse(bad), ConfigError) << bad;
}

// Errors about a URL never show its password.
TEST(RedisAddress, ErrorsHideThePassword) {
    for (const char* bad : {"redis://u:Sekr3t@h:0", "redis://u:Sekr3t@h/x", "redis://Sekr3t@h", "redis://u:Sekr3t@h?x"}) {
        const auto e = config_error([&] { RedisAddress::parse(bad); });
        EXPECT_NE(e, "(no error)") << bad;
        EXPECT_EQ(e.find("Sekr3t"), std::string::npos) << e;
    }
}

TEST(CommandLine, RedisUrlGivesCredentialsAndDatabase) {
    auto r = parse({"--redis", "redis://bob:pw@h:7000/4", "publish", "--group", "g"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->redis.user, "bob");
    EXPECT_EQ(r.config->redis_password, "pw");
    EXPECT_EQ(r.config->redis_db, 4);
    EXPECT_EQ(parse({"--redis", "redis://h/4", "--redis-db", "4", "publish", "--group", "g"}).exit_code, 0);
    auto [code, err] = parse_error({"--redis", "redis://h/4", "--redis-db", "5", "publish", "--group", "g"});
    EXPECT_EQ(code, 2);
    EXPECT_NE(err.find("--redis-db"), std::string::npos) << err;
    auto [code2, err2] =
        parse_error({"--redis", "redis://:pw@h", "--redis-password", "other", "publish", "--group", "g"});
    EXPECT_EQ(code2, 2);
    EXPECT_NE(err2.find("--redis-password"), std::string::npos) << err2;
    EXPECT_EQ(err2.find("other"), std::string::npos) << err2;
}

TEST(ListenAddress, Strict) {
    auto a = ListenAddress::parse("127.0.0.1:9100");
    EXPECT_EQ(a.host, "127.0.0.1");
    EXPECT_EQ(a.port, 9100);
    auto b = ListenAddress::parse(":9100");
    EXPECT_EQ(b.host, "");
    EXPECT_EQ(b.port, 9100);
    EXPECT_EQ(b.to_string(), ":9100");
    auto c = ListenAddress::parse("[::1]:9100");
    EXPECT_EQ(c.host, "::1");
    EXPECT_EQ(c.to_string(), "[::1]:9100");
    EXPECT_EQ(ListenAddress::parse("localhost:1").host, "localhost");
    for (const char* bad : {"", "127.0.0.1:99999", "9abc", "9100", ":0", ":", "host:", "::1:9100", "[::1]",
                            "127.0.0.1:9100x", ":-1", "a b:1", "[x]:1"})
        EXPECT_THROW(ListenAddress::parse(bad), ConfigError) << bad;
}

TEST(CommandLine, MetricsAddressIsCheckedAtOnce) {
    for (const char* bad : {"127.0.0.1:99999", "9abc", ":0"}) {
        auto [code, err] = parse_error({"--metrics-address", bad, "publish", "--group", "g"});
        EXPECT_EQ(code, 2) << bad;
        EXPECT_NE(err.find("--metrics-address"), std::string::npos) << err;
    }
    auto r = parse({"--metrics-address", ":19192", "publish", "--group", "g"});
    ASSERT_TRUE(r.config);
    ASSERT_TRUE(r.config->metrics_address);
    EXPECT_EQ(r.config->metrics_address->host, "");
    EXPECT_EQ(r.config->metrics_address->port, 19192);
    EXPECT_FALSE(parse({"publish", "--group", "g"}).config->metrics_address);
}

// Every error CLI11 finds (an unknown flag, a bad number, a missing value
// or mode) exits 2 naming the flag, like the relay's own checks.
TEST(CommandLine, ParseErrorsExit2NamingTheFlag) {
    const std::vector<std::pair<std::vector<const char*>, std::string>> cases{
        {{"publish", "--group", "g", "--unknown"}, "--unknown"},
        {{"publish", "--group", "g", "--batch-size", "x"}, "--batch-size"},
        {{"publish", "--group", "g", "--batch-size", "0"}, "--batch-size"},
        {{"publish", "--group", "g", "--maxlen", "-1"}, "--maxlen"},
        {{"publish", "--group"}, "--group"},
        {{"publish"}, "--group"},
        {{"--redis-db", "x", "publish", "--group", "g"}, "--redis-db"},
        {{"publish", "--group", "g", "--log-level", "loud"}, "--log-level"},
        {{"consume", "--consumer", "c", "--handler", "x", "--max-deliveries", "many"}, "--max-deliveries"},
        {{}, "publish or consume"},
        {{"bogus"}, "publish or consume"},
    };
    for (const auto& [args, flag] : cases) {
        auto [code, err] = parse_error(args);
        EXPECT_EQ(code, 2) << flag << ": " << err;
        EXPECT_NE(err.find(flag), std::string::npos) << err;
    }
    ::setenv("PG_OUTBOX_BATCH_SIZE", "lots", 1);
    auto [code, err] = parse_error({"publish", "--group", "g"});
    ::unsetenv("PG_OUTBOX_BATCH_SIZE");
    EXPECT_EQ(code, 2);
    EXPECT_NE(err.find("--batch-size"), std::string::npos) << err;
}

TEST(CommandLine, VersionExitsZero) {
    ::testing::internal::CaptureStdout();
    auto r = parse({"--version"});
    ::testing::internal::GetCapturedStdout();
    EXPECT_FALSE(r.config);
    EXPECT_EQ(r.exit_code, 0);
}

TEST(CommandLine, StuckAfter) {
    EXPECT_EQ(parse({"publish", "--group", "g"}).config->stuck_after, 60000ms);
    EXPECT_EQ(parse({"publish", "--group", "g", "--stuck-after", "2s"}).config->stuck_after, 2000ms);
    EXPECT_EQ(parse({"publish", "--group", "g", "--stuck-after", "0"}).config->stuck_after, 0ms);
    EXPECT_EQ(parse_error({"publish", "--group", "g", "--stuck-after", "soon"}).first, 2);
}

// A malformed connection string exits 2 at once, and its message holds no
// part of the password.
TEST(Conninfo, MalformedExits2WithoutThePassword) {
    const std::vector<const char*> bad{
        "host=h password=Super Secret123",
        "password=Super Secret123 host=h",
        "host=h sslpassword=Super Secret123",
        "postgresql://u:Super%zzSecret123@h/db",
        "postgresql://u:Super@Secret123@h/db",
        "postgresql://u:Super/Secret123@h/db",
        "postgresql://u:SuperSecret123@h:notaport/db",
        "host=h password='SuperSecret123",
        "host=h password=SuperSecret123 sslmode=bogus",
        "host=h password=SuperSecret123 port=99999",
        "host=h password=SuperSecret123 target_session_attrs=whatever",
        "host=h password=SuperSecret123 connect_timeout=soon",
        "host=a,b password=SuperSecret123 port=1,2,3",
        "host=h hostaddr=nope password=SuperSecret123",
    };
    for (const char* dsn : bad) {
        auto [code, err] = parse_error({"--pg", dsn, "publish", "--group", "g"});
        EXPECT_EQ(code, 2) << dsn << ": " << err;
        EXPECT_NE(err.find("--pg"), std::string::npos) << err;
        for (const char* piece : {"Super", "Secret", "123"})
            EXPECT_EQ(err.find(piece), std::string::npos) << dsn << ": " << err;
    }
    // Pieces that cannot be a password are kept, to help.
    auto [code, err] = parse_error({"--pg", "host=h sslmode=bogus", "publish", "--group", "g"});
    EXPECT_EQ(code, 2);
    EXPECT_NE(err.find("sslmode \"bogus\""), std::string::npos) << err;
    EXPECT_NE(parse_error({"--pg", "hots=h", "publish", "--group", "g"}).second.find("\"hots\""), std::string::npos);
    ::setenv("PGSSLMODE", "nope", 1);
    auto [env_code, env_err] = parse_error({"--pg", "host=h", "publish", "--group", "g"});
    ::unsetenv("PGSSLMODE");
    EXPECT_EQ(env_code, 2);
    EXPECT_NE(env_err.find("PGSSLMODE"), std::string::npos) << env_err;
}

TEST(Conninfo, ValidStringsPass) {
    for (const char* dsn : {"", "app", "host=h port=5432 dbname=app user=u password='a b' sslmode=require",
                            "postgresql://u:p%40ss@h1:5432,h2:5433/db?target_session_attrs=read-write",
                            "host=a,b port=5432", "host=a,b port=1,2 connect_timeout=' 5 '", "hostaddr=::1",
                            "ssl_min_protocol_version=tlsv1.2"})
        EXPECT_NO_THROW(check_conninfo(dsn)) << dsn;
}

// Logs show the connection string with every password masked, URIs too.
TEST(Conninfo, DescribedWithThePasswordMasked) {
    const auto kv = describe_conninfo("host=h password='Super Secret' dbname=app");
    EXPECT_EQ(kv.find("Super"), std::string::npos) << kv;
    EXPECT_NE(kv.find("password=********"), std::string::npos) << kv;
    EXPECT_NE(kv.find("host=h"), std::string::npos) << kv;
    const auto uri = describe_conninfo("postgresql://u:secret@h/db?sslpassword=other");
    EXPECT_EQ(uri.find("secret"), std::string::npos) << uri;
    EXPECT_EQ(uri.find("other"), std::string::npos) << uri;
    EXPECT_NE(uri.find("user=u"), std::string::npos) << uri;
    EXPECT_NE(uri.find("dbname=db"), std::string::npos) << uri;
    EXPECT_EQ(describe_conninfo("app"), "dbname=app");
}

// Which failures at the first connection are settings, which may pass.
TEST(Conninfo, SettingsFailuresAreToldFromNetworkFailures) {
    EXPECT_TRUE(is_settings_failure("could not connect to PostgreSQL: invalid sslmode value: \"bogus\""));
    EXPECT_TRUE(is_settings_failure("invalid integer value \"x\" for connection option \"keepalives\""));
    EXPECT_TRUE(is_settings_failure("invalid port number: \"99999\""));
    EXPECT_TRUE(is_settings_failure("could not match 3 port numbers to 2 hosts"));
    EXPECT_TRUE(is_settings_failure("definition of service \"nosuch\" not found"));
    EXPECT_FALSE(is_settings_failure("could not translate host name \"db\" to address: Name or service not known"));
    EXPECT_FALSE(is_settings_failure("connection to server at \"127.0.0.1\", port 1 failed: Connection refused"));
    EXPECT_FALSE(is_settings_failure("FATAL:  the database system is starting up"));
}

TEST(StreamKey, ExpandsTopicAndGroupKeepsHashTags) {
    EXPECT_EQ(expand_stream_key("outbox:{topic}", "orders", "g"), "outbox:orders");
    EXPECT_EQ(expand_stream_key("outbox:{{topic}}", "orders", "g"), "outbox:{orders}");
    EXPECT_EQ(expand_stream_key("{group}:{topic}", "orders", "billing"), "billing:orders");
    EXPECT_EQ(expand_stream_key("all-events", "orders", "g"), "all-events");
    EXPECT_EQ(expand_stream_key("{topi", "orders", "g"), "{topi");
    EXPECT_EQ(expand_stream_key("outbox:{topic}:{shard}", "orders", "g", 7), "outbox:orders:7");
    EXPECT_EQ(expand_stream_key("{group}/{shard}", "orders", "billing"), "billing/0");
}

// --group names a group or one shard of it, as the extension does.
TEST(GroupName, SplitsAShardOff) {
    std::string name;
    int shard = 0;
    split_group_name("orders", name, shard);
    EXPECT_EQ(name, "orders");
    EXPECT_EQ(shard, -1);
    split_group_name("orders/0", name, shard);
    EXPECT_EQ(shard, 0);
    split_group_name("orders/255", name, shard);
    EXPECT_EQ(name, "orders");
    EXPECT_EQ(shard, 255);
    for (const char* bad : {"orders/", "orders/01", "orders/-1", "orders/1/2", "orders/ 1", "orders/x", "/0",
                            "orders/1000", "orders/99999999999999999999", "orders/1\n"}) {
        EXPECT_THROW(split_group_name(bad, name, shard), ConfigError) << bad;
    }
    auto r = parse({"publish", "--group", "orders/3"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->group_name(), "orders");
    EXPECT_EQ(r.config->group_shard(), 3);
    Config direct;
    direct.group = "billing";
    EXPECT_EQ(direct.group_name(), "billing");
    EXPECT_EQ(direct.group_shard(), -1);
    // A group that names no valid shard is no group: asking its shard is an error, not "none".
    Config bad;
    bad.group = "orders/01";
    EXPECT_THROW(bad.group_shard(), ConfigError);
    auto [code, err] = parse_error({"publish", "--group", "orders/x\x01"});
    EXPECT_EQ(code, 2);
    EXPECT_NE(err.find("a shard is named"), std::string::npos) << err;
    EXPECT_EQ(err.find('\x01'), std::string::npos) << "control characters are escaped";
}

TEST(CommandLine, PublishWithDefaults) {
    auto r = parse({"publish", "--group", "billing"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->mode, Config::Mode::publish);
    EXPECT_EQ(r.config->group, "billing");
    EXPECT_EQ(r.config->batch_size, 1000);
    EXPECT_EQ(r.config->batch_bytes, 1 << 20);
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
    ::setenv("PG_OUTBOX_BATCH_BYTES", "65536", 1);
    auto r = parse({"publish"});
    ::unsetenv("PG_OUTBOX_GROUP");
    ::unsetenv("PG_OUTBOX_BATCH_SIZE");
    ::unsetenv("PG_OUTBOX_BATCH_BYTES");
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->group, "from-env");
    EXPECT_EQ(r.config->batch_size, 77);
    EXPECT_EQ(r.config->batch_bytes, 65536);
}

TEST(CommandLine, BadSettingsExitNonZero) {
    EXPECT_NE(parse({}).exit_code, 0);                                               // no mode
    EXPECT_NE(parse({"publish"}).exit_code, 0);                                      // no group
    EXPECT_NE(parse({"publish", "--group", "g", "--batch-size", "0"}).exit_code, 0);  // out of range
    EXPECT_NE(parse({"publish", "--group", "g", "--batch-size", "x"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--batch-bytes", "1023"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--poll-interval", "soon"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--redis", "host:99999"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--log-level", "loud"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--id-mode", "uuid"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--retry-min", "5s", "--retry-max", "1s"}).exit_code, 0);
    EXPECT_NE(parse({"publish", "--group", "g", "--unknown"}).exit_code, 0);
    EXPECT_FALSE(parse({"publish", "--group", "g", "--batch-size", "0"}).config);
}

// The lease: at least a second and three poll intervals (an idle leader
// renews it at each fetch), at most an hour; durations never overflow.
TEST(CommandLine, LeaseBounds) {
    auto r = parse({"publish", "--group", "g"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->lease, 15s);
    r = parse({"publish", "--group", "g", "--lease", "1s", "--poll-interval", "300ms"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->lease, 1s);
    EXPECT_EQ(parse({"publish", "--group", "g", "--lease", "999ms"}).exit_code, 2);
    EXPECT_EQ(parse({"publish", "--group", "g", "--lease", "0"}).exit_code, 2);
    EXPECT_EQ(parse({"publish", "--group", "g", "--lease", "1s", "--poll-interval", "400ms"}).exit_code, 2);
    EXPECT_EQ(parse({"publish", "--group", "g", "--lease", "61m"}).exit_code, 2);
    EXPECT_EQ(parse({"publish", "--group", "g", "--lease", "-1s"}).exit_code, 2);
    EXPECT_EQ(parse({"publish", "--group", "g", "--lease", "9223372036854775807m"}).exit_code, 2);
    EXPECT_EQ(parse({"publish", "--group", "g", "--poll-interval", "153722867280912930m"}).exit_code, 2);
    EXPECT_EQ(parse({"publish", "--group", "g", "--lease", "15 s"}).exit_code, 2);
}

// The bounds of every wait: derived from the lease unless given (one
// place: derive_bounds()), each flag checked.
TEST(CommandLine, WaitBounds) {
    auto r = parse({"publish", "--group", "g"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->pg_timeout, 10s);
    EXPECT_EQ(r.config->redis_timeout, 10s);
    EXPECT_EQ(r.config->retry_max, 5s);
    r = parse({"publish", "--group", "g", "--lease", "6s"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->pg_timeout, 4s);
    EXPECT_EQ(r.config->redis_timeout, 4s);
    EXPECT_EQ(r.config->retry_max, 2s);
    r = parse({"publish", "--group", "g", "--lease", "1s", "--poll-interval", "300ms"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->pg_timeout, 2s);  // at least 2s
    r = parse({"publish", "--group", "g", "--lease", "10m"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->pg_timeout, 10s);  // at most 10s
    EXPECT_EQ(r.config->retry_max, 10s);
    r = parse({"publish", "--group", "g", "--pg-timeout", "3s", "--redis-timeout", "700ms", "--retry-max", "20s"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->pg_timeout, 3s);
    EXPECT_EQ(r.config->redis_timeout, 700ms);
    EXPECT_EQ(r.config->retry_max, 20s);
    // --retry-min above the derived --retry-max raises it.
    r = parse({"publish", "--group", "g", "--retry-min", "7s"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->retry_max, 7s);
    r = parse({"consume", "--consumer", "c", "--handler", "SELECT 1", "--stream", "s"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->pg_timeout, 10s);
    EXPECT_EQ(r.config->redis_timeout, 10s);
    EXPECT_EQ(r.config->retry_max, 10s);

    // A fetch waits in the server up to --poll-interval: the bound on its
    // result must be longer, given or derived.
    for (const auto& args : std::vector<std::vector<const char*>>{
             {"publish", "--group", "g", "--pg-timeout", "1s", "--poll-interval", "1s"},
             {"publish", "--group", "g", "--lease", "10m", "--poll-interval", "60s"}}) {
        const auto [code, err] = parse_error(args);
        EXPECT_EQ(code, 2);
        EXPECT_NE(err.find("--pg-timeout: must be longer than --poll-interval"), std::string::npos) << err;
    }
    r = parse({"publish", "--group", "g", "--lease", "10m", "--poll-interval", "60s", "--pg-timeout", "61s"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->pg_timeout, 61s);

    // An empty value (an env file's PG_OUTBOX_PG_TIMEOUT=) is the default.
    r = parse({"publish", "--group", "g", "--lease", "6s", "--pg-timeout", ""});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->pg_timeout, 4s);
    for (const auto* bad : {"0", "999ms", "-1s", "61m", "soon", "1s ", " ", "9223372036854775807m"}) {
        const auto [code, err] = parse_error({"publish", "--group", "g", "--pg-timeout", bad});
        EXPECT_EQ(code, 2) << bad;
        EXPECT_NE(err.find("--pg-timeout"), std::string::npos) << bad << ": " << err;
    }
    ::setenv("PG_OUTBOX_PG_TIMEOUT", "5s", 1);
    r = parse({"publish", "--group", "g"});
    ::unsetenv("PG_OUTBOX_PG_TIMEOUT");
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->pg_timeout, 5s);
    EXPECT_EQ(parse({"publish", "--group", "g", "--redis-timeout", "99ms"}).exit_code, 2);
    // consume: --block below --redis-timeout, the default included.
    EXPECT_EQ(parse({"consume", "--consumer", "c", "--handler", "SELECT 1", "--stream", "s", "--block", "10s"})
                  .exit_code,
              2);
}

TEST(CommandLine, HelpExitsZero) {
    auto r = parse({"--help"});
    EXPECT_FALSE(r.config);
    EXPECT_EQ(r.exit_code, 0);
}

TEST(CommandLine, ConsumeWithDefaults) {
    auto r = parse({"consume", "--consumer", "accounting", "--stream", "outbox:a", "--stream", "outbox:b",
                    "--handler", "SELECT 1"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->mode, Config::Mode::consume);
    EXPECT_EQ(r.config->streams, (std::vector<std::string>{"outbox:a", "outbox:b"}));
    EXPECT_EQ(r.config->consumer_group, "accounting");
    EXPECT_NE(r.config->worker.find(':'), std::string::npos);
    EXPECT_EQ(r.config->consume_batch_size, 100);
    EXPECT_EQ(r.config->min_idle, 30000ms);
    EXPECT_EQ(r.config->max_deliveries, 5);
    EXPECT_EQ(r.config->start_id, "0");
}

// A stream name may hold a comma: each --stream is one stream. Only the
// environment variable, which cannot be repeated, lists streams with commas.
TEST(CommandLine, ConsumeStreamIsRepeatableAndKeepsCommas) {
    auto r = parse({"consume", "--consumer", "c", "--stream", "orders,eu", "--stream", "audit", "--handler", "x"});
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->streams, (std::vector<std::string>{"orders,eu", "audit"}));
    ::setenv("PG_OUTBOX_STREAMS", "outbox:a,outbox:b", 1);
    auto env = parse({"consume", "--consumer", "c", "--handler", "x"});
    auto flag_wins = parse({"consume", "--consumer", "c", "--handler", "x", "--stream", "s,t"});
    ::unsetenv("PG_OUTBOX_STREAMS");
    ASSERT_TRUE(env.config);
    EXPECT_EQ(env.config->streams, (std::vector<std::string>{"outbox:a", "outbox:b"}));
    ASSERT_TRUE(flag_wins.config);
    EXPECT_EQ(flag_wins.config->streams, (std::vector<std::string>{"s,t"}));
    auto [code, err] = parse_error({"consume", "--consumer", "c", "--handler", "x"});
    EXPECT_EQ(code, 2);
    EXPECT_NE(err.find("--stream"), std::string::npos) << err;
}

TEST(CommandLine, ConsumeBadSettings) {
    EXPECT_NE(parse({"consume", "--stream", "s", "--handler", "SELECT 1"}).exit_code, 0);
    EXPECT_NE(parse({"consume", "--consumer", "c", "--handler", "SELECT 1"}).exit_code, 0);
    EXPECT_NE(parse({"consume", "--consumer", "c", "--stream", "s"}).exit_code, 0);
    EXPECT_NE(parse({"consume", "--consumer", "c", "--stream", "s", "--handler", "x", "--start", "1-1"}).exit_code, 0);
    EXPECT_NE(parse({"consume", "--consumer", "c", "--stream", "s", "--handler", "x", "--max-deliveries", "0"}).exit_code, 0);
    EXPECT_NE(parse({"consume", "--consumer", "c", "--stream", "s", "--handler", "x", "--min-idle", "later"}).exit_code, 0);
}

// --shards expands each template into the shard streams, in shard order;
// --pool takes the lease defaults, the renewal a third of the lease.
TEST(ConsumeConfig, ShardsAndPool) {
    auto r = parse({"consume", "--consumer", "c", "--handler", "x", "--stream", "outbox:orders:{shard}", "--stream",
                    "o:{shard}:{shard}", "--shards", "3", "--pool"});
    ASSERT_TRUE(r.config) << r.exit_code;
    EXPECT_EQ(r.config->streams, (std::vector<std::string>{"outbox:orders:0", "outbox:orders:1", "outbox:orders:2",
                                                           "o:0:0", "o:1:1", "o:2:2"}));
    EXPECT_TRUE(r.config->pool);
    EXPECT_EQ(r.config->pool_lease, 10s);
    EXPECT_EQ(r.config->pool_renew, 3333ms);
    auto tuned = parse({"consume", "--consumer", "c", "--handler", "x", "--stream", "s{shard}", "--shards", "256",
                        "--pool", "--pool-lease", "1s", "--pool-renew", "500ms", "--block", "200ms"});
    ASSERT_TRUE(tuned.config) << tuned.exit_code;
    EXPECT_EQ(tuned.config->streams.size(), 256u);
    EXPECT_EQ(tuned.config->streams.back(), "s255");
    EXPECT_EQ(tuned.config->pool_lease, 1s);
    EXPECT_EQ(tuned.config->pool_renew, 500ms);
    // Without --shards a stream is taken whole, braces included.
    auto whole = parse({"consume", "--consumer", "c", "--handler", "x", "--stream", "s{shard}"});
    ASSERT_TRUE(whole.config);
    EXPECT_EQ(whole.config->streams, std::vector<std::string>{"s{shard}"});
    EXPECT_FALSE(whole.config->pool);
}

// Every hostile value of the pool's flags exits 2 naming the flag.
TEST(ConsumeConfig, HostilePoolFlagsExitTwo) {
    const std::vector<std::pair<std::vector<const char*>, std::string>> cases{
        {{"--shards", "0"}, "--shards: \"0\" is not a shard count (1 to 256)"},
        {{"--shards", "257"}, "--shards: \"257\" is not a shard count (1 to 256)"},
        {{"--shards", "four"}, "--shards: \"four\" is not a shard count"},
        {{"--shards", "-1"}, "--shards: \"-1\" is not a shard count"},
        {{"--shards", "4x"}, "--shards: \"4x\" is not a shard count"},
        {{"--shards", ""}, "--pool: needs --shards N"},
        {{"--shards", "99999999999999999999"}, "is not a shard count"},
        {{"--stream", "plain", "--shards", "4"}, "--stream \"plain\": with --shards each stream is a template"},
        {{"--stream", "a:{shard}", "--shards", "4"}, "--stream: \"a:0\" is named twice"},
        {{"--pool-lease", "999ms"}, "--pool-lease: must be between 1s and 10m"},
        {{"--pool-lease", "11m"}, "--pool-lease: must be between 1s and 10m"},
        {{"--pool-lease", "soon"}, "--pool-lease: \"soon\" is not a duration"},
        {{"--pool-renew", "99ms"}, "--pool-renew: must be at least 100ms"},
        {{"--pool-renew", "5001ms"}, "--pool-renew: must be at most half of --pool-lease"},
        {{"--pool-renew", "-1s"}, "--pool-renew: \"-1s\""},
        {{"--block", "4s"}, "--block: must be at most --pool-renew with --pool"},
    };
    for (const auto& [extra, message] : cases) {
        std::vector<const char*> args{"consume", "--consumer", "c", "--handler", "x", "--stream", "a:{shard}",
                                      "--pool"};
        const bool has_shards = std::find(extra.begin(), extra.end(), std::string_view("--shards")) != extra.end();
        if (!has_shards) args.insert(args.end(), {"--shards", "4"});
        args.insert(args.end(), extra.begin(), extra.end());
        auto [code, err] = parse_error(args);
        EXPECT_EQ(code, 2) << message;
        EXPECT_NE(err.find(message), std::string::npos) << err;
    }
    // --pool without --shards, or without {shard} in the stream.
    auto [code, err] = parse_error({"consume", "--consumer", "c", "--handler", "x", "--stream", "a", "--pool"});
    EXPECT_EQ(code, 2);
    EXPECT_NE(err.find("--pool: needs --shards N and a --stream template with {shard}"), std::string::npos) << err;
    auto [code2, err2] =
        parse_error({"consume", "--consumer", "c", "--handler", "x", "--stream", "a", "--pool", "--shards", "2"});
    EXPECT_EQ(code2, 2);
    EXPECT_NE(err2.find("--shards: no --stream holds {shard}"), std::string::npos) << err2;
}

// --on-failure: park-key by default with --pool, skip without; the flag
// and PG_OUTBOX_ON_FAILURE override the default either way, the flag
// winning over the variable; an empty variable is the default.
TEST(ConsumeConfig, OnFailureDefaultsByPool) {
    auto plain = parse({"consume", "--consumer", "c", "--handler", "x", "--stream", "s"});
    ASSERT_TRUE(plain.config);
    EXPECT_EQ(plain.config->on_failure, OnFailure::skip);
    auto pooled = parse({"consume", "--consumer", "c", "--handler", "x", "--stream", "s{shard}", "--shards", "2",
                         "--pool"});
    ASSERT_TRUE(pooled.config);
    EXPECT_EQ(pooled.config->on_failure, OnFailure::park_key);
    auto pooled_skip = parse({"consume", "--consumer", "c", "--handler", "x", "--stream", "s{shard}", "--shards",
                              "2", "--pool", "--on-failure", "skip"});
    ASSERT_TRUE(pooled_skip.config);
    EXPECT_EQ(pooled_skip.config->on_failure, OnFailure::skip);
    auto plain_park = parse({"consume", "--consumer", "c", "--handler", "x", "--stream", "s", "--on-failure",
                             "park-key"});
    ASSERT_TRUE(plain_park.config);
    EXPECT_EQ(plain_park.config->on_failure, OnFailure::park_key);
    EXPECT_STREQ(to_string(OnFailure::park_key), "park-key");
    EXPECT_STREQ(to_string(OnFailure::skip), "skip");

    ::setenv("PG_OUTBOX_ON_FAILURE", "park-key", 1);
    auto env = parse({"consume", "--consumer", "c", "--handler", "x", "--stream", "s"});
    auto flag_wins = parse({"consume", "--consumer", "c", "--handler", "x", "--stream", "s", "--on-failure", "skip"});
    ::setenv("PG_OUTBOX_ON_FAILURE", "", 1);
    auto empty = parse({"consume", "--consumer", "c", "--handler", "x", "--stream", "s{shard}", "--shards", "2",
                        "--pool"});
    ::unsetenv("PG_OUTBOX_ON_FAILURE");
    ASSERT_TRUE(env.config);
    EXPECT_EQ(env.config->on_failure, OnFailure::park_key);
    ASSERT_TRUE(flag_wins.config);
    EXPECT_EQ(flag_wins.config->on_failure, OnFailure::skip);
    ASSERT_TRUE(empty.config);
    EXPECT_EQ(empty.config->on_failure, OnFailure::park_key);
}

// Anything but the two modes exits 2 naming the flag; a control character
// in the value is escaped in the message.
TEST(ConsumeConfig, HostileOnFailureExitsTwo) {
    for (const char* bad : {"park", "PARK-KEY", "Skip", "park_key", " skip", "skip ", "dead-letter", "0",
                            "park-key\n", "park-key\x1b[31m"}) {
        auto [code, err] = parse_error({"consume", "--consumer", "c", "--handler", "x", "--stream", "s",
                                        "--on-failure", bad});
        EXPECT_EQ(code, 2) << bad;
        EXPECT_NE(err.find("--on-failure: \""), std::string::npos) << err;
        EXPECT_NE(err.find("is not a mode; use skip or park-key"), std::string::npos) << err;
        EXPECT_EQ(err.find('\x1b'), std::string::npos) << err;
    }
    ::setenv("PG_OUTBOX_ON_FAILURE", "always", 1);
    auto [code, err] = parse_error({"consume", "--consumer", "c", "--handler", "x", "--stream", "s"});
    ::unsetenv("PG_OUTBOX_ON_FAILURE");
    EXPECT_EQ(code, 2);
    EXPECT_NE(err.find("--on-failure: \"always\" is not a mode"), std::string::npos) << err;
}

// The relay's parser against the extension's: the shared vectors of
// test/vectors/group_names.txt, which the pg_regress test group_names runs
// through outbox.split_group_name().
TEST(GroupName, Vectors) {
    std::ifstream in(std::string(PG_OUTBOX_SOURCE_DIR) + "/test/vectors/group_names.txt");
    ASSERT_TRUE(in) << "test/vectors/group_names.txt";
    std::string line;
    int cases = 0;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::vector<std::string> f;
        for (std::size_t start = 0;;) {
            const auto sep = line.find(" | ", start);
            f.push_back(line.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
            if (sep == std::string::npos) break;
            start = sep + 3;
        }
        ASSERT_GE(f.size(), 2u) << line;
        ++cases;
        std::string name;
        int shard = 0;
        if (f[1] == "error" || (f.size() == 4 && f[3] == "relay: error")) {
            EXPECT_THROW(split_group_name(f[0], name, shard), ConfigError) << line;
            continue;
        }
        ASSERT_EQ(f.size(), 3u) << line;
        EXPECT_NO_THROW(split_group_name(f[0], name, shard)) << line;
        EXPECT_EQ(name, f[1]) << line;
        EXPECT_EQ(shard, f[2] == "none" ? -1 : std::stoi(f[2])) << line;
    }
    EXPECT_GE(cases, 20);
}

TEST(Config, EntryFormatAndCeSource) {
    auto c = parse({"publish", "--group", "g"}).config;
    ASSERT_TRUE(c);
    EXPECT_EQ(c->entry_format, EntryFormat::plain);
    EXPECT_EQ(c->ce_source, "/pg_outbox/{database}/{group}");
    c = parse({"publish", "--group", "g", "--format", "cloudevents", "--ce-source", "urn:x:{group}"}).config;
    ASSERT_TRUE(c);
    EXPECT_EQ(c->entry_format, EntryFormat::cloudevents);
    EXPECT_EQ(c->ce_source, "urn:x:{group}");
    c = parse({"publish", "--group", "g", "--format", "cloudevents-structured"}).config;
    ASSERT_TRUE(c);
    EXPECT_EQ(c->entry_format, EntryFormat::cloudevents_structured);
    for (const char* bad : {"", "CloudEvents", "json", "cloudevents ", "default\n"}) {
        if (*bad == '\0') continue;  // an empty value is the default (an env file's PG_OUTBOX_FORMAT=)
        const auto [code, err] = parse_error({"publish", "--group", "g", "--format", bad});
        EXPECT_EQ(code, 2) << bad;
        EXPECT_NE(err.find("--format"), std::string::npos) << err;
    }
    const std::string big(1025, 'a');
    for (const std::string& bad : std::vector<std::string>{std::string(""), std::string("/a b"), std::string("/a\x01"),
                                   std::string("/caf\xc3\xa9"), big, std::string("/{shard}"), std::string("/{group")}) {
        const auto [code, err] = parse_error({"publish", "--group", "g", "--ce-source", bad.c_str()});
        EXPECT_EQ(code, 2) << bad;
        EXPECT_NE(err.find("--ce-source"), std::string::npos) << err;
    }
    ::setenv("PG_OUTBOX_FORMAT", "xml", 1);
    const auto [code, err] = parse_error({"publish", "--group", "g"});
    ::unsetenv("PG_OUTBOX_FORMAT");
    EXPECT_EQ(code, 2);
    EXPECT_NE(err.find("--format"), std::string::npos) << err;
    ::setenv("PG_OUTBOX_CE_SOURCE", "/x y", 1);
    const auto [code2, err2] = parse_error({"publish", "--group", "g"});
    ::unsetenv("PG_OUTBOX_CE_SOURCE");
    EXPECT_EQ(code2, 2);
    EXPECT_NE(err2.find("--ce-source"), std::string::npos) << err2;
}
