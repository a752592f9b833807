#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pg_outbox/event.hpp"
#include "pg_outbox/position.hpp"
#include "pg_outbox/redis.hpp"

using namespace pg_outbox;

TEST(Position, ParsesAndOrders) {
    auto p = Position::parse("1042-3");
    ASSERT_TRUE(p);
    EXPECT_EQ(p->major, 1042u);
    EXPECT_EQ(p->minor, 3u);
    EXPECT_EQ(p->to_string(), "1042-3");
    EXPECT_LT(*Position::parse("9-100"), *Position::parse("10-1"));
    EXPECT_LT(*Position::parse("10-1"), *Position::parse("10-2"));
    EXPECT_EQ(*Position::parse("18446744073709551615-0"), (Position{18446744073709551615ull, 0}));
    for (const char* bad : {"", "1", "1-", "-1", "a-1", "1-b", "1-2-3", "18446744073709551616-0", " 1-2"})
        EXPECT_FALSE(Position::parse(bad)) << bad;
}

TEST(Event, AlreadyPublishedError) {
    EXPECT_TRUE(is_already_published_error(
        "ERR The ID specified in XADD is equal or smaller than the target stream top item"));
    EXPECT_FALSE(is_already_published_error("OOM command not allowed when used memory > 'maxmemory'."));
    EXPECT_FALSE(is_already_published_error("WRONGTYPE Operation against a key holding the wrong kind of value"));
}

TEST(Event, EntryFieldsOmitNulls) {
    Event e{"5-1", "0193-id", "orders", std::nullopt, "{\"a\": 1}", std::nullopt, "2026-01-01 00:00:00+00"};
    std::vector<std::string_view> argv;
    append_entry_fields(argv, e);
    std::vector<std::string> got(argv.begin(), argv.end());
    std::vector<std::string> want{"event_id", "0193-id", "topic", "orders", "payload", "{\"a\": 1}",
                                  "position", "5-1", "created_at", "2026-01-01 00:00:00+00"};
    EXPECT_EQ(got, want);

    e.key = "k";
    e.headers = "{}";
    argv.clear();
    append_entry_fields(argv, e);
    EXPECT_EQ(argv.size(), want.size() + 4);
    EXPECT_EQ(argv[4], "key");
    EXPECT_EQ(argv[5], "k");
    EXPECT_EQ(argv[8], "headers");
}

TEST(Event, ScriptArgvCarriesIdsAndFieldCounts) {
    Event a{"5-1", "id-a", "t", std::string("k"), "1", std::nullopt, "ts"};
    Event b{"5-2", "id-b", "t", std::nullopt, "2", std::string("{}"), "ts"};
    std::vector<std::string> counts;
    auto argv = append_script_argv("sha", "outbox:t", {&a, &b}, IdMode::explicit_position, "0", "4-9", counts);
    ASSERT_GE(argv.size(), 8u);
    EXPECT_EQ(argv[0], "EVALSHA");
    EXPECT_EQ(argv[1], "sha");
    EXPECT_EQ(argv[2], "1");
    EXPECT_EQ(argv[3], "outbox:t");
    EXPECT_EQ(argv[4], "0");
    EXPECT_EQ(argv[5], "4-9");
    EXPECT_EQ(argv[6], "5-1");
    EXPECT_EQ(argv[7], "12");  // six field/value pairs for a
    EXPECT_EQ(argv[8 + 12], "5-2");
    EXPECT_EQ(argv[9 + 12], "12");  // six pairs for b too
    EXPECT_EQ(argv.size(), 6u + 2 + 12 + 2 + 12);

    auto generated = append_script_argv("sha", "outbox:t", {&a}, IdMode::redis_generated, "100", "", counts);
    EXPECT_EQ(generated[4], "100");
    EXPECT_EQ(generated[5], "");
    EXPECT_EQ(generated[6], "*");
}

TEST(Event, XaddArgvIsTheScriptsEntry) {
    Event a{"5-1", "id-a", "t", std::string("k"), "1", std::nullopt, "ts"};
    std::vector<std::string_view> argv{"left over"};
    xadd_argv(argv, "outbox:t", a, "4-7", "");
    std::vector<std::string_view> fields;
    append_entry_fields(fields, a);
    std::vector<std::string_view> want{"XADD", "outbox:t", "5-1"};
    want.insert(want.end(), fields.begin(), fields.end());
    want.insert(want.end(), {"prev", "4-7"});  // last, as the script adds it
    EXPECT_EQ(argv, want);

    xadd_argv(argv, "outbox:t", a, "0-0", "100");
    ASSERT_GE(argv.size(), 6u);
    EXPECT_EQ(argv[2], "MAXLEN");
    EXPECT_EQ(argv[3], "~");
    EXPECT_EQ(argv[4], "100");
    EXPECT_EQ(argv[5], "5-1");
    EXPECT_EQ(argv.size(), want.size() + 3);
    EXPECT_EQ(argv[argv.size() - 2], "prev");
    EXPECT_EQ(argv.back(), "0-0");
}

TEST(Redis, FormatsCommandsInTheProtocol) {
    std::string out = "left ";
    format_command(out, {"XADD", "s", "", std::string_view("a\0b", 3)});
    EXPECT_EQ(out, std::string("left *4\r\n$4\r\nXADD\r\n$1\r\ns\r\n$0\r\n\r\n$3\r\na\0b\r\n", 41));
}

TEST(Event, EntryBytesCountTheIdAndEveryFieldPresent) {
    Event e{"5-1", "0193-id", "orders", std::nullopt, "{\"a\": 1}", std::nullopt, "2026-01-01T00:00:00.000000Z"};
    // id, then names and values: event_id topic payload position
    // created_at, and prev counted as long as the id
    const std::size_t plain = 3 + (8 + 7) + (5 + 6) + (7 + 8) + (8 + 3) + (10 + 27) + (4 + 3);
    EXPECT_EQ(entry_bytes(e), plain);
    e.key = "k1";
    e.headers = "{}";
    EXPECT_EQ(entry_bytes(e), plain + (3 + 2) + (7 + 2));
}
