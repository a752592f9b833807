// Unit tests of the stream entry formats: the fields each --format writes
// (EntryFields), and how consume mode reads every format back into the
// fields it applies (read_entry_format()).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "pg_outbox/event.hpp"
#include "pg_outbox/inbox_session.hpp"
#include "pg_outbox/json_text.hpp"
#include "pg_outbox/stream_entry.hpp"

using namespace pg_outbox;

namespace {

const std::string kParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const std::string kSource = "/pg_outbox/app/g";

Event event(std::optional<std::string> key = "k-1", std::optional<std::string> headers = std::nullopt,
            std::string created_at = "2026-01-01T00:00:00.000000Z") {
    Event e{"7-3", "0193a3c4-0000-7000-8000-000000000001", "orders", std::move(key), R"({"n": 1, "amount": 10})",
            std::move(headers), std::move(created_at)};
    e.parsed = *Position::parse(e.position);
    return e;
}

using Fields = std::vector<std::pair<std::string, std::string>>;

Fields fields_of(EntryFields& writer, const Event& e) {
    std::vector<std::string_view> argv;
    writer.append(argv, e);
    EXPECT_EQ(argv.size() % 2, 0u);
    Fields out;
    for (std::size_t i = 0; i + 1 < argv.size(); i += 2) out.emplace_back(argv[i], argv[i + 1]);
    return out;
}

std::vector<std::string> names_of(const Fields& f) {
    std::vector<std::string> out;
    for (const auto& [n, v] : f) out.push_back(n);
    return out;
}

std::string value_of(const Fields& f, const std::string& name) {
    for (const auto& [n, v] : f)
        if (n == name) return v;
    return "(absent)";
}

// An entry read back from the fields a writer gave, with "prev".
StreamEntry entry_of(const Fields& f) {
    StreamEntry e;
    e.stream = "outbox:orders";
    e.id = "7-3";
    e.fields.assign(f.begin(), f.end());
    e.fields.emplace_back("prev", "7-2");
    read_entry_format(e);
    return e;
}

std::string field_or(const StreamEntry& e, const char* name) {
    const auto* v = e.field(name);
    return v ? *v : "(absent)";
}

}  // namespace

TEST(EntryFormat, DefaultFieldsInOrder) {
    EntryFields writer;
    auto f = fields_of(writer, event());
    EXPECT_EQ(names_of(f), (std::vector<std::string>{"event_id", "topic", "key", "payload", "position", "created_at"}));
    // Headers with a valid trace context: traceparent and tracestate after them.
    const std::string headers = R"({"a": 1, "traceparent": ")" + kParent + R"(", "tracestate": "congo=t61rcWkgMzE"})";
    f = fields_of(writer, event("k", headers));
    EXPECT_EQ(names_of(f), (std::vector<std::string>{"event_id", "topic", "key", "payload", "headers", "traceparent",
                                                      "tracestate", "position", "created_at"}));
    EXPECT_EQ(value_of(f, "headers"), headers);
    EXPECT_EQ(value_of(f, "traceparent"), kParent);
    EXPECT_EQ(value_of(f, "tracestate"), "congo=t61rcWkgMzE");
    // Invalid ones, a nested one, a non-string one: no field.
    for (const std::string& h :
         {std::string(R"({"traceparent": "00-zz"})"), std::string(R"({"x": {"traceparent": ")" + kParent + R"("}})"),
          std::string(R"({"traceparent": 5})"), std::string(R"({"tracestate": "a=b"})")}) {
        f = fields_of(writer, event("k", h));
        EXPECT_EQ(value_of(f, "traceparent"), "(absent)") << h;
        EXPECT_EQ(value_of(f, "tracestate"), "(absent)") << h;
    }
    // A tracestate with characters JSON escapes comes out decoded.
    f = fields_of(writer, event("k", R"({"traceparent": ")" + kParent + R"(", "tracestate": "k=a\"b\\c"})"));
    EXPECT_EQ(value_of(f, "tracestate"), "k=a\"b\\c");
    // An invalid tracestate is left out, the traceparent kept.
    f = fields_of(writer, event("k", R"({"traceparent": ")" + kParent + R"(", "tracestate": "K=1"})"));
    EXPECT_EQ(value_of(f, "traceparent"), kParent);
    EXPECT_EQ(value_of(f, "tracestate"), "(absent)");
}

