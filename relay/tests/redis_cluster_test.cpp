// Unit tests of the Redis Cluster routing: CRC16 and hash tags as in the
// Redis Cluster specification, MOVED and ASK replies, hostile ones
// included, the slot map, and redis+cluster:// URLs.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/redis_cluster.hpp"

using namespace pg_outbox;

TEST(ClusterSlots, Crc16KnownVectors) {
    // The check value the specification gives for CRC16-CCITT (XMODEM).
    EXPECT_EQ(crc16("123456789"), 0x31C3);
    EXPECT_EQ(crc16(""), 0);
    EXPECT_EQ(key_slot("foo"), 12182);  // CLUSTER KEYSLOT foo
    EXPECT_EQ(key_slot("somekey"), 11058);
    EXPECT_EQ(key_slot(""), 0);
    EXPECT_EQ(key_slot(std::string("\0\xff", 2)), crc16(std::string("\0\xff", 2)) % 16384);
}

TEST(ClusterSlots, HashTagsAsInTheSpecification) {
    EXPECT_EQ(hash_tag("{user1000}.following"), "user1000");
    EXPECT_EQ(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
    EXPECT_EQ(key_slot("{user1000}.following"), key_slot("user1000"));
    EXPECT_EQ(hash_tag("foo{}{bar}"), "foo{}{bar}");  // the first "{}" is empty: the whole key
    EXPECT_EQ(hash_tag("foo{{bar}}zap"), "{bar");
    EXPECT_EQ(hash_tag("foo{bar}{zap}"), "bar");
    EXPECT_EQ(hash_tag("{}"), "{}");
    EXPECT_EQ(hash_tag("{"), "{");
    EXPECT_EQ(hash_tag("}{"), "}{");
    EXPECT_EQ(hash_tag("}{x}"), "x");
    EXPECT_EQ(hash_tag("{}x}"), "{}x}");
    EXPECT_EQ(hash_tag("outbox:{orders}"), "orders");
    EXPECT_EQ(hash_tag("plain"), "plain");
    EXPECT_EQ(key_slot("{}"), crc16("{}") % 16384);
}

TEST(ClusterRedirect, ParsesMovedAndAsk) {
    auto m = parse_redirect("MOVED 3999 127.0.0.1:6381");
    ASSERT_TRUE(m);
    EXPECT_EQ(m->kind, Redirect::Kind::moved);
    EXPECT_EQ(m->slot, 3999);
    EXPECT_EQ(m->host, "127.0.0.1");
    EXPECT_EQ(m->port, 6381);
    auto a = parse_redirect("ASK 16383 redis-2.example:7002");
    ASSERT_TRUE(a);
    EXPECT_EQ(a->kind, Redirect::Kind::ask);
    EXPECT_EQ(a->slot, 16383);
    EXPECT_EQ(a->host, "redis-2.example");
    EXPECT_EQ(a->port, 7002);
    auto zero = parse_redirect("MOVED 0 10.0.0.1:1");
    ASSERT_TRUE(zero);
    EXPECT_EQ(zero->slot, 0);
    EXPECT_EQ(zero->port, 1);
}

TEST(ClusterRedirect, Ipv6AndEmptyHosts) {
    auto bare = parse_redirect("MOVED 1 ::1:7000");  // as Redis prints it
    ASSERT_TRUE(bare);
    EXPECT_EQ(bare->host, "::1");
    EXPECT_EQ(bare->port, 7000);
    auto bracketed = parse_redirect("ASK 2 [::1]:7000");
    ASSERT_TRUE(bracketed);
    EXPECT_EQ(bracketed->host, "::1");
    EXPECT_EQ(bracketed->port, 7000);
    auto full = parse_redirect("MOVED 3 fe80::1:2:3:6379");
    ASSERT_TRUE(full);
    EXPECT_EQ(full->host, "fe80::1:2:3");
    EXPECT_EQ(full->port, 6379);
    // Redis 7 prints no host when the node's endpoint is unknown: the
    // caller uses the host it asked.
    auto empty = parse_redirect("MOVED 4 :6380");
    ASSERT_TRUE(empty);
    EXPECT_EQ(empty->host, "");
    EXPECT_EQ(empty->port, 6380);
}

TEST(ClusterRedirect, HostileRepliesAreNotRedirections) {
    for (const char* text :
         {"", "MOVED", "MOVED ", "MOVED 1", "MOVED 1 ", "MOVED 1 host", "MOVED 1 host:", "MOVED x host:1",
          "MOVED -1 host:1", "MOVED 16384 host:1", "MOVED 99999999999999999999 host:1", "MOVED 1 host:0",
          "MOVED 1 host:65536", "MOVED 1 host:99999999999", "MOVED 1 host:1x", "MOVED 1 host:-1",
          "MOVED 1 host:1 trailing", "MOVED  1 host:1", "moved 1 host:1", "ASKING", "ASK 1 [::1:7000",
          "ASK 1 [::1]x:7000", "MOVED 1 ho\nst:1", "ERR MOVED 1 host:1", "CROSSSLOT Keys in request don't hash",
          "TRYAGAIN Multiple keys request during rehashing of slot", "MOVED +1 host:1", "MOVED 1 host:+1"}) {
        EXPECT_FALSE(parse_redirect(text)) << '"' << text << '"';
    }
    EXPECT_FALSE(parse_redirect(std::string("MOVED 1 h\0st:1", 14)));
}

namespace {

// A reply tree built by hand, as hiredis would give it.
struct FakeReply {
    redisReply r{};
    std::vector<FakeReply*> children;
    std::vector<redisReply*> pointers;
    std::string text;
    static FakeReply* integer(long long v) {
        auto* f = new FakeReply;
        f->r.type = REDIS_REPLY_INTEGER;
        f->r.integer = v;
        return f;
    }
    static FakeReply* string(std::string s) {
        auto* f = new FakeReply;
        f->text = std::move(s);
        f->r.type = REDIS_REPLY_STRING;
        f->r.str = f->text.data();
        f->r.len = f->text.size();
        return f;
    }
    static FakeReply* array(std::vector<FakeReply*> items) {
        auto* f = new FakeReply;
        f->r.type = REDIS_REPLY_ARRAY;
        f->children = std::move(items);
        for (auto* c : f->children) f->pointers.push_back(&c->r);
        f->r.element = f->pointers.data();
        f->r.elements = f->pointers.size();
        return f;
    }
    ~FakeReply() {
        for (auto* c : children) delete c;
    }
};

FakeReply* range(long long from, long long to, const std::string& host, long long port) {
    return FakeReply::array({FakeReply::integer(from), FakeReply::integer(to),
                             FakeReply::array({FakeReply::string(host), FakeReply::integer(port),
                                               FakeReply::string("id")}),
                             FakeReply::array({FakeReply::string("10.0.0.9"), FakeReply::integer(1),
                                               FakeReply::string("replica")})});
}

}  // namespace

TEST(ClusterSlotMap, ParsesClusterSlots) {
    std::unique_ptr<FakeReply> reply(FakeReply::array(
        {range(0, 5460, "10.0.0.1", 7000), range(5461, 10922, "", 7001), range(10923, 16383, "10.0.0.1", 7000)}));
    auto map = SlotMap::parse(&reply->r, "asked.example");
    ASSERT_EQ(map.masters().size(), 2u);
    EXPECT_EQ(map.master(0)->to_string(), "10.0.0.1:7000");
    EXPECT_EQ(map.master(5461)->to_string(), "asked.example:7001");
    EXPECT_EQ(map.master(16383)->port, 7000);
    EXPECT_EQ(map.master(16384), nullptr);
    EXPECT_EQ(map.master(-1), nullptr);
}

TEST(ClusterSlotMap, UncoveredSlotsHaveNoMaster) {
    std::unique_ptr<FakeReply> reply(FakeReply::array({range(100, 200, "h", 1)}));
    auto map = SlotMap::parse(&reply->r, "h");
    EXPECT_EQ(map.master(99), nullptr);
    EXPECT_NE(map.master(100), nullptr);
    EXPECT_EQ(map.master(201), nullptr);
}

TEST(ClusterSlotMap, RefusesMalformedReplies) {
    for (auto* bad : {FakeReply::string("x"), FakeReply::array({range(0, 16384, "h", 1)}),
                      FakeReply::array({range(-1, 3, "h", 1)}), FakeReply::array({range(5, 3, "h", 1)}),
                      FakeReply::array({range(0, 3, "h", 0)}), FakeReply::array({range(0, 3, "h", 70000)}),
                      FakeReply::array({FakeReply::array({FakeReply::integer(0), FakeReply::integer(1)})}),
                      FakeReply::array({FakeReply::integer(3)})}) {
        std::unique_ptr<FakeReply> owned(bad);
        EXPECT_THROW(SlotMap::parse(&bad->r, "h"), RedisError);
    }
    EXPECT_THROW(SlotMap::parse(nullptr, "h"), RedisError);
}

TEST(ClusterUrl, SeedNodes) {
    auto seeds = parse_cluster_url("redis+cluster://10.0.0.1:7000,[::1]:7001,redis-3");
    ASSERT_EQ(seeds.size(), 3u);
    EXPECT_EQ(seeds[0].to_string(), "10.0.0.1:7000");
    EXPECT_EQ(seeds[1].host, "::1");
    EXPECT_EQ(seeds[1].port, 7001);
    EXPECT_EQ(seeds[2].port, 6379);
    auto auth = parse_cluster_url("redis+cluster://app:s%40cret@h1:1,h2:2");
    ASSERT_EQ(auth.size(), 2u);
    EXPECT_EQ(auth[1].user, "app");
    EXPECT_EQ(auth[1].password, "s@cret");
    EXPECT_THROW(parse_cluster_url("redis+cluster://"), ConfigError);
    EXPECT_THROW(parse_cluster_url("redis+cluster://h1:1,,h2:2"), ConfigError);
    EXPECT_THROW(parse_cluster_url("redis+cluster://h1:1/2"), ConfigError);
    EXPECT_THROW(parse_cluster_url("redis+cluster://h1:0"), ConfigError);
    EXPECT_THROW(parse_cluster_url("redis+cluster://h1:1?x=1"), ConfigError);
    EXPECT_THROW(parse_cluster_url("redis://h1:1"), ConfigError);
    try {
        parse_cluster_url("redis+cluster://u:topsecret@h1:1,h2:bad");
        FAIL();
    } catch (const ConfigError& e) {
        EXPECT_EQ(std::string(e.what()).find("topsecret"), std::string::npos) << e.what();
    }
}

namespace {

ParseResult parse_publish(std::vector<const char*> extra) {
    std::vector<const char*> args{"pg_outbox_relay", "publish", "--group", "g"};
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_command_line(static_cast<int>(args.size()), args.data());
}

}  // namespace

TEST(ClusterUrl, SelectsClusterModeOnTheCommandLine) {
    auto r = parse_publish({"--redis", "redis+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001"});
    ASSERT_TRUE(r.config);
    ASSERT_EQ(r.config->redis.cluster_seeds.size(), 2u);
    EXPECT_EQ(r.config->redis.to_string(), "redis+cluster://127.0.0.1:7000,127.0.0.1:7001");
    EXPECT_EQ(r.config->redis_password, "pw");
    // A cluster has database 0 only.
    auto db = parse_publish({"--redis", "redis+cluster://127.0.0.1:7000", "--redis-db", "3"});
    EXPECT_FALSE(db.config);
    EXPECT_EQ(db.exit_code, 2);
    EXPECT_FALSE(parse_publish({"--redis", "redis+cluster://127.0.0.1:7000/1"}).config);
    EXPECT_TRUE(parse_publish({"--redis", "redis+cluster://127.0.0.1:7000", "--redis-db", "0"}).config);
    EXPECT_TRUE(parse_publish({"--redis", "127.0.0.1:7000"}).config->redis.cluster_seeds.empty());
}

// The three kinds of address, each parsed by RedisAddress::parse() as the
// command line does: a cluster address is neither a single server nor a
// Sentinel one, and shows without its password.
TEST(ClusterUrl, OneOfThreeKindsOfAddress) {
    auto c = RedisAddress::parse("redis+cluster://app:Sekr3t@10.0.0.1:7000,[::1]:7001,redis-3");
    ASSERT_TRUE(c.is_cluster());
    EXPECT_FALSE(c.is_sentinel());
    ASSERT_EQ(c.cluster_seeds.size(), 3u);
    EXPECT_EQ(c.user, "app");
    EXPECT_EQ(c.password, "Sekr3t");
    EXPECT_EQ(c.to_string(), "redis+cluster://10.0.0.1:7000,[::1]:7001,redis-3:6379");
    auto s = RedisAddress::parse("sentinel://s1,s2:5000/m");
    EXPECT_TRUE(s.is_sentinel());
    EXPECT_FALSE(s.is_cluster());
    EXPECT_EQ(s.to_string(), "sentinel://s1:26379,s2:5000/m");
    auto one = RedisAddress::parse("redis://:pw@h:7/2");
    EXPECT_FALSE(one.is_sentinel());
    EXPECT_FALSE(one.is_cluster());
    EXPECT_EQ(one.to_string(), "h:7");
    EXPECT_EQ(RedisAddress::parse("unix:/tmp/r.sock").to_string(), "unix:/tmp/r.sock");
}

// Hostile redis+cluster:// URLs are refused with a message that names the
// fault and never shows the password.
TEST(ClusterUrl, HostileFormsAreRefusedWithoutThePassword) {
    const std::vector<std::pair<std::string, std::string>> cases{
        {"redis+cluster://u:Sekr3t@h1:1\n", "whitespace or a control character"},
        {"redis+cluster://u:Sekr3t@h1:1, h2:2", "whitespace or a control character"},
        {std::string("redis+cluster://u:Sekr3t@h1:1\0", 30), "whitespace or a control character"},
        {"redis+cluster://u:Sekr3t@h1:1\x7f", "whitespace or a control character"},
        {"redis+cluster://u:Sekr3t@h1:1," + std::string(5000, 'h'), "too long"},
        {"redis+cluster://u:Sekr3t@h1:1,,h2:2", "empty node"},
        {"redis+cluster://u:Sekr3t@", "empty node"},
        {"redis+cluster://u:Sekr3t@h1:1/0", "database"},
        {"redis+cluster://u:Sekr3t@h1:70000", "not a port number"},
        {"redis+cluster://u:Sekr3t@h1;rm:1", "not a host name"},
        {"redis+cluster://u:Sekr3t@h1:1?x", "query parameters"},
        {"redis+cluster://Sekr3t@h1:1", "without a password"},
        {"redis+clusters://u:Sekr3t@h1:1", "redis+cluster://"},
    };
    for (const auto& [text, want] : cases) {
        std::string e = "(no error)";
        try {
            RedisAddress::parse(text);
        } catch (const ConfigError& error) {
            e = error.what();
        }
        EXPECT_NE(e.find(want), std::string::npos) << "\"" << text << "\" gave: " << e;
        EXPECT_EQ(e.find("Sekr3t"), std::string::npos) << e;
    }
}

// A Sentinel in front of a cluster is not a thing: --sentinel-password
// with a redis+cluster:// address exits 2 naming the flag, as with any
// address that is not sentinel://.
TEST(ClusterUrl, SentinelPasswordIsRefused) {
    for (const char* redis : {"redis+cluster://127.0.0.1:7000,127.0.0.1:7001", "127.0.0.1:6379"}) {
        std::vector<const char*> args{"pg_outbox_relay", "--redis", redis, "--sentinel-password", "spw",
                                      "publish", "--group", "g"};
        ::testing::internal::CaptureStderr();
        auto r = parse_command_line(static_cast<int>(args.size()), args.data());
        const auto err = ::testing::internal::GetCapturedStderr();
        EXPECT_FALSE(r.config) << redis;
        EXPECT_EQ(r.exit_code, 2) << redis;
        EXPECT_NE(err.find("--sentinel-password"), std::string::npos) << err;
    }
}
