// Unit tests of how consume mode reads stream entries and passes them on.
#include <gtest/gtest.h>

#include "pg_outbox/consumer.hpp"

using namespace pg_outbox;

TEST(Entry, ByteaArrayBinaryFormat) {
    const std::string a("a\0\xff", 3);
    const std::string empty;
    const std::string bytes = pg_bytea_array({&a, nullptr, &empty});
    const std::string expect = std::string("\0\0\0\1" "\0\0\0\1" "\0\0\0\x11" "\0\0\0\3" "\0\0\0\1", 20) +
                               std::string("\0\0\0\3" "a\0\xff", 7) + std::string("\xff\xff\xff\xff", 4) +
                               std::string("\0\0\0\0", 4);
    EXPECT_EQ(bytes, expect);
    EXPECT_EQ(pg_bytea_array({}), std::string("\0\0\0\0" "\0\0\0\0" "\0\0\0\x11", 12));
}

// Streams and entry ids go to inbox_consume_keyed() as a binary text[]:
// the bytea layout with the text element type.
TEST(Entry, TextArrayBinaryFormat) {
    const std::string a = "outbox:a", b = "1-2";
    const std::string expect = std::string("\0\0\0\1" "\0\0\0\0" "\0\0\0\x19" "\0\0\0\2" "\0\0\0\1", 20) +
                               std::string("\0\0\0\x08" "outbox:a", 12) + std::string("\0\0\0\3" "1-2", 7);
    EXPECT_EQ(pg_text_array({&a, &b}), expect);
    EXPECT_EQ(pg_text_array({}), std::string("\0\0\0\0" "\0\0\0\0" "\0\0\0\x19", 12));
}

// inbox_parked_keys() returns key_bytes as text; any bytes come back, and
// anything but "\x" and pairs of hex digits is refused.
TEST(Entry, ByteaFromHex) {
    EXPECT_EQ(pg_bytea_from_hex("\\x"), std::string());
    EXPECT_EQ(pg_bytea_from_hex("\\x00ff41"), std::string("\0\xff" "A", 3));
    EXPECT_EQ(pg_bytea_from_hex("\\xDEADbeef"), std::string("\xde\xad\xbe\xef"));
    for (const char* bad : {"", "\\", "x00", "\\x0", "\\x0g", "\\X00", "00ff", "\\x00 ", "\\000"})
        EXPECT_EQ(pg_bytea_from_hex(bad), std::nullopt) << bad;
}

// A key in a log line: its first 64 bytes, quoted, control characters
// escaped, the size of a longer one said.
TEST(Entry, LogKeyIsCutAndEscaped) {
    EXPECT_EQ(log_key("acc-7"), "\"acc-7\"");
    EXPECT_EQ(log_key(""), "\"\"");
    EXPECT_EQ(log_key("a\nb\x1b"), "\"a\\nb\\x1b\"");
    const std::string big(1 << 20, 'k');
    EXPECT_EQ(log_key(big), "\"" + std::string(64, 'k') + "\" (1 MiB)");
}

TEST(Entry, FieldsKeptAsReceived) {
    StreamEntry e;
    e.fields = {{"payload", "1"}, {std::string("\0", 1), "x"}, {"payload", "2"}};
    ASSERT_NE(e.field("payload"), nullptr);
    EXPECT_EQ(*e.field("payload"), "1");
    EXPECT_EQ(e.field("event_id"), nullptr);
    EXPECT_EQ(e.count("payload"), 2u);
    EXPECT_EQ(e.bytes(), 7u + 1 + 1 + 1 + 7 + 1);
}

TEST(Entry, FramingFaults) {
    StreamEntry ok;
    ok.fields = {{"event_id", "x"}, {"payload", "\xff"}, {"other", "1"}, {"other", "2"}};
    EXPECT_FALSE(framing_fault(ok));  // content is the server's to judge
    StreamEntry twice = ok;
    twice.fields.emplace_back("payload", "{}");
    auto f = framing_fault(twice);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->second, "22023");
    EXPECT_NE(f->first.find("\"payload\" appears 2 times"), std::string::npos);
    StreamEntry huge;
    huge.fields = {{"payload", std::string(kMaxEntryBytes + 1, 'x')}};
    f = framing_fault(huge);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->second, "54000");
}

namespace {

// An entry of a relay: its id and the fields, prev last (nullptr: none).
StreamEntry relay_entry(const std::string& stream, const std::string& id, const char* prev) {
    StreamEntry e;
    e.stream = stream;
    e.id = id;
    e.fields = {{"event_id", "x"}, {"topic", "t"}, {"payload", "{}"}, {"position", id}, {"created_at", "now"}};
    if (prev) e.fields.emplace_back("prev", prev);
    return e;
}

}  // namespace

TEST(Entry, PrevAbsentOrValid) {
    auto none = relay_entry("s", "7-1", nullptr);
    EXPECT_EQ(entry_prev(none).kind, EntryPrev::Kind::absent);
    EXPECT_FALSE(framing_fault(none));  // entries of earlier relays are fine
    for (const auto& [id, prev] : std::vector<std::pair<std::string, std::string>>{
             {"7-1", "0-0"}, {"7-1", "7-0"}, {"7-1", "6-18446744073709551615"},
             {"18446744073709551615-18446744073709551615", "18446744073709551615-18446744073709551614"}}) {
        auto e = relay_entry("s", id, prev.c_str());
        const auto p = entry_prev(e);
        ASSERT_EQ(p.kind, EntryPrev::Kind::valid) << prev;
        EXPECT_EQ(p.prev, *Position::parse(prev));
        EXPECT_FALSE(framing_fault(e)) << prev;
    }
}