TEST(EntryFormat, BinaryFieldsInOrder) {
    EntryFields writer(EntryFormat::cloudevents, kSource);
    const std::string headers =
        R"({"id": "user", "type": "t", "specversion": "0.3", "traceparent": ")" + kParent + R"(", "tracestate": "a=1", "n": 1.50})";
    const auto e = event("k-1", headers);
    auto f = fields_of(writer, e);
    const Fields want{{"ce_specversion", "1.0"},
                      {"ce_id", e.event_id},
                      {"ce_source", kSource},
                      {"ce_type", "orders"},
                      {"ce_time", "2026-01-01T00:00:00.000000Z"},
                      {"ce_subject", "k-1"},
                      {"ce_partitionkey", "k-1"},
                      {"ce_sequence", "00000000000000000007-00000000000000000003"},
                      {"ce_traceparent", kParent},
                      {"ce_tracestate", "a=1"},
                      {"ce_pgoutboxheaders", R"({"id": "user", "type": "t", "specversion": "0.3", "n": 1.50})"},
                      {"content-type", "application/json"},
                      {"data", e.payload}};
    EXPECT_EQ(f, want);
    // No key, no headers, no created_at: those fields are absent.
    f = fields_of(writer, event(std::nullopt, std::nullopt, ""));
    EXPECT_EQ(names_of(f), (std::vector<std::string>{"ce_specversion", "ce_id", "ce_source", "ce_type", "ce_sequence",
                                                      "content-type", "data"}));
    // Headers of a trace context only, or empty: no ce_pgoutboxheaders.
    f = fields_of(writer, event("k", R"({"traceparent": ")" + kParent + R"("})"));
    EXPECT_EQ(value_of(f, "ce_pgoutboxheaders"), "(absent)");
    EXPECT_EQ(value_of(f, "ce_traceparent"), kParent);
    f = fields_of(writer, event("k", "{}"));
    EXPECT_EQ(value_of(f, "ce_pgoutboxheaders"), "(absent)");
    // An invalid traceparent is neither an attribute nor kept in the headers.
    f = fields_of(writer, event("k", R"({"traceparent": "bad", "b": 2})"));
    EXPECT_EQ(value_of(f, "ce_traceparent"), "(absent)");
    EXPECT_EQ(value_of(f, "ce_pgoutboxheaders"), R"({"b": 2})");
}

