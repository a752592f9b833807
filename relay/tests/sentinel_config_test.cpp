// Unit tests of sentinel:// addresses: what they give, and every hostile
// form refused with a message that names the fault and hides the password.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/errors.hpp"

using namespace pg_outbox;

namespace {

std::string parse_error_of(const std::string& text) {
    try {
        RedisAddress::parse(text);
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "(no error)";
}

ParseResult parse(std::vector<const char*> args) {
    args.insert(args.begin(), "pg_outbox_relay");
    return parse_command_line(static_cast<int>(args.size()), args.data());
}

std::pair<int, std::string> command_line_error(std::vector<const char*> args) {
    ::testing::internal::CaptureStderr();
    auto r = parse(std::move(args));
    return {r.exit_code, ::testing::internal::GetCapturedStderr()};
}

}  // namespace

TEST(SentinelAddress, ListsSentinelsAndTheMaster) {
    auto a = RedisAddress::parse("sentinel://10.0.0.1:26379,sentinel-b:26380,[::1]:5000/mymaster");
    ASSERT_TRUE(a.is_sentinel());
    EXPECT_EQ(a.master_name, "mymaster");
    ASSERT_EQ(a.sentinels.size(), 3u);
    EXPECT_EQ(a.sentinels[0], (SentinelAddress{"10.0.0.1", 26379}));
    EXPECT_EQ(a.sentinels[1], (SentinelAddress{"sentinel-b", 26380}));
    EXPECT_EQ(a.sentinels[2], (SentinelAddress{"::1", 5000}));
    EXPECT_TRUE(a.unix_path.empty());
    EXPECT_TRUE(a.password.empty());
    EXPECT_FALSE(a.db);
    EXPECT_EQ(a.to_string(), "sentinel://10.0.0.1:26379,sentinel-b:26380,[::1]:5000/mymaster");
}

TEST(SentinelAddress, DefaultPortOneSentinelAndNames) {
    auto a = RedisAddress::parse("sentinel://s1/cache");
    ASSERT_EQ(a.sentinels.size(), 1u);
    EXPECT_EQ(a.sentinels[0].port, 26379);
    EXPECT_EQ(RedisAddress::parse("sentinel://[::1]/m").sentinels[0], (SentinelAddress{"::1", 26379}));
    EXPECT_EQ(RedisAddress::parse("sentinel://s1/my-master_2.eu:a").master_name, "my-master_2.eu:a");
    EXPECT_EQ(RedisAddress::parse("sentinel://s1/" + std::string(128, 'm')).master_name.size(), 128u);
    EXPECT_FALSE(RedisAddress::parse("h:1").is_sentinel());
    EXPECT_FALSE(RedisAddress::parse("redis://h").is_sentinel());
}

// The URL's credentials are the data nodes', as in redis:// URLs.
TEST(SentinelAddress, CredentialsAreTheDataNodes) {
    auto a = RedisAddress::parse("sentinel://app:s%40cret%2C%2F@s1:1,s2:2/m");
    EXPECT_EQ(a.user, "app");
    EXPECT_EQ(a.password, "s@cret,/");
    EXPECT_EQ(a.sentinels.size(), 2u);
    EXPECT_EQ(a.master_name, "m");
    EXPECT_TRUE(a.sentinel_password.empty());
    auto b = RedisAddress::parse("sentinel://:pw@s1/m");
    EXPECT_EQ(b.user, "");
    EXPECT_EQ(b.password, "pw");
    EXPECT_EQ(b.to_string().find("pw"), std::string::npos);
}

TEST(SentinelAddress, HostileFormsAreRefused) {
    const std::vector<std::pair<std::string, std::string>> cases{
        {"sentinel://", "names no master"},
        {"sentinel:///m", "lists no sentinel"},
        {"sentinel://s1", "names no master"},
        {"sentinel://s1/", "names no master"},
        {"sentinel://s1,s2", "names no master"},
        {"sentinel://,s1/m", "empty sentinel address"},
        {"sentinel://s1,/m", "empty sentinel address"},
        {"sentinel://s1,,s2/m", "empty sentinel address"},
        {"sentinel://s1:0/m", "not a port number"},
        {"sentinel://s1:65536/m", "not a port number"},
        {"sentinel://s1:-1/m", "not a port number"},
        {"sentinel://s1:/m", "not a port number"},
        {"sentinel://s1:26379x/m", "not a port number"},
        {"sentinel://s1:1,s2:abc/m", "not a port number"},
        {"sentinel://s1/m/0", "no database"},
        {"sentinel://s1/m?db=1", "query parameters"},
        {"sentinel://s1/m#x", "query parameters"},
        {"sentinel://s1:1,s1:1/m", "twice"},
        {"sentinel://s 1/m", "whitespace or a control character"},
        {"sentinel://s1/m m", "whitespace or a control character"},
        {"sentinel://s1/m\n", "whitespace or a control character"},
        {"sentinel://s1/m\tx", "whitespace or a control character"},
        {std::string("sentinel://s1/m\0x", 17), "whitespace or a control character"},
        {"sentinel://s1/m\x7f", "whitespace or a control character"},
        {"sentinel://s1/m\xc3\xa9", "not a master name"},
        {"sentinel://s1/m,n", "not a master name"},
        {"sentinel://s1/m%41", "not a master name"},
        {"sentinel://s1/" + std::string(129, 'm'), "not a master name"},
        {"sentinel://s1;rm/m", "not a host name"},
        {"sentinel://-s1/m", "not a host name"},
        {"sentinel://unix:/tmp/s.sock/m", "the master's name alone"},
        {"sentinel://[::1/m", "\"]\""},
        {"sentinel://[nothost]:1/m", "not an IPv6 address"},
        {"sentinel://user@s1/m", "without a password"},
        {"sentinel://u:@s1/m", "empty password"},
        {"sentinel://u:%zz@s1/m", "malformed %-escape"},
        {"sentinel://s1/" + std::string(5000, 'x'), "too long"},
        {"sentinels://s1/m", "only redis:// and sentinel://"},
    };
    for (const auto& [text, want] : cases) {
        const auto e = parse_error_of(text);
        EXPECT_NE(e.find(want), std::string::npos) << "\"" << text << "\" gave: " << e;
    }
    std::string many = "sentinel://";
    for (int i = 0; i < 17; ++i) many += (i ? ",h" : "h") + std::to_string(i);
    EXPECT_NE(parse_error_of(many + "/m").find("more than 16 sentinels"), std::string::npos)
        << parse_error_of(many + "/m");
    std::string sixteen = "sentinel://";
    for (int i = 0; i < 16; ++i) sixteen += (i ? ",h" : "h") + std::to_string(i);
    EXPECT_EQ(RedisAddress::parse(sixteen + "/m").sentinels.size(), 16u);
}

// Errors about a sentinel:// URL never show its password, whatever is
// wrong with the rest.
TEST(SentinelAddress, ErrorsHideThePassword) {
    for (const char* bad :
         {"sentinel://u:Sekr3t@s1:0/m", "sentinel://u:Sekr3t@s1", "sentinel://u:Sekr3t@/m",
          "sentinel://u:Sekr3t@s1/m/1", "sentinel://u:Sekr3t@s1,,s2/m", "sentinel://u:Sekr3t@s1/m?x",
          "sentinel://Sekr3t@s1/m", "sentinel://u:Sekr3t@s1/m m", "sentinel://u:Sekr3t@s1:1,s1:1/m"}) {
        const auto e = parse_error_of(bad);
        EXPECT_NE(e, "(no error)") << bad;
        EXPECT_EQ(e.find("Sekr3t"), std::string::npos) << e;
    }
}

TEST(SentinelCommandLine, UrlAndSentinelPassword) {
    auto r = parse({"--redis", "sentinel://bob:pw@s1:1,s2:2/m", "--redis-db", "3", "--sentinel-password", "spw",
                    "publish", "--group", "g"});
    ASSERT_TRUE(r.config);
    EXPECT_TRUE(r.config->redis.is_sentinel());
    EXPECT_EQ(r.config->redis_password, "pw");
    EXPECT_EQ(r.config->redis.user, "bob");
    EXPECT_EQ(r.config->redis_db, 3);
    EXPECT_EQ(r.config->redis.sentinel_password, "spw");

    ::setenv("PG_OUTBOX_SENTINEL_PASSWORD", "from-env", 1);
    auto e = parse({"--redis", "sentinel://s1/m", "publish", "--group", "g"});
    ::unsetenv("PG_OUTBOX_SENTINEL_PASSWORD");
    ASSERT_TRUE(e.config);
    EXPECT_EQ(e.config->redis.sentinel_password, "from-env");

    auto [code, err] = command_line_error({"--sentinel-password", "spw", "publish", "--group", "g"});
    EXPECT_EQ(code, 2);
    EXPECT_NE(err.find("--sentinel-password"), std::string::npos) << err;

    auto [code2, err2] = command_line_error({"--redis", "sentinel://u:Sekr3t@s1,,s2/m", "publish", "--group", "g"});
    EXPECT_EQ(code2, 2);
    EXPECT_NE(err2.find("--redis"), std::string::npos) << err2;
    EXPECT_EQ(err2.find("Sekr3t"), std::string::npos) << err2;

    auto [code3, err3] = command_line_error({"--redis", "sentinel://s1/m\n", "publish", "--group", "g"});
    EXPECT_EQ(code3, 2);
    EXPECT_NE(err3.find("\\x0a at offset 15"), std::string::npos) << err3;
}
