// Unit tests of the W3C Trace Context checks (trace_context.hpp): every
// hostile value of the contract is refused, the valid ones kept.
#include <gtest/gtest.h>

#include <string>

#include "pg_outbox/trace_context.hpp"

using namespace pg_outbox;

namespace {
const std::string kParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
}  // namespace

TEST(TraceContext, ValidTraceparent) {
    EXPECT_TRUE(valid_traceparent(kParent));
    EXPECT_TRUE(valid_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"));
    EXPECT_TRUE(valid_traceparent("00-00000000000000000000000000000001-0000000000000001-ff"));
}

TEST(TraceContext, HostileTraceparents) {
    const std::string zeros_trace = "00-00000000000000000000000000000000-b7ad6b7169203331-01";
    const std::string zeros_parent = "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01";
    for (const std::string& bad : std::vector<std::string>{
             std::string(),
             kParent.substr(0, 54),                                      // one short
             kParent + "0",                                              // one over
             kParent + "-",                                              // a future version's suffix
             "ff" + kParent.substr(2),                                   // version ff
             "01" + kParent.substr(2),                                   // a future version
             "0A" + kParent.substr(2),                                   // uppercase version
             "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",  // uppercase trace id
             "00-0af7651916cd43dd8448eb211c80319c-B7AD6B7169203331-01",  // uppercase parent id
             "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0F",  // uppercase flags
             "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",  // not hex
             "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  // wrong separator
             "00-0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331-01",
             "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331_01",
             zeros_trace, zeros_parent,
             " " + kParent.substr(1),
             std::string("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0\0", 55),  // NUL
             std::string("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0\xc3", 55),  // not ASCII
             std::string(100000, '0'),  // huge
         })
        EXPECT_FALSE(valid_traceparent(bad)) << bad;
}

TEST(TraceContext, ValidTracestate) {
    for (const std::string& ok : std::vector<std::string>{
             std::string(),  // an empty list
             std::string("congo=t61rcWkgMzE"),
             std::string("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
             std::string(" rojo=1 , congo=2 , "),          // spaces around members
             std::string("a,,b=1") .substr(2),                 // ",b=1": an empty member
             std::string("tenant@system=v"),
             std::string("a_b-c*d/e=1"),
             std::string("0k=v"),
             std::string("k=" + std::string(256, 'v')),        // the longest value
             std::string(256, 'k') + "=v",                     // the longest simple key
             std::string(241, 't') + "@" + std::string(14, 's') + "=v",  // the longest multi-tenant key
             std::string("k=a b"),                             // a space inside a value
             std::string("k=\"quoted\\\""),                    // quotes and backslashes are printable
         })
        EXPECT_TRUE(valid_tracestate(ok)) << ok;
    // 32 members, and exactly 512 bytes.
    std::string members;
    for (int i = 0; i < 32; ++i) members += (i ? ",k" : "k") + std::to_string(i) + "=v";
    EXPECT_TRUE(valid_tracestate(members));
    std::string long_state = "k=" + std::string(256, 'v');
    long_state += ",l=" + std::string(512 - long_state.size() - 3, 'w');
    ASSERT_EQ(long_state.size(), 512u);
    EXPECT_TRUE(valid_tracestate(long_state));
}

TEST(TraceContext, HostileTracestates) {
    std::string members33;
    for (int i = 0; i < 33; ++i) members33 += (i ? ",k" : "k") + std::to_string(i) + "=v";
    std::string over512 = "k=" + std::string(256, 'v');
    over512 += ",l=" + std::string(513 - over512.size() - 3, 'w');
    ASSERT_EQ(over512.size(), 513u);
    for (const std::string& bad : std::vector<std::string>{
             members33,                                   // 33 members
             over512,                                     // 513 bytes
             std::string("k"),                            // no '='
             std::string("=v"),                           // no key
             std::string("k="),                           // empty value
             std::string("K=v"),                          // uppercase key
             std::string("_k=v"),                         // key starting with '_'
             std::string("k!=v"),                         // a character keys do not take
             std::string("k=" + std::string(257, 'v')),   // value too long
             std::string(257, 'k') + "=v",                // simple key too long
             std::string(242, 't') + "@s=v",              // tenant too long
             std::string("t@" + std::string(15, 's') + "=v"),  // system too long
             std::string("t@0s=v"),                       // system starting with a digit
             std::string("@s=v"),                         // empty tenant
             std::string("t@=v"),                         // empty system
             std::string("t@s@x=v"),                      // two '@'
             std::string("k=v=w"),                        // '=' in a value
             std::string("k=v\x7f"),                      // DEL
             std::string("k=v\tw"),                       // a tab inside a value
             std::string("k=v\nl=w"),                     // a newline
             std::string("k=v\0", 4),                     // NUL
             std::string("k=caf\xc3\xa9"),                // not ASCII
             std::string("k=\xff\xfe"),                   // invalid UTF-8
             std::string(1 << 20, 'k'),                   // huge
         })
        EXPECT_FALSE(valid_tracestate(bad)) << bad;
}