TEST(EntryFormat, StructuredEvent) {
    EntryFields writer(EntryFormat::cloudevents_structured, kSource);
    const std::string headers = R"({"traceparent": ")" + kParent + R"(", "id": "user", "big": 123456789012345678901234567890})";
    auto e = event("kéy\"\n", headers);
    e.payload = R"({"n": 3.14159265358979323846264338327950288, "s": "\u00e9"})";
    auto f = fields_of(writer, e);
    ASSERT_EQ(names_of(f), (std::vector<std::string>{"content-type", "event"}));
    EXPECT_EQ(value_of(f, "content-type"), "application/cloudevents+json");
    const std::string event_text = value_of(f, "event");
    EXPECT_EQ(event_text,
              R"({"specversion":"1.0","id":"0193a3c4-0000-7000-8000-000000000001","source":"/pg_outbox/app/g",)"
              R"("type":"orders","time":"2026-01-01T00:00:00.000000Z","subject":"kéy\"\n","partitionkey":"kéy\"\n",)"
              R"("sequence":"00000000000000000007-00000000000000000003","traceparent":")" +
                  kParent +
                  R"(","pgoutboxheaders":"{\"id\": \"user\", \"big\": 123456789012345678901234567890}",)"
                  R"("datacontenttype":"application/json","data":{"n": 3.14159265358979323846264338327950288, "s": "\u00e9"}})");
    // One JSON object a CloudEvents SDK reads.
    const auto parsed = nlohmann::json::parse(event_text);
    EXPECT_EQ(parsed.at("subject").get<std::string>(), "kéy\"\n");
    EXPECT_TRUE(parsed.at("pgoutboxheaders").is_string());
    // A payload that is not an object: data as it is.
    e.payload = R"("just a string")";
    f = fields_of(writer, e);
    EXPECT_NE(value_of(f, "event").find(R"("data":"just a string"})"), std::string::npos);
    e.payload = "[1, 2]";
    f = fields_of(writer, e);
    EXPECT_NE(value_of(f, "event").find(R"("data":[1, 2]})"), std::string::npos);
    // No key, headers or created_at.
    f = fields_of(writer, event(std::nullopt, std::nullopt, ""));
    const auto minimal = nlohmann::json::parse(value_of(f, "event"));
    std::vector<std::string> keys;
    for (const auto& [k, v] : minimal.items()) keys.push_back(k);
    EXPECT_EQ(keys.size(), 7u);  // specversion id source type sequence datacontenttype data
    EXPECT_FALSE(minimal.contains("time"));
    EXPECT_FALSE(minimal.contains("subject"));
    EXPECT_FALSE(minimal.contains("pgoutboxheaders"));
}

TEST(EntryFormat, EntryBytesCountTheNewFields) {
    const std::vector<Event> events{event("k", R"({"traceparent": ")" + kParent + R"(", "x": 1})"),
                                    event("k\"\n\x01é", R"({"x": "\"q\""})"),
                                    event(std::nullopt, std::nullopt, ""),
                                    event("k", "{}"),
                                    event("k", R"({"tracestate": "a=1"})")};
    for (const auto format : {EntryFormat::plain, EntryFormat::cloudevents, EntryFormat::cloudevents_structured}) {
        EntryFields writer(format, "/s\"ource");
        for (const auto& e : events) {
            std::size_t want = e.position.size() + 4 + e.position.size();
            for (const auto& [n, v] : fields_of(writer, e)) want += n.size() + v.size();
            writer.clear();
            EXPECT_EQ(writer.entry_bytes(e), want) << to_string(format) << " " << e.headers.value_or("-");
        }
    }
}

TEST(EntryFormat, BuffersAreReused) {
    EntryFields writer(EntryFormat::cloudevents_structured, kSource);
    const auto e = event("k", R"({"traceparent": ")" + kParent + R"(", "x": 1})");
    std::vector<std::string_view> argv;
    writer.append(argv, e);
    const auto* first = argv.back().data();
    writer.clear();
    argv.clear();
    writer.append(argv, e);
    EXPECT_EQ(argv.back().data(), first);  // the same memory, no new buffer
}

TEST(EntryFormat, CeSourceTemplate) {
    EXPECT_EQ(expand_ce_source("/pg_outbox/{database}/{group}", "app", "g"), "/pg_outbox/app/g");
    EXPECT_EQ(expand_ce_source("/pg_outbox/{database}/{group}", "my db/é", "billing/3"),
              "/pg_outbox/my%20db%2F%C3%A9/billing%2F3");
    EXPECT_EQ(expand_ce_source("urn:x:{group}:{group}", "d", "a-b_c.d~e"), "urn:x:a-b_c.d~e:a-b_c.d~e");
    EXPECT_EQ(ce_source_fault("/pg_outbox/{database}/{group}"), std::nullopt);
    EXPECT_EQ(ce_source_fault("https://example.com/x?y=%20"), std::nullopt);
    EXPECT_EQ(ce_source_fault(std::string(1024, 'a')), std::nullopt);
    for (const std::string& bad : std::vector<std::string>{std::string(), std::string(1025, 'a'), std::string("/a b"), std::string("/a\tb"),
                                   std::string("/a\nb"), std::string("/a\0b", 4), std::string("/\x7f"),
                                   std::string("/caf\xc3\xa9"), std::string("/\xff"), std::string("/{topic}"),
                                   std::string("/{database"), std::string("/{}"), std::string("/}"),
                                   std::string("/{Group}")})
        EXPECT_NE(ce_source_fault(bad), std::nullopt) << bad;
}

