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
