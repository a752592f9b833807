// Integration tests of the stream entry formats (--format): what publish
// writes in each, exactly; that consume reads every format, entry by entry,
// so that a pipeline switches format without draining and an event read
// in two formats applies once; CloudEvents written by other producers;
// malformed ones dead-lettered alone; a hostile --ce-source refused.
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include <set>
#include <thread>

#include "fixture.hpp"
#include "pg_outbox/event.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

const std::string kParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

using Fields = std::vector<std::pair<std::string, std::string>>;

struct RawEntry {
    std::string id;
    Fields fields;
};

class CloudEventsTest : public RelayTest {
protected:
    void SetUp() override {
        RelayTest::SetUp();
        sink_ = pg_->create_database("sink");
        PgConnection db(sink_, "tests");
        db.exec("CREATE ROLE consumer_user LOGIN IN ROLE outbox_consumer");
        db.exec("CREATE TABLE projection (event_id uuid, topic text, key text, payload jsonb, headers jsonb)");
        db.exec(R"(CREATE FUNCTION apply_event(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
            RETURNS void LANGUAGE sql AS $$ INSERT INTO projection VALUES (event_id, topic, key, payload, headers) $$)");
        db.exec("GRANT ALL ON projection TO consumer_user");
        db.exec("SELECT inbox_consumer_create('accounting', 'consumer_user')");
    }

    Process& start_format_relay(const std::string& group, const std::string& format, const std::string& stream,
                                const std::vector<std::string>& extra = {}) {
        std::vector<std::string> args{PG_OUTBOX_RELAY_BINARY, "publish", "--group", group,
                                      "--pg", pg_->conninfo("app", "relay_user"),
                                      "--redis", redis_->address(), "--poll-interval", "50ms",
                                      "--retry-min", "20ms", "--retry-max", "300ms", "--format", format,
                                      "--stream", stream, "--log-level", "debug"};
        args.insert(args.end(), extra.begin(), extra.end());
        return start_process(args);
    }

    Process& start_consumer(const std::vector<std::string>& streams) {
        std::vector<std::string> args{PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting",
                                      "--pg", pg_->conninfo("sink", "consumer_user"),
                                      "--redis", redis_->address(), "--worker", "w1",
                                      "--handler", "SELECT apply_event($1, $2, $3, $4, $5)", "--block", "100ms",
                                      "--max-deliveries", "1", "--retry-min", "20ms", "--retry-max", "300ms",
                                      "--log-level", "debug"};
        for (const auto& s : streams) args.insert(args.end(), {"--stream", s});
        return start_process(args);
    }

    PgConnection sink() { return PgConnection(sink_, "tests"); }

    long long sink_count(const std::string& sql) {
        auto db = sink();
        return std::stoll(query_column(db, sql)[0]);
    }

    std::vector<RawEntry> entries(const std::string& stream) {
        auto redis = redis_->connect();
        auto r = redis.command({"XRANGE", stream, "-", "+"});
        std::vector<RawEntry> out;
        for (std::size_t i = 0; i < r->elements; ++i) {
            RawEntry e;
            e.id = std::string(reply_text(r->element[i]->element[0]));
            const auto* f = r->element[i]->element[1];
            for (std::size_t j = 0; j + 1 < f->elements; j += 2)
                e.fields.emplace_back(reply_text(f->element[j]), reply_text(f->element[j + 1]));
            out.push_back(std::move(e));
        }
        return out;
    }

    std::size_t count_in(const std::vector<std::string>& streams) {
        std::size_t n = 0;
        for (const auto& s : streams) n += entries(s).size();
        return n;
    }

    std::string xadd(const std::string& stream, const Fields& fields) {
        auto redis = redis_->connect();
        std::vector<std::string_view> argv{"XADD", stream, "*"};
        for (const auto& [n, v] : fields) argv.insert(argv.end(), {n, v});
        auto r = redis.command(argv);
        EXPECT_NE(r->type, REDIS_REPLY_ERROR) << reply_text(r.get());
        return std::string(reply_text(r.get()));
    }