// Each format, read back, gives the same fields to apply: the same payload
// text, so that the inbox sees the same event, not another one under its id.
TEST(EntryFormat, EveryFormatReadsBackTheSame) {
    const std::string headers = R"({"id": "user", "specversion": "x", "traceparent": ")" + kParent +
                                R"(", "tracestate": "a=1", "n": 1.50})";
    for (const auto& e : {event("kéy", headers), event(std::nullopt, std::nullopt, ""), event("k", "{}")}) {
        EntryFields plain;
        const auto from_default = entry_of(fields_of(plain, e));
        for (const auto format : {EntryFormat::cloudevents, EntryFormat::cloudevents_structured}) {
            EntryFields writer(format, kSource);
            const auto read = entry_of(fields_of(writer, e));
            ASSERT_FALSE(read.format_fault) << read.format_fault->first;
            EXPECT_EQ(framing_fault(read), std::nullopt);
            for (const char* name : {"event_id", "topic", "key", "payload", "prev"})
                EXPECT_EQ(field_or(read, name), field_or(from_default, name)) << name << " " << to_string(format);
            EXPECT_EQ(read.fields.front().first, "event_id");
            if (!e.headers || *e.headers == "{}") {
                EXPECT_EQ(field_or(read, "headers"), "(absent)");
                continue;
            }
            // The same headers as JSON.
            EXPECT_EQ(nlohmann::json::parse(field_or(read, "headers")),
                      nlohmann::json::parse(field_or(from_default, "headers")))
                << to_string(format);
        }
    }
}

TEST(EntryFormat, DefaultEntryTakesATraceparentField) {
    StreamEntry e;
    e.fields = {{"event_id", "x"}, {"payload", "{}"}, {"headers", R"({"a": 1})"}, {"traceparent", kParent},
                {"tracestate", "a=1"}};
    read_entry_format(e);
    EXPECT_EQ(nlohmann::json::parse(*e.field("headers")),
              nlohmann::json::parse(R"({"a": 1, "traceparent": ")" + kParent + R"(", "tracestate": "a=1"})"));
    // Headers absent: made of the field.
    e.fields = {{"event_id", "x"}, {"payload", "{}"}, {"traceparent", kParent}};
    read_entry_format(e);
    EXPECT_EQ(nlohmann::json::parse(*e.field("headers")), nlohmann::json::parse(R"({"traceparent": ")" + kParent + "\"}"));
    // Empty headers.
    e.fields = {{"headers", "{ }"}, {"traceparent", kParent}};
    read_entry_format(e);
    EXPECT_EQ(nlohmann::json::parse(*e.field("headers")), nlohmann::json::parse(R"({"traceparent": ")" + kParent + "\"}"));
    // Headers with their own traceparent are used as they are.
    const std::string own = R"({"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"})";
    e.fields = {{"headers", own}, {"traceparent", kParent}};
    read_entry_format(e);
    EXPECT_EQ(*e.field("headers"), own);
    // An invalid field, or headers that are not an object: nothing changes.
    e.fields = {{"headers", R"({"a": 1})"}, {"traceparent", "00-bad"}};
    read_entry_format(e);
    EXPECT_EQ(*e.field("headers"), R"({"a": 1})");
    e.fields = {{"headers", "not json"}, {"traceparent", kParent}};
    read_entry_format(e);
    EXPECT_EQ(*e.field("headers"), "not json");
    EXPECT_FALSE(e.format_fault);
}

