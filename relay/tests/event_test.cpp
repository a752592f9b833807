#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pg_outbox/event.hpp"
#include "pg_outbox/position.hpp"
#include "pg_outbox/redis.hpp"

using namespace pg_outbox;

namespace {
// The default format's fields, for the tests of the argv builders.
EntryFields plain_fields;
}  // namespace

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
    append_entry_fields(argv, e, plain_fields);
    std::vector<std::string> got(argv.begin(), argv.end());
    std::vector<std::string> want{"event_id", "0193-id", "topic", "orders", "payload", "{\"a\": 1}",
                                  "position", "5-1", "created_at", "2026-01-01 00:00:00+00"};
    EXPECT_EQ(got, want);

    e.key = "k";
    e.headers = "{}";
    argv.clear();
    append_entry_fields(argv, e, plain_fields);
    EXPECT_EQ(argv.size(), want.size() + 4);
    EXPECT_EQ(argv[4], "key");
    EXPECT_EQ(argv[5], "k");
    EXPECT_EQ(argv[8], "headers");
}

TEST(Event, ScriptArgvCarriesIdsAndFieldCounts) {
    Event a{"5-1", "id-a", "t", std::string("k"), "1", std::nullopt, "ts"};
    Event b{"5-2", "id-b", "t", std::nullopt, "2", std::string("{}"), "ts"};
    std::vector<std::string> counts;
    auto argv = append_script_argv("sha", "outbox:t", {&a, &b}, IdMode::explicit_position, "0", "4-9", counts, plain_fields);
    ASSERT_GE(argv.size(), 8u);
    EXPECT_EQ(argv[0], "EVALSHA");
    EXPECT_EQ(argv[1], "sha");
    EXPECT_EQ(argv[2], "1");
    EXPECT_EQ(argv[3], "outbox:t");
    EXPECT_EQ(argv[4], "0");
    EXPECT_EQ(argv[5], "4-9");
    EXPECT_EQ(argv[6], "5-1");
    EXPECT_EQ(argv[7], "id-a");  // the event id, which the script compares on a replay
    EXPECT_EQ(argv[8], "12");    // six field/value pairs for a
    EXPECT_EQ(argv[9 + 12], "5-2");
    EXPECT_EQ(argv[10 + 12], "id-b");
    EXPECT_EQ(argv[11 + 12], "12");  // six pairs for b too
    EXPECT_EQ(argv.size(), 6u + 3 + 12 + 3 + 12);

    auto generated = append_script_argv("sha", "outbox:t", {&a}, IdMode::redis_generated, "100", "", counts, plain_fields);
    EXPECT_EQ(generated[4], "100");
    EXPECT_EQ(generated[5], "");
    EXPECT_EQ(generated[6], "*");
}

TEST(Event, XaddArgvIsTheScriptsEntry) {
    Event a{"5-1", "id-a", "t", std::string("k"), "1", std::nullopt, "ts"};
    std::vector<std::string_view> argv{"left over"};
    xadd_argv(argv, "outbox:t", a, "4-7", "", plain_fields);
    std::vector<std::string_view> fields;
    append_entry_fields(fields, a, plain_fields);
    std::vector<std::string_view> want{"XADD", "outbox:t", "5-1"};
    want.insert(want.end(), fields.begin(), fields.end());
    want.insert(want.end(), {"prev", "4-7"});  // last, as the script adds it
    EXPECT_EQ(argv, want);

    xadd_argv(argv, "outbox:t", a, "0-0", "100", plain_fields);
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
    EXPECT_EQ(entry_bytes(e, plain_fields), plain);
    e.key = "k1";
    e.headers = "{}";
    EXPECT_EQ(entry_bytes(e, plain_fields), plain + (3 + 2) + (7 + 2));
}

namespace {

// A packed batch built by hand, as extension/pack.c writes one.
struct Packer {
    std::string bytes;
    void u32(std::uint32_t v) {
        for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>(v >> shift & 0xFF));
    }
    void u64(std::uint64_t v) {
        for (int shift = 56; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>(v >> shift & 0xFF));
    }
    void field(std::optional<std::string_view> v) {
        if (!v) return u32(0xFFFFFFFFu);
        u32(static_cast<std::uint32_t>(v->size()));
        bytes.append(*v);
    }
    void header(std::uint32_t count, std::int64_t age_us) {
        bytes.append("OBP1");
        u32(count);
        u64(static_cast<std::uint64_t>(age_us));
    }
    void event(std::string_view position, std::optional<std::string_view> key, std::optional<std::string_view> headers,
               std::string_view payload = "{\"a\": 1}") {
        field(position);
        field("01a23461-8e0b-7b2b-aa39-d4d4e56e99d8");
        field("orders");
        field(key);
        field(payload);
        field(headers);
        field("2026-12-02T01:30:00.123456Z");
    }
};

}  // namespace