    // Three events: a keyed one with headers and a trace context, a keyless
    // one without headers, one with a key outside ASCII and plain headers.
    void emit_three() {
        auto pg = connect();
        pg.exec("SELECT outbox_emit('orders', 'k-1', '{\"n\": 1, \"amount\": 10.50}', "
                "jsonb_build_object('tenant', 'acme', 'traceparent', $1::text, 'tracestate', 'congo=t61rcWkgMzE'))",
                {kParent});
        pg.exec("SELECT outbox_emit('orders', NULL, '[1, 2, 3]')");
        pg.exec("SELECT outbox_emit('orders', 'clé', '\"text\"', '{\"id\": \"user-id\", \"type\": \"x\"}')");
    }

    std::string sink_;
};

std::string value_of(const Fields& f, const std::string& name) {
    for (const auto& [n, v] : f)
        if (n == name) return v;
    return "(absent)";
}

std::vector<std::string> names_of(const Fields& f) {
    std::vector<std::string> out;
    for (const auto& [n, v] : f) out.push_back(n);
    return out;
}

}  // namespace

// Each format's entries, field by field, in the contract's order, from the
// same three events published by three groups.
TEST_F(CloudEventsTest, PublishWritesEachFormatExactly) {
    {
        auto pg = connect();
        pg.exec("SELECT outbox_group_create('ce', start_at => 'beginning')");
        pg.exec("SELECT outbox_group_create('st', start_at => 'beginning')");
    }
    emit_three();
    auto& relay = start_relay({"--stream", "d:{topic}"});
    start_format_relay("ce", "cloudevents", "c:{topic}");
    start_format_relay("st", "cloudevents-structured", "s:{topic}",
                       {"--ce-source", "urn:test:{database}:{group}"});
    ASSERT_TRUE(eventually([&] { return count_in({"d:orders", "c:orders", "s:orders"}) == 9; }, 30s))
        << relay.log();

    const auto plain = entries("d:orders"), binary = entries("c:orders"), structured = entries("s:orders");
    ASSERT_EQ(plain.size(), 3u);
    // The default format: traceparent and tracestate after the headers.
    EXPECT_EQ(names_of(plain[0].fields),
              (std::vector<std::string>{"event_id", "topic", "key", "payload", "headers", "traceparent", "tracestate",
                                        "position", "created_at", "prev"}));
    EXPECT_EQ(value_of(plain[0].fields, "traceparent"), kParent);
    EXPECT_EQ(value_of(plain[0].fields, "tracestate"), "congo=t61rcWkgMzE");
    EXPECT_EQ(names_of(plain[1].fields),
              (std::vector<std::string>{"event_id", "topic", "payload", "position", "created_at", "prev"}));
    EXPECT_EQ(names_of(plain[2].fields), (std::vector<std::string>{"event_id", "topic", "key", "payload", "headers",
                                                                    "position", "created_at", "prev"}));
    for (std::size_t i = 0; i < 3; ++i) {
        const auto& d = plain[i].fields;
        EXPECT_EQ(binary[i].id, plain[i].id);
        EXPECT_EQ(structured[i].id, plain[i].id);
        const auto pos = *Position::parse(plain[i].id);
        char sequence[48];
        std::snprintf(sequence, sizeof sequence, "%020llu-%020llu", static_cast<unsigned long long>(pos.major),
                      static_cast<unsigned long long>(pos.minor));
        Fields want{{"ce_specversion", "1.0"},
                    {"ce_id", value_of(d, "event_id")},
                    {"ce_source", "/pg_outbox/app/ce"},
                    {"ce_type", "orders"},
                    {"ce_time", value_of(d, "created_at")}};
        if (value_of(d, "key") != "(absent)") {
            want.emplace_back("ce_subject", value_of(d, "key"));
            want.emplace_back("ce_partitionkey", value_of(d, "key"));
        }
        want.emplace_back("ce_sequence", sequence);
        if (i == 0) {
            want.emplace_back("ce_traceparent", kParent);
            want.emplace_back("ce_tracestate", "congo=t61rcWkgMzE");
            want.emplace_back("ce_pgoutboxheaders", R"({"tenant": "acme"})");
        }
        if (i == 2) want.emplace_back("ce_pgoutboxheaders", R"({"id": "user-id", "type": "x"})");
        want.emplace_back("content-type", "application/json");
        want.emplace_back("data", value_of(d, "payload"));
        want.emplace_back("prev", value_of(d, "prev"));
        EXPECT_EQ(binary[i].fields, want) << "entry " << i;

        ASSERT_EQ(names_of(structured[i].fields), (std::vector<std::string>{"content-type", "event", "prev"}));
        EXPECT_EQ(value_of(structured[i].fields, "content-type"), "application/cloudevents+json");
        EXPECT_EQ(value_of(structured[i].fields, "prev"), value_of(d, "prev"));
        std::string event = R"({"specversion":"1.0","id":")" + value_of(d, "event_id") +
                            R"(","source":"urn:test:app:st","type":"orders","time":")" + value_of(d, "created_at") + "\"";
        if (i == 0) event += R"(,"subject":"k-1","partitionkey":"k-1")";
        if (i == 2) event += R"(,"subject":"clé","partitionkey":"clé")";
        event += R"(,"sequence":")" + std::string(sequence) + "\"";
        if (i == 0)
            event += R"(,"traceparent":")" + kParent +
                     R"(","tracestate":"congo=t61rcWkgMzE","pgoutboxheaders":"{\"tenant\": \"acme\"}")";
        if (i == 2) event += R"(,"pgoutboxheaders":"{\"id\": \"user-id\", \"type\": \"x\"}")";
        event += R"(,"datacontenttype":"application/json","data":)" + value_of(d, "payload") + "}";
        EXPECT_EQ(value_of(structured[i].fields, "event"), event) << "entry " << i;
        EXPECT_NO_THROW(nlohmann::json::parse(value_of(structured[i].fields, "event")));
    }
}