TEST(EntryFormat, HandWrittenCloudEvents) {
    // Binary, with ce_subject only: the key.
    StreamEntry e;
    e.fields = {{"ce_specversion", "1.0"}, {"ce_id", "id-1"}, {"ce_type", "orders"}, {"ce_source", "/x"},
                {"ce_subject", "s-1"},     {"data", "[1]"},    {"ce_traceparent", kParent}};
    read_entry_format(e);
    ASSERT_FALSE(e.format_fault);
    EXPECT_EQ(field_or(e, "event_id"), "id-1");
    EXPECT_EQ(field_or(e, "topic"), "orders");
    EXPECT_EQ(field_or(e, "key"), "s-1");
    EXPECT_EQ(field_or(e, "payload"), "[1]");
    EXPECT_EQ(nlohmann::json::parse(field_or(e, "headers")), nlohmann::json::parse(R"({"traceparent": ")" + kParent + "\"}"));
    EXPECT_EQ(field_or(e, "ce_source"), "/x");  // kept for a dead letter
    EXPECT_EQ(e.count("data"), 0u);
    // partitionkey wins over subject.
    e.fields = {{"ce_specversion", "1.0"}, {"ce_id", "i"}, {"ce_type", "t"}, {"ce_subject", "s"},
                {"ce_partitionkey", "p"}, {"data", "1"}};
    read_entry_format(e);
    EXPECT_EQ(field_or(e, "key"), "p");
    // Structured, written by an SDK: members in any order, escapes, spaces,
    // a pgoutboxheaders whose traceparent loses to the attribute.
    e = StreamEntry{};
    e.fields = {{"content-type", "application/cloudevents+json; charset=utf-8"},
                {"event", " {\"data\" : {\"a\": [1, {\"b\": null}]}, \"type\":\"orders\", \"id\": \"\\u0069d-2\", "
                          "\"specversion\": \"1.0\", \"subject\": \"s\", \"traceparent\": \"" + kParent +
                              "\", \"pgoutboxheaders\": \"{\\\"traceparent\\\": \\\"old\\\", \\\"h\\\": 1}\"} "}};
    read_entry_format(e);
    ASSERT_FALSE(e.format_fault) << e.format_fault->first;
    EXPECT_EQ(field_or(e, "event_id"), "id-2");
    EXPECT_EQ(field_or(e, "key"), "s");
    EXPECT_EQ(field_or(e, "payload"), R"({"a": [1, {"b": null}]})");
    const auto h = nlohmann::json::parse(field_or(e, "headers"));
    EXPECT_EQ(h.at("traceparent"), kParent);  // jsonb keeps the last of two
    EXPECT_EQ(h.at("h"), 1);
    EXPECT_EQ(e.count("event"), 0u);
    // An event field without the CloudEvents content type: the default format.
    e = StreamEntry{};
    e.fields = {{"event", "{}"}, {"event_id", "x"}};
    read_entry_format(e);
    EXPECT_FALSE(e.format_fault);
    EXPECT_EQ(field_or(e, "event"), "{}");
}