// Each hostile prev alone makes its entry malformed, with a SQLSTATE and a
// reason that does not quote the bytes.
TEST(Entry, PrevHostile) {
    const std::vector<std::pair<std::string, std::string>> cases{
        {"", "22P02"},
        {"abc", "22P02"},
        {"7", "22P02"},
        {"7-", "22P02"},
        {"-7", "22P02"},
        {"+1-0", "22P02"},
        {" 1-0", "22P02"},
        {"1-0 ", "22P02"},
        {"01x-0", "22P02"},
        {"18446744073709551616-0", "22P02"},     // above 2^64 - 1
        {std::string("1-0\0", 4), "22P02"},      // NUL byte
        {std::string("\0", 1), "22P02"},
        {"1-0\n2-0", "22P02"},
        {std::string(1 << 20, '1'), "22P02"},   // huge
        {"00000000000000000000000000000000000000001-0", "22P02"},  // over 41 bytes
        {"\xff\xfe", "22P02"},
        {"7-1", "22023"},                        // the entry itself
        {"7-2", "22023"},                        // after the entry
        {"8-0", "22023"},
    };
    for (const auto& [prev, sqlstate] : cases) {
        auto e = relay_entry("s", "7-1", prev.c_str());
        e.fields.back().second = prev;  // bytes, NULs included
        const auto p = entry_prev(e);
        EXPECT_EQ(p.kind, EntryPrev::Kind::malformed) << prev.size();
        EXPECT_EQ(p.sqlstate, sqlstate) << prev.size();
        const auto f = framing_fault(e);
        ASSERT_TRUE(f) << prev.size();
        EXPECT_EQ(f->second, sqlstate);
        EXPECT_LT(f->first.size(), 200u);
        EXPECT_EQ(f->first.find('\0'), std::string::npos);
    }
    auto twice = relay_entry("s", "7-1", "7-0");
    twice.fields.emplace_back("prev", "7-0");
    EXPECT_EQ(entry_prev(twice).kind, EntryPrev::Kind::malformed);
    const auto f = framing_fault(twice);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->second, "22023");
    EXPECT_NE(f->first.find("\"prev\" appears 2 times"), std::string::npos);
}

TEST(Gaps, NoneWhenEachEntryNamesTheOneBefore) {
    const std::vector<StreamEntry> read{relay_entry("a", "5-1", "4-9"), relay_entry("b", "9-0", "0-0"),
                                        relay_entry("a", "5-2", "5-1"), relay_entry("b", "9-1", "9-0")};
    EXPECT_TRUE(find_gaps({{"a", {4, 9}}, {"b", {0, 0}}}, read).empty());
}

TEST(Gaps, ExactRanges) {
    // a: 4-9 delivered, then 5-1 (4-9 before it), 5-3 names 5-2 (missing),
    // 6-0 names 5-9 (missing: after 5-3). b: the first entry read names an
    // entry after the group's position.
    const std::vector<StreamEntry> read{relay_entry("a", "5-1", "4-9"), relay_entry("a", "5-3", "5-2"),
                                        relay_entry("b", "9-1", "9-0"), relay_entry("a", "6-0", "5-9")};
    const auto gaps = find_gaps({{"a", {4, 9}}, {"b", {2, 0}}}, read);
    ASSERT_EQ(gaps.size(), 3u);
    EXPECT_EQ(gaps[0].stream, "a");
    EXPECT_EQ(gaps[0].range(), "(5-1 5-2]");
    EXPECT_EQ(gaps[0].found, "5-3");
    EXPECT_EQ(gaps[1].stream, "b");
    EXPECT_EQ(gaps[1].range(), "(2-0 9-0]");
    EXPECT_EQ(gaps[2].range(), "(5-3 5-9]");
    EXPECT_EQ(gaps[2].found, "6-0");
}

TEST(Gaps, NoFalseAlarms) {
    // A prev at or before the group's position: the group was moved past
    // entries (XGROUP SETID, a trimmed range reported): no gap. Entries
    // without prev (earlier relays) or with a malformed one are not
    // checked, but count as delivered. A stream whose position is unknown
    // is not checked.
    const std::vector<StreamEntry> read{
        relay_entry("a", "5-1", "3-0"),    // group at 4-0: moved past 3-0
        relay_entry("a", "5-2", nullptr),  // no prev
        relay_entry("a", "5-3", "5-2"),
        relay_entry("a", "5-4", "zz"),     // malformed: not checked
        relay_entry("a", "5-5", "5-4"),
        relay_entry("a", "5-6", "9-9"),    // malformed (after itself): not checked
        relay_entry("a", "5-7", "5-6"),
        relay_entry("c", "1-5", "1-1"),    // unknown position
    };
    EXPECT_TRUE(find_gaps({{"a", {4, 0}}}, read).empty());
    // An entry of an earlier relay, then one naming an entry after it.
    const auto gaps = find_gaps({{"a", {4, 0}}}, {relay_entry("a", "5-2", nullptr), relay_entry("a", "5-8", "5-7")});
    ASSERT_EQ(gaps.size(), 1u);
    EXPECT_EQ(gaps[0].range(), "(5-2 5-7]");
}