// The same events published in the three formats to three streams: the
// consumer reads them all, applies each event once (the other two are
// duplicates, not identity conflicts), with the same key, payload and
// headers whatever the format.
TEST_F(CloudEventsTest, AnEventReadInEveryFormatAppliesOnce) {
    {
        auto pg = connect();
        pg.exec("SELECT outbox_group_create('ce', start_at => 'beginning')");
        pg.exec("SELECT outbox_group_create('st', start_at => 'beginning')");
    }
    emit_three();
    emit(12);
    start_relay({"--stream", "d:{topic}"});
    start_format_relay("ce", "cloudevents", "c:{topic}");
    start_format_relay("st", "cloudevents-structured", "s:{topic}");
    const auto total = committed_count();
    std::vector<std::string> streams;
    for (const auto& p : {"d:", "c:", "s:"})
        for (const auto& t : kTopics) streams.push_back(p + t);
    ASSERT_TRUE(eventually([&] { return count_in(streams) == 3 * total; }, 30s));
    auto& consumer = start_consumer(streams);
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.inbox") >= static_cast<long long>(total) &&
                   sink_count("SELECT count(*) FROM projection") >= static_cast<long long>(total);
        },
        30s))
        << consumer.log();
    // Every entry read and acknowledged.
    ASSERT_TRUE(eventually(
        [&] {
            auto redis = redis_->connect();
            for (const auto& s : streams) {
                auto r = redis.command({"XPENDING", s, "accounting"});
                if (r->type != REDIS_REPLY_ARRAY || r->element[0]->integer != 0) return false;
                auto g = redis.command({"XINFO", "GROUPS", s});
                if (g->type != REDIS_REPLY_ARRAY || g->elements == 0) return false;
            }
            return true;
        },
        30s));
    std::this_thread::sleep_for(500ms);
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), static_cast<long long>(total));
    EXPECT_EQ(sink_count("SELECT count(DISTINCT event_id) FROM projection"), static_cast<long long>(total));
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0) << consumer.log();
    // What was applied is what was emitted.
    auto app = connect();
    auto db = sink();
    const auto emitted = query_column(app, "SELECT event_id || ' ' || topic || ' ' || coalesce(key, '-') || ' ' || "
                                           "payload::text || ' ' || coalesce(headers::text, '-') FROM outbox.event "
                                           "ORDER BY 1");
    const auto applied = query_column(db, "SELECT event_id || ' ' || topic || ' ' || coalesce(key, '-') || ' ' || "
                                          "payload::text || ' ' || coalesce(headers::text, '-') FROM projection "
                                          "ORDER BY 1");
    // Empty headers are not carried by the CloudEvents formats: the
    // events here have none or some.
    EXPECT_EQ(applied, emitted);
}

