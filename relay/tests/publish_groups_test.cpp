// Unit tests of the --group list: several groups or shards for one
// process, "<group>/*", and what is refused (empty, twice, unknown).
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/publish_groups.hpp"

using namespace pg_outbox;

namespace {

ParseResult parse(std::vector<const char*> args) {
    args.insert(args.begin(), "pg_outbox_relay");
    return parse_command_line(static_cast<int>(args.size()), args.data());
}

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

using List = std::vector<std::string>;

// outbox.groups: g (one shard), orders (4 shards), audit (2 shards).
const std::vector<GroupRow> kRows{{"audit", 0, 2},  {"audit", 1, 2},  {"g", 0, 1},     {"orders", 0, 4},
                                  {"orders", 1, 4}, {"orders", 2, 4}, {"orders", 3, 4}};
const std::string kTemplate = "outbox:{topic}:{shard}";

}  // namespace

TEST(GroupList, RepeatedAndCommaSeparated) {
    auto one = parse({"publish", "--group", "g"});
    ASSERT_TRUE(one.config);
    EXPECT_EQ(one.config->groups, List{"g"});
    EXPECT_EQ(one.config->group, "g");
    EXPECT_FALSE(needs_group_lookup(one.config->groups));

    auto several = parse({"publish", "--group", "orders/1", "--group", "g,audit/*", "--group", "orders/*"});
    ASSERT_TRUE(several.config);
    EXPECT_EQ(several.config->groups, (List{"orders/1", "g", "audit/*", "orders/*"}));
    EXPECT_EQ(several.config->group, "orders/1");
    EXPECT_TRUE(needs_group_lookup(several.config->groups));

    auto every = parse({"publish", "--group", "orders/*"});
    ASSERT_TRUE(every.config);
    EXPECT_TRUE(needs_group_lookup(every.config->groups));
    std::string name;
    EXPECT_TRUE(is_every_shard("orders/*", &name));
    EXPECT_EQ(name, "orders");
    EXPECT_FALSE(is_every_shard("orders"));
    EXPECT_FALSE(is_every_shard("orders/1"));
}

// The environment variable cannot be repeated: it lists groups with commas.
TEST(GroupList, FromTheEnvironment) {
    ::setenv("PG_OUTBOX_GROUP", "orders/*,g", 1);
    auto r = parse({"publish"});
    auto flag = parse({"publish", "--group", "audit/1"});
    ::unsetenv("PG_OUTBOX_GROUP");
    ASSERT_TRUE(r.config);
    EXPECT_EQ(r.config->groups, (List{"orders/*", "g"}));
    ASSERT_TRUE(flag.config);
    EXPECT_EQ(flag.config->groups, List{"audit/1"}) << "a flag replaces the variable";
}

// Empty names, names given twice, malformed shards and wildcards: exit 2
// at once, naming --group.
TEST(GroupList, HostileValuesExit2) {
    struct Case {
        std::vector<const char*> args;
        std::string says;
    };
    const std::vector<Case> cases{
        {{"publish", "--group", ""}, "must not be empty"},
        {{"publish", "--group", "a,,b"}, "an empty group name"},
        {{"publish", "--group", "a,"}, "an empty group name"},
        {{"publish", "--group", ",a"}, "an empty group name"},
        {{"publish", "--group", "a", "--group", ""}, "an empty group name"},
        {{"publish", "--group", "g", "--group", "g"}, "\"g\" is given twice"},
        {{"publish", "--group", "orders/1,orders/1"}, "\"orders/1\" is given twice"},
        {{"publish", "--group", "orders/*", "--group", "orders/*"}, "\"orders/*\" is given twice"},
        {{"publish", "--group", "/*"}, "every shard of a group is named"},
        {{"publish", "--group", "a/b/*"}, "every shard of a group is named"},
        {{"publish", "--group", "orders/**"}, "a shard is named"},
        {{"publish", "--group", "orders/"}, "a shard is named"},
        {{"publish", "--group", "orders/x", "--group", "g"}, "a shard is named"},
        {{"publish", "--group"}, "--group"},
        {{"publish"}, "--group"},
    };
    for (const auto& c : cases) {
        auto [code, err] = parse_error(c.args);
        EXPECT_EQ(code, 2) << c.says;
        EXPECT_NE(err.find(c.says), std::string::npos) << err;
        EXPECT_NE(err.find("--group"), std::string::npos) << err;
    }
}

// "<group>/*" is every shard, in order, where it stands in the list.
TEST(ExpandGroups, EveryShardInPlace) {
    EXPECT_EQ(expand_groups({"orders/*"}, kRows, kTemplate), (List{"orders/0", "orders/1", "orders/2", "orders/3"}));
    EXPECT_EQ(expand_groups({"g", "audit/*", "orders/2"}, kRows, kTemplate),
              (List{"g", "audit/0", "audit/1", "orders/2"}));
    // A group of one shard is served by its name, whichever way it is named.
    EXPECT_EQ(expand_groups({"g/*"}, kRows, "outbox:{topic}"), List{"g"});
    EXPECT_EQ(expand_groups({"g/0", "audit/1"}, kRows, kTemplate), (List{"g/0", "audit/1"}));
    // Unsharded groups need no {shard}.
    EXPECT_EQ(expand_groups({"g"}, {{"g", 0, 1}, {"h", 0, 1}}, "outbox:{topic}"), List{"g"});
}

TEST(ExpandGroups, RefusesWhatCannotBeServed) {
    auto error = [](const List& groups, const std::string& tmpl = kTemplate) {
        return config_error([&] { expand_groups(groups, kRows, tmpl); });
    };
    EXPECT_NE(error({"nosuch/*"}).find("group \"nosuch\" does not exist"), std::string::npos) << error({"nosuch/*"});
    EXPECT_NE(error({"g", "nosuch"}).find("--group \"nosuch\": group \"nosuch\" does not exist"), std::string::npos);
    EXPECT_NE(error({"g", "nosuch/1"}).find("does not exist"), std::string::npos);
    // A sharded group without its shard: the error of a relay of one shard.
    EXPECT_NE(error({"g", "orders"}).find("--group orders/0 to orders/3"), std::string::npos) << error({"g", "orders"});
    EXPECT_NE(error({"g", "orders"}).find("--group 'orders/*'"), std::string::npos);
    EXPECT_NE(error({"g", "orders/4"}).find("has no shard 4; its shards are orders/0 to orders/3"), std::string::npos)
        << error({"g", "orders/4"});
    EXPECT_NE(error({"g/1", "audit/0"}).find("has no shard 1"), std::string::npos);
    // The same group or shard twice, however named.
    EXPECT_NE(error({"orders/*", "orders/2"}).find("\"orders/2\" names a group or shard that \"orders/*\" names too"),
              std::string::npos)
        << error({"orders/*", "orders/2"});
    EXPECT_NE(error({"orders/2", "orders/*"}).find("that \"orders/2\" names too"), std::string::npos);
    EXPECT_NE(error({"g", "g/0"}).find("names too"), std::string::npos);
    EXPECT_NE(error({"g/*", "g"}).find("names too"), std::string::npos);
    EXPECT_NE(error({"g", "g"}).find("is given twice"), std::string::npos);
    // Shards need streams of their own.
    EXPECT_NE(error({"g", "audit/*"}, "outbox:{topic}").find("put {shard} in the template"), std::string::npos);
    EXPECT_NE(error({"g", "orders/1"}, "outbox:{group}:{topic}").find("put {shard} in the template"),
              std::string::npos);
}