TEST(EntryFormat, MalformedCloudEvents) {
    const Fields ok_binary{{"ce_specversion", "1.0"}, {"ce_id", "i"}, {"ce_type", "t"}, {"data", "{}"}};
    auto with = [](Fields f, const std::string& name, const std::optional<std::string>& value) {
        for (auto it = f.begin(); it != f.end(); ++it)
            if (it->first == name) {
                if (value)
                    it->second = *value;
                else
                    f.erase(it);
                return f;
            }
        if (value) f.emplace_back(name, *value);
        return f;
    };
    auto fault_of = [](const Fields& f) {
        StreamEntry e;
        e.fields.assign(f.begin(), f.end());
        const auto before = e.fields;
        read_entry_format(e);
        const auto fault = framing_fault(e);
        if (fault) EXPECT_EQ(e.fields, before) << "a malformed entry keeps its fields as received";
        return fault ? fault->second + " " + fault->first : std::string("none");
    };
    EXPECT_EQ(fault_of(ok_binary).substr(0, 4), "none");
    struct Case {
        Fields fields;
        const char* sqlstate;
        const char* says;
    };
    const std::string st = "application/cloudevents+json";
    const std::vector<Case> cases{
        {with(ok_binary, "ce_specversion", "0.3"), "22023", "ce_specversion is \"0.3\""},
        {with(ok_binary, "ce_specversion", std::string("1.0\0", 4)), "22023", "ce_specversion"},
        {with(ok_binary, "ce_id", std::nullopt), "22023", "no field \"ce_id\""},
        {with(ok_binary, "ce_type", std::nullopt), "22023", "no field \"ce_type\""},
        {with(ok_binary, "data", std::nullopt), "22023", "no field \"data\""},
        {with(ok_binary, "content-type", "text/plain"), "0A000", "not JSON"},
        {with(ok_binary, "ce_pgoutboxheaders", "[1]"), "22023", "not a JSON object"},
        {with(ok_binary, "ce_pgoutboxheaders", "{\"a\": "), "22P02", "not valid JSON"},
        {with(ok_binary, "ce_pgoutboxheaders", std::string("{\"a\":\xff}")), "22P02", "not valid JSON"},
        {[&] { auto f = ok_binary; f.emplace_back("ce_id", "j"); return f; }(), "22023", "appears 2 times"},
        {{{"content-type", st}, {"event", "not json"}}, "22P02", "not valid JSON"},
        {{{"content-type", st}, {"event", "[1]"}}, "22023", "not a JSON object"},
        {{{"content-type", st}, {"event", "{\"specversion\":\"1.0\",\"id\":\"i\",\"type\":\"t\",\"data\":1} x"}},
         "22P02", "not valid JSON"},
        {{{"content-type", st}, {"event", R"({"specversion":"0.3","id":"i","type":"t","data":1})"}}, "22023", "0.3"},
        {{{"content-type", st}, {"event", R"({"specversion":1.0,"id":"i","type":"t","data":1})"}}, "22023",
         "not a string"},
        {{{"content-type", st}, {"event", R"({"id":"i","type":"t","data":1})"}}, "22023", "no specversion"},
        {{{"content-type", st}, {"event", R"({"specversion":"1.0","type":"t","data":1})"}}, "22023", "no id"},
        {{{"content-type", st}, {"event", R"({"specversion":"1.0","id":"i","data":1})"}}, "22023", "no type"},
        {{{"content-type", st}, {"event", R"({"specversion":"1.0","id":"i","type":"t"})"}}, "22023", "no data"},
        {{{"content-type", st}, {"event", R"({"specversion":"1.0","id":"i","type":"t","data_base64":"AA=="})"}},
         "0A000", "data_base64"},
        {{{"content-type", st},
          {"event", R"({"specversion":"1.0","id":"i","type":"t","datacontenttype":"text/plain","data":"x"})"}},
         "0A000", "not JSON"},
        {{{"content-type", st}, {"event", R"({"specversion":"1.0","id":"i","id":"j","type":"t","data":1})"}}, "22023",
         "appears twice"},
        {{{"content-type", st}, {"event", R"({"specversion":"1.0","id":7,"type":"t","data":1})"}}, "22023",
         "\"id\" is not a string"},
        {{{"content-type", st}, {"event", R"({"specversion":"1.0","id":"i","type":"t","data":1,"pgoutboxheaders":{}})"}},
         "22023", "\"pgoutboxheaders\" is not a string"},
        {{{"content-type", st},
          {"event", R"({"specversion":"1.0","id":"i","type":"t","data":1,"pgoutboxheaders":"[]"})"}},
         "22023", "not a JSON object"},
        {{{"content-type", st},
          {"event", R"({"specversion":"1.0","id":"i","type":"t","data":1,"pgoutboxheaders":"{"})"}},
         "22P02", "not valid JSON"},
        {{{"content-type", st}, {"event", R"({"specversion":"1.0","id":"\ud800","type":"t","data":1})"}}, "22P02",
         "not a valid JSON string"},
        {{{"content-type", st}, {"event", std::string(R"({"specversion":"1.0","id":"a)") + '\0' + R"(b","type":"t","data":1})"}},
         "22P02", "not valid JSON"},
        {{{"content-type", st}, {"event", R"({"specversion":"1.0","id":"i","type":"t","data":01})"}}, "22P02",
         "not valid JSON"},
        {{{"content-type", st}, {"event", "{}"}, {"event", "{}"}}, "22023", "appears 2 times"},
        {{{"content-type", st}, {"event", std::string(100000, '[')}}, "22P02", "not valid JSON"},
    };
    for (const auto& c : cases) {
        const auto got = fault_of(c.fields);
        EXPECT_EQ(got.substr(0, 5), c.sqlstate) << got;
        EXPECT_NE(got.find(c.says), std::string::npos) << got;
        EXPECT_NE(got.find("CloudEvent"), std::string::npos) << got;
    }
    // A trace context of the wrong type or value is only not taken.
    StreamEntry e;
    e.fields = {{"content-type", st},
                {"event", R"({"specversion":"1.0","id":"i","type":"t","data":1,"traceparent":5,"tracestate":"a=1"})"}};
    read_entry_format(e);
    EXPECT_FALSE(e.format_fault);
    EXPECT_EQ(e.field("headers"), nullptr);
    e.fields = {{"ce_specversion", "1.0"}, {"ce_id", "i"}, {"ce_type", "t"}, {"data", "1"}, {"ce_traceparent", "ff-x"}};
    read_entry_format(e);
    EXPECT_FALSE(e.format_fault);
    EXPECT_EQ(e.field("headers"), nullptr);
}

TEST(JsonText, ValuesAndMembers) {
    for (const char* ok : {"1", "-0.5e+10", "\"a\\u00e9\\n\"", "true", "null", "[]", "{}", " [1, [2, {\"a\": []}]] ",
                           "{\"a\": {\"b\": [true, false, null]}, \"c\": \"}\"}"})
        EXPECT_TRUE(is_json(ok)) << ok;
    for (const char* bad : {"", "01", "1.", ".5", "-", "[1,]", "{\"a\"}", "{\"a\":1,}", "{a:1}", "\"\\x\"",
                            "\"\\u12\"", "[1", "{\"a\":1", "tru", "1 2", "\"a\nb\"", "nul"})
        EXPECT_FALSE(is_json(bad)) << bad;
    std::vector<JsonMember> m;
    ASSERT_TRUE(json_object_members(R"( {"a" : 1, "b\"": [1, {"x": 2}], "c": "s"} )", m));
    ASSERT_EQ(m.size(), 3u);
    EXPECT_EQ(m[0].name, "\"a\"");
    EXPECT_EQ(m[0].value, "1");
    EXPECT_EQ(m[1].name, "\"b\\\"\"");
    EXPECT_EQ(m[1].value, "[1, {\"x\": 2}]");
    EXPECT_EQ(m[2].value, "\"s\"");
    EXPECT_FALSE(json_object_members("[1]", m));
    EXPECT_EQ(json_string("\"a\\u0062\\\"\""), std::optional<std::string>("ab\""));
    EXPECT_EQ(json_string("\"\\ud83d\\ude00\""), std::optional<std::string>("\xf0\x9f\x98\x80"));
    EXPECT_EQ(json_string("\"\\ud83d\""), std::nullopt);
    EXPECT_TRUE(json_string_is("\"\\u0069d\"", "id"));
    std::string out;
    json_append_string(out, std::string("a\"\\\n\x01\x7f\xc3\xa9", 8));
    EXPECT_EQ(out, "\"a\\\"\\\\\\n\\u0001\x7f\xc3\xa9\"");
}