// One group, one stream: the relay restarts in another format twice while
// the consumer reads on; every event applies once, in order, and the
// entries Redis already had are recognised as published, whatever their
// format, when a relay in another format replays them.
TEST_F(CloudEventsTest, SwitchingFormatMidStreamAppliesEachOnce) {
    auto& consumer = start_consumer({"outbox:orders", "outbox:payments", "outbox:audit"});
    int from = 0;
    for (const auto* format : {"default", "cloudevents", "cloudevents-structured", "default"}) {
        emit(9, from);
        from += 9;
        auto& relay = start_format_relay("g", format, "outbox:{topic}");
        ASSERT_TRUE(wait_all_published()) << relay.log();
        relay.signal(SIGTERM);
        EXPECT_EQ(relay.wait(), 0);
    }
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") == from; }, 30s))
        << consumer.log();
    EXPECT_EQ(sink_count("SELECT count(DISTINCT event_id) FROM projection"), from);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);

    // A replay in another format: the group rewound to the beginning, the
    // relay in the structured format finds every entry there (written in
    // the default, binary and structured formats) already published.
    {
        auto pg = connect();
        pg.exec("SELECT outbox_rewind('g', 'beginning')");
    }
    emit(3, from);
    from += 3;
    auto& relay = start_format_relay("g", "cloudevents-structured", "outbox:{topic}");
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") == from; }, 30s))
        << relay.log() << consumer.log();
    EXPECT_EQ(published_count(), static_cast<std::size_t>(from)) << relay.log();
    EXPECT_EQ(relay.log().find("PGOUTBOX_FOREIGN"), std::string::npos) << relay.log();
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), from);
}

// CloudEvents another producer wrote, with only what the specification
// requires and the optional attributes it chose: applied, the key from
// ce_subject when there is no partitionkey, the trace context in the
// headers; entries beside them in the default format with a traceparent
// field of their own.
TEST_F(CloudEventsTest, HandWrittenCloudEventsAreApplied) {
    auto& consumer = start_consumer({"hand"});
    xadd("hand", {{"ce_specversion", "1.0"},
                  {"ce_id", "3f1c0e34-5a9b-4a57-9d3e-2b5f3a0c7e11"},
                  {"ce_source", "https://shop.example/orders"},
                  {"ce_type", "order.created"},
                  {"ce_subject", "order-7"},
                  {"ce_traceparent", kParent},
                  {"data", R"({"total": 12.30})"}});
    xadd("hand", {{"content-type", "application/cloudevents+json"},
                  {"event", R"({"specversion": "1.0", "type": "order.paid", "source": "/x",
                                "id": "7e0f6c3a-1b2c-4d5e-8f90-a1b2c3d4e5f6", "data": [1, "two"]})"}});
    xadd("hand", {{"event_id", "0d6a7b2e-3c4f-4a5b-9c8d-7e6f5a4b3c2d"}, {"topic", "legacy"}, {"payload", "{}"},
                  {"traceparent", kParent}});
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") == 3; }, 30s)) << consumer.log();
    auto db = sink();
    EXPECT_EQ(query_column(db, "SELECT topic || ' ' || coalesce(key, '-') || ' ' || payload::text || ' ' || "
                               "coalesce(headers->>'traceparent', '-') FROM projection ORDER BY topic"),
              (std::vector<std::string>{"legacy - {} " + kParent, "order.created order-7 {\"total\": 12.30} " + kParent,
                                        "order.paid - [1, \"two\"] -"}));
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);
}