TEST(PackedBatch, UnpacksEveryFieldAndNulls) {
    Packer p;
    p.header(2, 1500000);
    using namespace std::string_view_literals;
    p.event("42-1", "k\0ey"sv, std::nullopt, "{\"s\": \"\\u0000 is not here, \\\" is\"}");
    p.event("42-2", std::nullopt, "{\"trace\": 1}");
    const auto b = unpack_batch(p.bytes);
    ASSERT_EQ(b.events.size(), 2u);
    EXPECT_EQ(b.events[0].position, "42-1");
    EXPECT_EQ(b.events[0].parsed.to_string(), "42-1");
    EXPECT_EQ(b.events[0].event_id, "01a23461-8e0b-7b2b-aa39-d4d4e56e99d8");
    EXPECT_EQ(b.events[0].topic, "orders");
    EXPECT_EQ(b.events[0].key, std::optional<std::string>(std::string("k\0ey", 4)));
    EXPECT_EQ(b.events[0].payload, "{\"s\": \"\\u0000 is not here, \\\" is\"}");
    EXPECT_FALSE(b.events[0].headers);
    EXPECT_EQ(b.events[0].created_at, "2026-12-02T01:30:00.123456Z");
    EXPECT_FALSE(b.events[1].key);
    EXPECT_EQ(b.events[1].headers, std::optional<std::string>("{\"trace\": 1}"));
    ASSERT_TRUE(b.first_age_seconds);
    EXPECT_DOUBLE_EQ(*b.first_age_seconds, 1.5);
}

// A batch unpacked into the events of the one before holds exactly what a
// fresh unpack holds: no field, NULL or length is left from the last.
TEST(PackedBatch, UnpackingIntoARecycledBatchLeavesNothingOfIt) {
    using namespace std::string_view_literals;
    Packer big;
    big.header(3, 2000000);
    big.event("7-1", "a long key, longer than any small string"sv, "{\"h\": \"headers of the first batch\"}",
              std::string(5000, 'x'));
    big.event("7-2", "k2"sv, std::nullopt);
    big.event("7-3", std::nullopt, "{}");
    Packer small;
    small.header(2, -1);
    small.event("8-1", std::nullopt, "{\"trace\": 2}", "{}");
    small.event("8-2", "k"sv, std::nullopt, "");
    PackedBatch b = unpack_batch(big.bytes);
    ASSERT_EQ(b.events.size(), 3u);
    unpack_batch(small.bytes, b);
    const auto fresh = unpack_batch(small.bytes);
    ASSERT_EQ(b.events.size(), 2u);
    EXPECT_FALSE(b.first_age_seconds);
    for (std::size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(b.events[i].position, fresh.events[i].position);
        EXPECT_EQ(b.events[i].parsed, fresh.events[i].parsed);
        EXPECT_EQ(b.events[i].key, fresh.events[i].key);
        EXPECT_EQ(b.events[i].payload, fresh.events[i].payload);
        EXPECT_EQ(b.events[i].headers, fresh.events[i].headers);
        EXPECT_EQ(b.events[i].created_at, fresh.events[i].created_at);
    }
    EXPECT_EQ(b.events[0].headers, std::optional<std::string>("{\"trace\": 2}"));
    EXPECT_EQ(b.events[1].payload, "");
    // Grown again, and refused halfway: the caller drops what is there.
    unpack_batch(big.bytes, b);
    EXPECT_EQ(b.events.size(), 3u);
    EXPECT_EQ(b.events[0].payload, std::string(5000, 'x'));
    EXPECT_THROW(unpack_batch(std::string_view(big.bytes).substr(0, big.bytes.size() - 1), b), std::invalid_argument);
}

TEST(PackedBatch, EmptyBatchHasNoAge) {
    Packer p;
    p.header(0, -1);
    const auto b = unpack_batch(p.bytes);
    EXPECT_TRUE(b.events.empty());
    EXPECT_FALSE(b.first_age_seconds);
}

// Whatever the bytes, a malformed batch is refused with a reason, never
// read past its end or half used.
TEST(PackedBatch, MalformedBatchesAreRefused) {
    Packer good;
    good.header(1, 0);
    good.event("42-1", "k", std::nullopt);
    // Every truncation of a whole batch.
    for (std::size_t n = 0; n < good.bytes.size(); ++n)
        EXPECT_THROW(unpack_batch(std::string_view(good.bytes).substr(0, n)), std::invalid_argument) << n;
    EXPECT_THROW(unpack_batch(good.bytes + "x"), std::invalid_argument);  // trailing bytes
    auto wrong_magic = good.bytes;
    wrong_magic[3] = '2';
    EXPECT_THROW(unpack_batch(wrong_magic), std::invalid_argument);
    // A count larger than the bytes could hold, up to 2^32 - 1.
    for (std::uint32_t count : {2u, 1000u, 0xFFFFFFFFu}) {
        Packer p;
        p.header(count, 0);
        p.event("42-1", "k", std::nullopt);
        EXPECT_THROW(unpack_batch(p.bytes), std::invalid_argument) << count;
    }
    // Lengths below -1, and huge ones.
    for (std::uint32_t length : {0xFFFFFFFEu, 0x80000000u, 0x7FFFFFFFu}) {
        Packer p;
        p.header(1, 0);
        p.u32(length);
        p.bytes.append(40, 'x');
        EXPECT_THROW(unpack_batch(p.bytes), std::invalid_argument) << length;
    }
    // NULL where a field cannot be NULL, and a malformed position.
    {
        Packer p;
        p.header(1, 0);
        p.field(std::nullopt);
        for (int i = 0; i < 6; ++i) p.field("x");
        EXPECT_THROW(unpack_batch(p.bytes), std::invalid_argument);
    }
    for (std::string_view position : {"", "42", "42-", "-1", "x-1", "18446744073709551616-1"}) {
        Packer p;
        p.header(1, 0);
        p.event(position, "k", std::nullopt);
        EXPECT_THROW(unpack_batch(p.bytes), std::invalid_argument) << position;
    }
}