// Malformed CloudEvents are dead-lettered, each with its reason and
// SQLSTATE and its fields as received; the entries around them apply.
TEST_F(CloudEventsTest, MalformedCloudEventsAreDeadLetteredAndTheRestApplied) {
    auto& consumer = start_consumer({"hand"});
    auto good = [&](int n) {
        xadd("hand", {{"ce_specversion", "1.0"},
                      {"ce_id", "00000000-0000-4000-8000-00000000000" + std::to_string(n)},
                      {"ce_type", "t"},
                      {"ce_partitionkey", "k"},
                      {"data", "{\"n\": " + std::to_string(n) + "}"}});
    };
    const std::string st = "application/cloudevents+json";
    good(1);
    xadd("hand", {{"ce_specversion", "0.3"}, {"ce_id", "00000000-0000-4000-8000-0000000000a1"}, {"ce_type", "t"},
                  {"data", "{}"}});
    xadd("hand", {{"ce_specversion", "1.0"}, {"ce_id", "00000000-0000-4000-8000-0000000000a2"}, {"ce_type", "t"}});
    good(2);
    xadd("hand", {{"content-type", st}, {"event", "{\"specversion\": \"1.0\", \"id\": "}});
    xadd("hand", {{"content-type", st},
                  {"event", R"({"specversion":"1.0","id":"00000000-0000-4000-8000-0000000000a4","type":"t",)"
                            R"("data_base64":"AAEC"})"}});
    xadd("hand", {{"content-type", st},
                  {"event", R"({"specversion":"1.0","id":"00000000-0000-4000-8000-0000000000a5","type":"t",)"
                            R"("data":{},"pgoutboxheaders":"[1]"})"}});
    xadd("hand", {{"ce_specversion", "1.0"}, {"ce_id", "00000000-0000-4000-8000-0000000000a6"}, {"ce_type", "t"},
                  {"data", "{}"}, {"ce_pgoutboxheaders", std::string("{\"a\": \xff}")}});
    good(3);
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 6; }, 30s))
        << consumer.log();
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") == 3; }, 30s)) << consumer.log();
    auto db = sink();
    const auto letters =
        query_column(db, "SELECT sqlstate || ' ' || reason FROM outbox.dead_letters ORDER BY id");
    ASSERT_EQ(letters.size(), 6u);
    const std::vector<std::pair<std::string, std::string>> want{
        {"22023", "ce_specversion is \"0.3\""}, {"22023", "no field \"data\""}, {"22P02", "not valid JSON"},
        {"0A000", "data_base64"},               {"22023", "not a JSON object"}, {"22P02", "not valid JSON"}};
    for (std::size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(letters[i].substr(0, 5), want[i].first) << letters[i];
        EXPECT_NE(letters[i].find(want[i].second), std::string::npos) << letters[i];
        EXPECT_NE(letters[i].find("malformed entry: CloudEvent"), std::string::npos) << letters[i];
    }
    // Kept as received.
    EXPECT_EQ(query_column(db, "SELECT convert_from(fields[2], 'UTF8') FROM outbox.dead_letters ORDER BY id "
                               "LIMIT 1")[0],
              "0.3");
    EXPECT_EQ(query_column(db, "SELECT string_agg(payload->>'n', ',' ORDER BY payload->>'n') FROM projection")[0],
              "1,2,3");
}

// A --ce-source or --format that cannot be: exit 2 at once, naming the flag.
TEST_F(CloudEventsTest, HostileSettingsExit2) {
    for (const std::string& source : std::vector<std::string>{std::string(""), std::string("/a b"), std::string("/a\nb"),
                                      std::string("/caf\xc3\xa9"), std::string(1025, 'a'), std::string("/{topic}")}) {
        auto& relay = start_format_relay("g", "cloudevents", "outbox:{topic}", {"--ce-source", source});
        EXPECT_EQ(relay.wait(10s), 2) << relay.log();
        EXPECT_NE(relay.log().find("--ce-source"), std::string::npos) << relay.log();
    }
    auto& bad_format = start_format_relay("g", "cloudevent", "outbox:{topic}");
    EXPECT_EQ(bad_format.wait(10s), 2);
    EXPECT_NE(bad_format.log().find("--format"), std::string::npos) << bad_format.log();
    ::setenv("PG_OUTBOX_FORMAT", "json", 1);
    auto& env_format = start_process({PG_OUTBOX_RELAY_BINARY, "publish", "--group", "g", "--pg",
                                      pg_->conninfo("app", "relay_user"), "--redis", redis_->address()});
    const int code = env_format.wait(10s);
    ::unsetenv("PG_OUTBOX_FORMAT");
    EXPECT_EQ(code, 2) << env_format.log();
    ::setenv("PG_OUTBOX_CE_SOURCE", "/x\ty", 1);
    auto& env_source = start_process({PG_OUTBOX_RELAY_BINARY, "publish", "--group", "g", "--pg",
                                      pg_->conninfo("app", "relay_user"), "--redis", redis_->address()});
    const int source_code = env_source.wait(10s);
    ::unsetenv("PG_OUTBOX_CE_SOURCE");
    EXPECT_EQ(source_code, 2) << env_source.log();
}

// One trace across the outbox: an event emitted under SET LOCAL
// pg_outbox.traceparent, published as a CloudEvent, reaches the consumer's
// handler as $6 and in pg_outbox.traceparent while it runs, so the event
// the handler emits in the consumer's database carries the same trace
// (A -> B, and so on to C); an entry with a forged traceparent field gives
// the handler NULL and its emitted event no trace context. Handlers of
// five parameters keep working beside it (the other tests).
TEST_F(CloudEventsTest, TheHandlerContinuesTheProducersTrace) {
    {
        auto db = sink();
        db.exec("GRANT outbox_writer TO consumer_user");
        db.exec("CREATE TABLE seen (event_id uuid, param text, setting text)");
        db.exec(R"(CREATE FUNCTION forward(topic text, key text, payload jsonb, event_id uuid, parent text)
            RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO seen VALUES (event_id, parent, current_setting('pg_outbox.traceparent', true));
                PERFORM outbox_emit('forwarded', key, payload);
            END $$)");
        db.exec("GRANT ALL ON seen TO consumer_user");
    }
    {
        auto pg = connect();
        pg.exec("BEGIN");
        pg.exec("SELECT set_config('pg_outbox.traceparent', $1, true)", {kParent});
        pg.exec("SELECT outbox_emit('orders', 'k-1', '{\"n\": 1}')");
        pg.exec("COMMIT");
    }
    auto& relay = start_format_relay("g", "cloudevents", "outbox:{topic}");
    ASSERT_TRUE(wait_all_published()) << relay.log();
    const auto published = entries("outbox:orders");
    ASSERT_EQ(published.size(), 1u);
    EXPECT_EQ(value_of(published[0].fields, "ce_traceparent"), kParent);
    // A second entry, written by hand, whose traceparent is not valid
    // (upper case): no trace context reaches the handler.
    xadd("outbox:orders", {{"event_id", "00000000-0000-4000-8000-0000000000aa"},
                           {"topic", "orders"},
                           {"key", "k-2"},
                           {"payload", "{\"n\": 2}"},
                           {"headers", "{\"traceparent\": \"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01\"}"}});
    std::vector<std::string> args{PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting",
                                  "--pg", pg_->conninfo("sink", "consumer_user"),
                                  "--redis", redis_->address(), "--worker", "w1", "--stream", "outbox:orders",
                                  "--handler", "SELECT forward($1, $2, $3, $5, $6)", "--block", "100ms",
                                  "--max-deliveries", "1", "--log-level", "debug"};
    auto& consumer = start_process(args);
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM seen") == 2; }, 30s)) << consumer.log();
    auto db = sink();
    EXPECT_EQ(query_column(db, "SELECT coalesce(param, 'NULL') || ' ' || coalesce(nullif(setting, ''), 'empty') "
                               "FROM seen ORDER BY param NULLS LAST"),
              (std::vector<std::string>{kParent + " " + kParent, "NULL empty"}));
    EXPECT_EQ(query_column(db, "SELECT coalesce(headers->>'traceparent', 'none') FROM outbox.event "
                               "WHERE topic = 'forwarded' ORDER BY key"),
              (std::vector<std::string>{kParent, "none"}));
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0) << consumer.log();
}
