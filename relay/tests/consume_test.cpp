// Integration tests of consume mode: the five fault windows of DESIGN.md
// and the reclaim, dead-letter and race cases, against real PostgreSQL and
// Redis. The consumer's database ("sink") is separate from the producer's.
#include <gtest/gtest.h>

#include <signal.h>

#include <httplib.h>

#include <set>
#include <thread>

#include "fixture.hpp"
#include "pg_outbox/consumer.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

const char* const kHandler = "SELECT apply_event($1, $2, $3, $4, $5)";

class ConsumeTest : public RelayTest {
protected:
    void SetUp() override {
        RelayTest::SetUp();
        sink_ = pg_->create_database("sink");
        PgConnection db(sink_, "tests");
        db.exec("CREATE ROLE consumer_user LOGIN IN ROLE outbox_consumer, outbox_writer");
        // The projection, a switch to make the handler fail for some keys,
        // and a handler that also emits (consume-transform-produce).
        db.exec("CREATE TABLE projection (event_id uuid, topic text, key text, n int, amount int)");
        db.exec("CREATE TABLE fail_keys (key text PRIMARY KEY)");
        db.exec(R"(CREATE FUNCTION apply_event(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
            RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM fail_keys f WHERE f.key = apply_event.key) THEN
                    RAISE EXCEPTION 'handler refuses key %', key;
                END IF;
                INSERT INTO projection VALUES (event_id, topic, key, (payload->>'n')::int, (payload->>'amount')::int);
                PERFORM outbox_emit('applied', key, jsonb_build_object('of', event_id));
            END $$)");
        db.exec("GRANT ALL ON projection, fail_keys TO consumer_user");
        db.exec("SELECT inbox_consumer_create('accounting', 'consumer_user')");
    }

    Process& start_consumer(const std::string& worker, const std::vector<std::string>& extra = {}) {
        std::vector<std::string> args{PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting",
                                      "--pg", pg_->conninfo("sink", "consumer_user"),
                                      "--redis", redis_->address(), "--worker", worker,
                                      "--stream", "outbox:orders", "--stream", "outbox:payments",
                                      "--stream", "outbox:audit",
                                      "--handler", kHandler, "--block", "100ms",
                                      "--retry-min", "20ms", "--retry-max", "300ms", "--log-level", "debug"};
        args.insert(args.end(), extra.begin(), extra.end());
        return start_process(args);
    }

    PgConnection sink() { return PgConnection(sink_, "tests"); }

    long long sink_count(const std::string& sql) {
        auto db = sink();
        return std::stoll(query_column(db, sql)[0]);
    }

    // Every committed event of the producer is in the projection exactly
    // once, and the handler's own emit happened once per event.
    void expect_projection_exactly_once() {
        auto db = sink();
        const auto dups = query_column(db, "SELECT count(*) FROM (SELECT event_id FROM projection GROUP BY event_id "
                                           "HAVING count(*) > 1) d");
        EXPECT_EQ(dups[0], "0");
        EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), static_cast<long long>(committed_count()));
        EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.event"), sink_count("SELECT count(*) FROM projection"));
        auto app = connect();
        std::set<std::string> produced;
        for (const auto& id : query_column(app, "SELECT event_id::text FROM outbox.event")) produced.insert(id);
        for (const auto& id : query_column(db, "SELECT event_id::text FROM projection"))
            EXPECT_TRUE(produced.count(id)) << "applied an event that was never committed: " << id;
    }

    bool wait_applied(long long n, std::chrono::milliseconds timeout = 30s) {
        return eventually([&] { return sink_count("SELECT count(*) FROM projection") >= n; }, timeout, 100ms);
    }

    long long pending(const std::string& stream) {
        auto redis = redis_->connect();
        auto r = redis.command({"XPENDING", stream, "accounting"});
        return r->type == REDIS_REPLY_ARRAY ? r->element[0]->integer : -1;
    }

    // An entry id above the stream's top and below the relay's next ones.
    std::string id_between(const std::string& stream) {
        auto redis = redis_->connect();
        auto r = redis.command({"XREVRANGE", stream, "+", "-", "COUNT", "1"});
        const std::string top(reply_text(r->element[0]->element[0]));
        return top.substr(0, top.find('-')) + "-999999";
    }

    // Appends an entry by hand, as a broken or replaying producer would.
    void xadd(const std::string& stream, const std::string& id, const std::string& event_id,
              const std::string& payload, const std::string& key = "manual") {
        auto redis = redis_->connect();
        auto r = redis.command({"XADD", stream, id, "event_id", event_id, "topic", "orders", "key", key, "payload",
                                payload, "position", id, "created_at", "now"});
        ASSERT_NE(r->type, REDIS_REPLY_ERROR) << reply_text(r.get());
    }

    // Appends an entry with any fields, as a hostile producer would.
    std::string xadd_raw(const std::string& stream, const std::vector<std::string>& fields) {
        auto redis = redis_->connect();
        std::vector<std::string_view> argv{"XADD", stream, "*"};
        for (const auto& f : fields) argv.emplace_back(f);
        auto r = redis.command(argv);
        EXPECT_NE(r->type, REDIS_REPLY_ERROR) << reply_text(r.get());
        return std::string(reply_text(r.get()));
    }

    // Delivery counts of the pending entries of a stream.
    std::vector<long long> delivery_counts(const std::string& stream) {
        auto redis = redis_->connect();
        auto r = redis.command({"XPENDING", stream, "accounting", "-", "+", "1000"});
        std::vector<long long> out;
        if (r->type == REDIS_REPLY_ARRAY)
            for (std::size_t i = 0; i < r->elements; ++i) out.push_back(r->element[i]->element[3]->integer);
        return out;
    }

    // A counter of the consumer's /metrics, -1 when absent.
    static double metric(int port, const std::string& name) {
        httplib::Client client("127.0.0.1", port);
        auto res = client.Get("/metrics");
        if (!res || res->status != 200) return -1;
        const std::string series = name + "{mode=\"consume\",consumer=\"accounting\",group=\"accounting\"} ";
        const auto at = res->body.find("\n" + series);
        if (at == std::string::npos) return -1;
        return std::stod(res->body.substr(at + series.size() + 1));
    }

    // pg_outbox_relay_gaps_total of a stream, -1 when absent.
    static double gaps_metric(int port, const std::string& stream) {
        httplib::Client client("127.0.0.1", port);
        auto res = client.Get("/metrics");
        if (!res || res->status != 200) return -1;
        const std::string series = "pg_outbox_relay_gaps_total{mode=\"consume\",consumer=\"accounting\","
                                   "group=\"accounting\",stream=\"" + stream + "\"} ";
        const auto at = res->body.find("\n" + series);
        if (at == std::string::npos) return -1;
        return std::stod(res->body.substr(at + series.size() + 1));
    }

    // The dead letters' stream and entry id, "stream entry_id" each, sorted.
    std::vector<std::string> dead_letter_ids() {
        auto db = sink();
        return query_column(db, "SELECT stream || ' ' || entry_id FROM outbox.dead_letters ORDER BY 1");
    }

    // Emits n events (a third on each topic) and waits until the relay
    // published them: each stream's last id is its topic's last position
    // (entries deleted from the streams do not matter).
    void publish(int n, int from = 0) {
        emit(n, from);
        std::map<std::string, std::string> last;
        {
            auto pg = connect();
            auto r = pg.exec("SELECT DISTINCT ON (topic) topic, txid::text || '-' || seq FROM outbox.event "
                             "ORDER BY topic, txid DESC, seq DESC");
            for (int i = 0; i < r.rows(); ++i) last["outbox:" + std::string(r.get(i, 0))] = r.get(i, 1);
        }
        ASSERT_TRUE(eventually(
            [&] {
                auto redis = redis_->connect();
                for (const auto& [key, id] : last) {
                    auto info = redis.command_raw({"XINFO", "STREAM", key});
                    const redisReply* top = map_field(info.get(), "last-generated-id");
                    if (top == nullptr || reply_text(top) != id) return false;
                }
                return true;
            },
            30s));
    }

    std::vector<Entry> stream(const std::string& key) {
        auto redis = redis_->connect();
        return read_stream(redis, key);
    }

    std::string sink_;
};

// The bytes of a hex string.
std::string unhex(const std::string& hex) {
    std::string out;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    return out;
}

std::string hex(const std::string& bytes) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned char c : bytes) {
        out.push_back(digits[c >> 4]);
        out.push_back(digits[c & 15]);
    }
    return out;
}

}  // namespace

// The normal path: every committed event applied once, in one local
// transaction with the handler's own emit.
TEST_F(ConsumeTest, AppliesEveryEventOnce) {
    start_relay();
    start_consumer("w1");
    emit(300);
    ASSERT_TRUE(wait_applied(300));
    std::this_thread::sleep_for(300ms);
    expect_projection_exactly_once();
    EXPECT_EQ(pending("outbox:orders"), 0);
}

// Window 1: XADD succeeded, the relay died before advancing its cursor.
// After the restart the events are refused by Redis as present; the inbox
// applies each once.
TEST_F(ConsumeTest, Window1RelayDiesAfterXaddBeforeAdvance) {
    emit(120);
    {
        auto pg = connect();
        pg.exec("REVOKE EXECUTE ON FUNCTION outbox_advance(text, text, jsonb) FROM outbox_relay");
    }
    auto& relay = start_relay();
    EXPECT_EQ(relay.wait(30s), 1);
    {
        auto pg = connect();
        pg.exec("GRANT EXECUTE ON FUNCTION outbox_advance(text, text, jsonb) TO outbox_relay");
    }
    start_consumer("w1");
    start_relay();
    ASSERT_TRUE(wait_applied(120));
    ASSERT_TRUE(wait_all_published());
    std::this_thread::sleep_for(300ms);
    expect_projection_exactly_once();
}

// Window 2: the consumer's transaction fails after inserting the inbox
// row. Neither inbox nor projection change; the entry stays pending, is
// reclaimed, and applied once when the handler works again.
TEST_F(ConsumeTest, Window2TransactionFailsAfterInboxInsert) {
    {
        auto db = sink();
        db.exec("INSERT INTO fail_keys VALUES ('k7')");
    }
    start_relay();
    auto& consumer = start_consumer("w1", {"--min-idle", "300ms", "--claim-interval", "100ms"});
    emit(20);
    ASSERT_TRUE(wait_applied(19));
    ASSERT_TRUE(eventually([&] { return consumer.log().find("stays pending") != std::string::npos; }, 10s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection WHERE key = 'k7'"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.inbox i JOIN projection p USING (event_id)"), 19);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.inbox"), 19);
    EXPECT_EQ(pending("outbox:payments"), 1);  // k7: event 7 is on topic 7 % 3, payments
    {
        auto db = sink();
        db.exec("DELETE FROM fail_keys");
    }
    ASSERT_TRUE(wait_applied(20));
    ASSERT_TRUE(eventually([&] { return pending("outbox:payments") == 0; }, 10s));
    expect_projection_exactly_once();
    EXPECT_NE(consumer.log().find("reclaimed"), std::string::npos);
}

// Window 3: the consumer committed (inbox and projection) and died before
// XACK. The entry is pending for the dead worker; reclaimed, it is a
// duplicate: acknowledged, projection unchanged.
TEST_F(ConsumeTest, Window3CommittedButNotAcknowledged) {
    start_relay();
    emit(10);
    ASSERT_TRUE(wait_all_published());
    {
        // The dead worker: it read the entries, applied them, committed, and
        // died before XACK.
        auto redis = redis_->connect();
        for (const auto& t : kTopics)
            redis.command({"XGROUP", "CREATE", "outbox:" + t, "accounting", "0", "MKSTREAM"});
        auto db = sink();
        for (const auto& t : kTopics) {
            auto r = redis.command({"XREADGROUP", "GROUP", "accounting", "dead-worker", "COUNT", "100", "STREAMS",
                                    "outbox:" + t, ">"});
            for (const auto& e : parse_entries("outbox:" + t, r->element[0]->element[1]))
                db.exec("SELECT * FROM inbox_consume('accounting', $1, ARRAY[convert_to($2, 'UTF8')], "
                        "ARRAY[convert_to($3, 'UTF8')], ARRAY[convert_to($4, 'UTF8')], ARRAY[convert_to($5, 'UTF8')], "
                        "NULL)",
                        {std::string(kHandler), *e.field("event_id"), *e.field("topic"), *e.field("key"),
                         *e.field("payload")});
        }
    }
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), 10);
    EXPECT_EQ(pending("outbox:orders") + pending("outbox:payments") + pending("outbox:audit"), 10);
    auto& consumer = start_consumer("w2", {"--min-idle", "200ms", "--claim-interval", "100ms"});
    ASSERT_TRUE(eventually(
        [&] { return pending("outbox:orders") + pending("outbox:payments") + pending("outbox:audit") == 0; }, 15s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), 10);
    expect_projection_exactly_once();
    EXPECT_NE(consumer.log().find("was applied before; acknowledged"), std::string::npos);
}

// Window 4: a new stream entry carrying a known event id (same payload):
// the inbox reports a duplicate; nothing changes.
TEST_F(ConsumeTest, Window4NewEntryWithKnownEventId) {
    start_relay();
    start_consumer("w1");
    emit(3);
    ASSERT_TRUE(wait_applied(3));
    auto app = connect();
    auto r = app.exec("SELECT event_id, payload::text FROM outbox.event WHERE topic = 'orders'");
    xadd("outbox:orders", id_between("outbox:orders"), std::string(r.get(0, 0)), std::string(r.get(0, 1)), "k0");
    ASSERT_TRUE(eventually([&] { return pending("outbox:orders") == 0 && sink_count(
        "SELECT count(*) FROM outbox.inbox") == 3; }, 10s));
    std::this_thread::sleep_for(500ms);
    expect_projection_exactly_once();
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);
}

// Window 5: the same event id with another payload: identity conflict,
// dead-lettered with both payloads, nothing applied, the stream flows on.
TEST_F(ConsumeTest, Window5SameIdDifferentPayload) {
    start_relay();
    auto& consumer = start_consumer("w1");
    emit(3);
    ASSERT_TRUE(wait_applied(3));
    auto app = connect();
    auto r = app.exec("SELECT event_id FROM outbox.event WHERE topic = 'orders'");
    const std::string id(r.get(0, 0));
    const auto entry = id_between("outbox:orders");
    xadd("outbox:orders", entry, id, "{\"n\": 0, \"amount\": 1000000}", "k0");
    emit(3, 3);
    ASSERT_TRUE(wait_applied(6));
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 1; }, 10s));
    auto db = sink();
    auto dl = db.exec("SELECT event_id::text, sqlstate, payload->>'amount', applied_payload->>'amount', entry_id "
                      "FROM outbox.dead_letters");
    EXPECT_EQ(dl.get(0, 0), id);
    EXPECT_EQ(dl.get(0, 1), "OB001");
    EXPECT_EQ(dl.get(0, 2), "1000000");
    EXPECT_EQ(dl.get(0, 3), "10");
    EXPECT_EQ(dl.get(0, 4), entry);
    EXPECT_EQ(sink_count("SELECT sum(amount) FROM projection"), 60);
    EXPECT_EQ(pending("outbox:orders"), 0);
    EXPECT_NE(consumer.log().find("another payload"), std::string::npos);
}

// A handler that always fails for one key: dead-lettered after
// --max-deliveries, acknowledged; later entries keep flowing.
TEST_F(ConsumeTest, AlwaysFailingHandlerIsDeadLettered) {
    {
        auto db = sink();
        db.exec("INSERT INTO fail_keys VALUES ('k4')");
    }
    start_relay();
    auto& consumer =
        start_consumer("w1", {"--min-idle", "100ms", "--claim-interval", "50ms", "--max-deliveries", "3"});
    emit(30);
    ASSERT_TRUE(wait_applied(29));
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 1; }, 20s))
        << consumer.log();
    auto db = sink();
    auto dl = db.exec("SELECT key, deliveries, sqlstate, reason FROM outbox.dead_letters");
    EXPECT_EQ(dl.get(0, 0), "k4");
    EXPECT_EQ(dl.get(0, 1), "3");
    EXPECT_EQ(dl.get(0, 2), "P0001");
    EXPECT_NE(std::string(dl.get(0, 3)).find("handler refuses key k4"), std::string::npos);
    ASSERT_TRUE(eventually([&] { return pending("outbox:payments") == 0; }, 10s));
    emit(6, 30);
    ASSERT_TRUE(wait_applied(35));
    // Replaying the dead letter once the handler is fixed applies it once.
    db.exec("DELETE FROM fail_keys");
    db.exec("SELECT inbox_replay(id, $1) FROM outbox.dead_letters", {std::string(kHandler)});
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), 36);
    expect_projection_exactly_once();
}

// 5,000 stale pending entries of a dead worker, reclaimed with a small
// COUNT: all recovered.
TEST_F(ConsumeTest, ReclaimsThousandsOfStalePendingEntries) {
    {
        auto app = connect();
        app.exec("SELECT count(*) FROM outbox_emit_many('orders', NULL, "
                 "(SELECT array_agg(jsonb_build_object('n', i, 'amount', 1)) FROM generate_series(1, 5000) i))");
    }
    auto& relay = start_relay({"--batch-size", "1000"});
    ASSERT_TRUE(wait_all_published()) << relay.log();
    {
        auto redis = redis_->connect();
        redis.command({"XGROUP", "CREATE", "outbox:orders", "accounting", "0", "MKSTREAM"});
        auto r = redis.command({"XREADGROUP", "GROUP", "accounting", "dead-worker", "COUNT", "10000", "STREAMS",
                                "outbox:orders", ">"});
        ASSERT_EQ(r->element[0]->element[1]->elements, 5000u);
    }
    EXPECT_EQ(pending("outbox:orders"), 5000);
    start_consumer("w1", {"--min-idle", "100ms", "--claim-interval", "100ms", "--batch-size", "50"});
    ASSERT_TRUE(wait_applied(5000, 60s));
    ASSERT_TRUE(eventually([&] { return pending("outbox:orders") == 0; }, 10s));
    expect_projection_exactly_once();
}

// Two workers racing on the same entries (each reclaims what the other
// holds almost at once): every event applied once.
TEST_F(ConsumeTest, TwoWorkersRacingApplyOnce) {
    start_relay();
    const std::vector<std::string> racy{"--min-idle", "1ms", "--claim-interval", "5ms", "--batch-size", "10"};
    start_consumer("w1", racy);
    start_consumer("w2", racy);
    emit(400);
    ASSERT_TRUE(wait_applied(400, 60s));
    ASSERT_TRUE(eventually(
        [&] { return pending("outbox:orders") + pending("outbox:payments") + pending("outbox:audit") == 0; }, 20s));
    expect_projection_exactly_once();
    // Each worker reads a part of each stream; the group's position read
    // with each batch tells no gap.
    auto db = sink();
    EXPECT_EQ(query_column(db, "SELECT concat_ws(' ', stream, entry_id, event_id, deliveries, sqlstate, reason) "
                                 "FROM outbox.dead_letters"),
              std::vector<std::string>{});
}

// SIGTERM finishes the batch and exits 0; a bad setting exits 2 at once.
TEST_F(ConsumeTest, SigtermAndBadSettings) {
    auto& consumer = start_consumer("w1");
    std::this_thread::sleep_for(500ms);
    consumer.signal(SIGTERM);
    EXPECT_EQ(consumer.wait(10s), 0) << consumer.log();
    auto& bad = start_process({PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "c", "--stream", "s", "--handler",
                               kHandler, "--max-deliveries", "0"});
    EXPECT_NE(bad.wait(10s), 0);
    EXPECT_NE(bad.log().find("--max-deliveries"), std::string::npos) << bad.log();
}

// Entries whose content cannot be applied, between valid ones in one
// batch: each is dead-lettered alone with its fields exactly as received,
// logged once with its entry id, counted and acknowledged; the valid ones
// apply; the worker never exits, also when it starts on such a backlog.
TEST_F(ConsumeTest, MalformedEntriesAreDeadLetteredAlone) {
    const std::string s = "outbox:orders";
    auto uuid = [](int i) {
        char buf[40];
        std::snprintf(buf, sizeof buf, "00000000-0000-4000-8000-%012d", i);
        return std::string(buf);
    };
    auto valid = [&](int i) {
        return std::vector<std::string>{"event_id", uuid(i), "topic", "orders", "key", "k" + std::to_string(i),
                                        "payload", "{\"n\": " + std::to_string(i) + ", \"amount\": 1}"};
    };
    const std::string big_bad = "[\"" + std::string(40u << 20, 'x') + "\xff\"]";  // 40 MiB, not UTF-8
    const std::vector<std::pair<std::string, std::vector<std::string>>> bad{
        {"22021", {"event_id", uuid(101), "topic", "orders", "payload", unhex("7b226e223a22ff227d")}},
        {"22021", {"event_id", uuid(102), "topic", std::string("or\0ders", 7), "payload", "{\"n\": 2}"}},
        {"22P05", {"event_id", uuid(103), "topic", "orders", "payload", "{\"a\":\"\\u0000\"}"}},
        {"22P02", {"event_id", "not-a-uuid", "topic", "orders", "payload", "{}"}},
        {"22004", {"topic", "orders", "payload", "{}"}},
        {"22023", {"event_id", uuid(106), "topic", "orders", "payload", "{}", "payload", "{\"n\": 6}"}},
        {"22021", {"event_id", uuid(107), "topic", "orders", "payload", big_bad}},
        {"22021", {unhex("ff00"), unhex("00ff"), "event_id", uuid(108), "topic", "orders", "key", unhex("c3"),
                   "payload", "{}"}},
    };
    std::vector<std::string> bad_ids;
    int n = 0;
    for (const auto& [state, fields] : bad) {
        xadd_raw(s, valid(++n));
        bad_ids.push_back(xadd_raw(s, fields));
    }
    xadd_raw(s, valid(++n));

    const int port = free_port();
    auto& consumer = start_consumer("w1", {"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    ASSERT_TRUE(wait_applied(n)) << consumer.log();
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 8; }, 20s))
        << consumer.log();
    ASSERT_TRUE(eventually([&] { return pending(s) == 0; }, 10s));
    EXPECT_TRUE(consumer.running()) << consumer.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), n);
    auto db = sink();
    for (std::size_t i = 0; i < bad.size(); ++i) {
        const auto& fields = bad[i].second;
        auto r = db.exec("SELECT sqlstate, reason, cardinality(fields) FROM outbox.dead_letters WHERE entry_id = $1",
                         {bad_ids[i]});
        ASSERT_EQ(r.rows(), 1) << bad_ids[i];
        EXPECT_EQ(r.get(0, 0), bad[i].first) << i << ": " << r.get(0, 1);
        EXPECT_EQ(std::stoul(std::string(r.get(0, 2))), fields.size()) << i;
        // Every name and value byte for byte.
        for (std::size_t f = 0; f < fields.size(); ++f) {
            auto v = db.exec("SELECT md5(fields[$2::int]) = md5(decode($3, 'hex')) FROM outbox.dead_letters "
                             "WHERE entry_id = $1",
                             {bad_ids[i], std::to_string(f + 1), hex(fields[f])});
            EXPECT_EQ(v.get(0, 0), "t") << "entry " << i << " field " << f;
        }
        // Logged once, with its entry id.
        const auto log = consumer.log();
        const auto line = "entry " + bad_ids[i] + " of \"" + s + "\" is malformed";
        const auto first = log.find(line);
        EXPECT_NE(first, std::string::npos) << line;
        EXPECT_EQ(log.find(line, first + 1), std::string::npos) << line;
    }
    // Typed columns only when they decode.
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE event_id = '" + uuid(101) +
                         "' AND topic = 'orders' AND payload IS NULL"),
              1);
    EXPECT_TRUE(eventually([&] { return metric(port, "pg_outbox_relay_entries_malformed_total") == 8; }, 5s));
    // Read again from the start by a new worker: nothing applies twice,
    // the dead letters are the same rows, and the worker keeps running.
    consumer.signal(SIGTERM);
    EXPECT_EQ(consumer.wait(10s), 0) << consumer.log();
    {
        auto redis = redis_->connect();
        auto r = redis.command({"XGROUP", "SETID", s, "accounting", "0"});
        ASSERT_NE(r->type, REDIS_REPLY_ERROR) << reply_text(r.get());
    }
    auto& again = start_consumer("w2");
    ASSERT_TRUE(eventually([&] { return again.log().find("is malformed") != std::string::npos; }, 20s))
        << again.log();
    ASSERT_TRUE(eventually([&] { return pending(s) == 0; }, 20s)) << again.log();
    EXPECT_TRUE(again.running()) << again.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), n);
    EXPECT_EQ(sink_count("SELECT count(*) FROM (SELECT event_id FROM projection GROUP BY 1 HAVING count(*) > 1) d"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 8);
}

// Faults of the settings, not of any entry, found at start-up: the worker
// exits 2 naming the cause before it reads, and nothing is dead-lettered
// or acknowledged.
TEST_F(ConsumeTest, ConfigurationFaultsExitTwoAtStart) {
    {
        auto db = sink();
        db.exec("CREATE TABLE secret (x int)");
        db.exec("CREATE ROLE other_user LOGIN IN ROLE outbox_consumer");
        db.exec("SELECT inbox_consumer_create('billing', 'other_user')");
    }
    start_relay();
    emit(6);
    ASSERT_TRUE(wait_all_published());
    struct Case {
        std::string why;
        std::string consumer;
        std::string handler;
        std::string expect;
    };
    const std::vector<Case> cases{
        {"undefined function", "accounting", "SELECT no_such_handler($1, $2, $3, $4, $5)", "42883"},
        {"syntax error", "accounting", "SELEC apply_event($1, $2, $3, $4, $5)", "42601"},
        {"two statements", "accounting", "SELECT 1; SELECT 2", "42601"},
        {"no privilege", "accounting", "SELECT count(*) FROM secret WHERE x = length($1)", "42501"},
        {"parameter beyond the six", "accounting", "SELECT $7", "42601"},
        {"unregistered consumer", "nobody", kHandler, "42501"},
        {"another role's consumer", "billing", kHandler, "42501"},
        {"consumer name over 255 bytes", std::string(256, 'c'), kHandler, "54000"},
        {"consumer name not UTF-8", "acc\xff", kHandler, "22021"},
    };
    for (const auto& c : cases) {
        auto& p = start_process({PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", c.consumer, "--pg",
                                 pg_->conninfo("sink", "consumer_user"), "--redis", redis_->address(), "--worker",
                                 "w1", "--group", "accounting", "--stream", "outbox:orders,outbox:payments,outbox:audit",
                                 "--handler", c.handler, "--block", "100ms", "--min-idle", "1ms", "--claim-interval",
                                 "1ms", "--max-deliveries", "1"});
        EXPECT_EQ(p.wait(20s), 2) << c.why << "\n" << p.log();
        EXPECT_NE(p.log().find("SQLSTATE " + c.expect), std::string::npos) << c.why << "\n" << p.log();
    }
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.inbox"), 0);
    // Nothing was read: a good worker applies all of it.
    start_consumer("w2");
    ASSERT_TRUE(wait_applied(6));
    expect_projection_exactly_once();
}

// A fault of the settings that appears while running (the handler loses a
// privilege, the consumer is unregistered): the entries are held and
// retried with backoff, never dead-lettered or acknowledged, and their
// deliveries do not count; once it is fixed they apply once.
TEST_F(ConsumeTest, ConfigurationFaultWhileRunningHoldsEntries) {
    start_relay();
    auto& consumer = start_consumer(
        "w1", {"--min-idle", "100ms", "--claim-interval", "50ms", "--max-deliveries", "2", "--retry-max", "200ms"});
    emit(3);
    ASSERT_TRUE(wait_applied(3));
    {
        auto db = sink();
        db.exec("REVOKE ALL ON projection FROM consumer_user");
    }
    emit(6, 3);
    ASSERT_TRUE(eventually([&] { return consumer.log().find("configuration fault") != std::string::npos; }, 10s))
        << consumer.log();
    std::this_thread::sleep_for(2s);  // many times --min-idle and --max-deliveries
    EXPECT_TRUE(consumer.running()) << consumer.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0) << consumer.log();
    // Held: read, neither acknowledged nor applied (the worker reads
    // nothing more meanwhile).
    EXPECT_GE(pending("outbox:orders") + pending("outbox:payments") + pending("outbox:audit"), 1);
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), 3);
    for (const auto& t : kTopics)
        for (auto d : delivery_counts("outbox:" + t)) EXPECT_LE(d, 1) << consumer.log();
    EXPECT_NE(consumer.log().find("SQLSTATE 42501"), std::string::npos);
    {
        auto db = sink();
        db.exec("GRANT ALL ON projection TO consumer_user");
    }
    ASSERT_TRUE(wait_applied(9)) << consumer.log();
    ASSERT_TRUE(eventually(
        [&] { return pending("outbox:orders") + pending("outbox:payments") + pending("outbox:audit") == 0; }, 10s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);

    // The consumer given to another role while running: the same.
    {
        auto db = sink();
        db.exec("CREATE ROLE other_user IN ROLE outbox_consumer");
        db.exec("SELECT inbox_consumer_set_owner('accounting', 'other_user')");
    }
    emit(3, 9);
    ASSERT_TRUE(eventually(
        [&] { return consumer.log().find("permission denied for consumer") != std::string::npos; }, 10s))
        << consumer.log();
    std::this_thread::sleep_for(1s);
    EXPECT_TRUE(consumer.running());
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), 9);
    {
        auto db = sink();
        db.exec("SELECT inbox_consumer_set_owner('accounting', 'consumer_user')");
    }
    ASSERT_TRUE(wait_applied(12)) << consumer.log();
    std::this_thread::sleep_for(300ms);
    expect_projection_exactly_once();
}

// A lost connection (the worker's backend terminated, as in a PostgreSQL
// restart) fails a whole batch: the batch is held and applied first once
// the worker has reconnected, not left pending until --min-idle while
// newer entries of the same keys are read and applied before it. (The
// reclaim and the poll of parked keys that follows it run once, at the
// start: a poll would find the lost connection first, before any batch.)
TEST_F(ConsumeTest, LostConnectionHoldsTheBatch) {
    start_relay();
    auto& consumer = start_consumer("w1", {"--min-idle", "60s", "--claim-interval", "60s"});
    emit(3);
    ASSERT_TRUE(wait_applied(3));
    {
        auto db = sink();
        db.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'consumer_user'");
    }
    emit(6, 3);
    ASSERT_TRUE(wait_applied(9, 10s)) << consumer.log();  // far sooner than --min-idle
    EXPECT_NE(consumer.log().find("entries held"), std::string::npos) << consumer.log();
    EXPECT_NE(consumer.log().find("the fault is gone"), std::string::npos) << consumer.log();
    ASSERT_TRUE(eventually(
        [&] { return pending("outbox:orders") + pending("outbox:payments") + pending("outbox:audit") == 0; }, 10s));
    expect_projection_exactly_once();
}

// An entry that fails the whole call, outside its subtransaction (here a
// statement timeout, which no exception block catches): the batch is
// applied entry by entry, the others apply, and only that entry counts
// deliveries and is dead-lettered.
TEST_F(ConsumeTest, WholeBatchFailureIsChargedToItsEntry) {
    {
        auto db = sink();
        db.exec("ALTER ROLE consumer_user SET statement_timeout = '1s'");
        db.exec(R"(CREATE OR REPLACE FUNCTION apply_event(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
            RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                IF key = 'k4' THEN
                    PERFORM pg_sleep(5);
                END IF;
                INSERT INTO projection VALUES (event_id, topic, key, (payload->>'n')::int, (payload->>'amount')::int);
                PERFORM outbox_emit('applied', key, jsonb_build_object('of', event_id));
            END $$)");
    }
    start_relay();
    emit(12);
    ASSERT_TRUE(wait_all_published());
    auto& consumer =
        start_consumer("w1", {"--min-idle", "100ms", "--claim-interval", "50ms", "--max-deliveries", "2"});
    ASSERT_TRUE(wait_applied(11)) << consumer.log();
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 1; }, 30s))
        << consumer.log();
    auto db = sink();
    auto dl = db.exec("SELECT key, sqlstate, deliveries FROM outbox.dead_letters");
    EXPECT_EQ(dl.get(0, 0), "k4");
    EXPECT_EQ(dl.get(0, 1), "57014");
    EXPECT_EQ(dl.get(0, 2), "2");
    ASSERT_TRUE(eventually(
        [&] { return pending("outbox:orders") + pending("outbox:payments") + pending("outbox:audit") == 0; }, 10s));
    EXPECT_TRUE(consumer.running()) << consumer.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), 11);
    EXPECT_NE(consumer.log().find("failed as a whole, applying them one by one"), std::string::npos);
}

// The happy path of a batch is one transaction with one transaction id: no
// subtransaction per entry (each would take an id of its own, and more
// than 64 in a transaction overflow its backend's cache). Counted on the
// server: the ids the cluster handed out while 10,000 entries applied in
// batches of 100, against the number of inbox_consume() calls.
TEST_F(ConsumeTest, BatchTakesOneTransactionId) {
    {
        auto app = connect();
        app.exec("SELECT count(outbox_emit('orders', 'k' || (i % 10), jsonb_build_object('n', i, 'amount', 1))) "
                 "FROM generate_series(1, 10000) i");
    }
    auto& relay = start_relay({"--batch-size", "1000"});
    ASSERT_TRUE(wait_all_published(60s)) << relay.log();
    // The relay writes its group's row; nothing else writes meanwhile.
    relay.signal(SIGTERM);
    ASSERT_EQ(relay.wait(10s), 0) << relay.log();
    sink().exec("ALTER DATABASE sink SET track_functions = 'all'");
    auto xmax = [&] {
        auto db = sink();
        return std::stoll(query_column(db, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text")[0]);
    };
    const auto before = xmax();
    auto& consumer = start_consumer("w1", {"--batch-size", "100"});
    ASSERT_TRUE(wait_applied(10000, 120s)) << consumer.log();
    const auto used = xmax() - before;
    // Each call's statistics reach the server when its session goes idle.
    // The relay's call is inbox_consume_keyed(), which applies a batch
    // through inbox_consume() (on the C engine directly, in C, uncounted).
    long long calls = 0;
    ASSERT_TRUE(eventually(
        [&] {
            calls = sink_count("SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
                               "WHERE funcname = 'inbox_consume_keyed'");
            return calls >= 100;
        },
        10s));
    EXPECT_GE(used, 1);
    EXPECT_LE(used, calls) << used << " transaction ids for " << calls << " batches of 10,000 entries";
    EXPECT_EQ(consumer.log().find("failed as one"), std::string::npos) << consumer.log();
    expect_projection_exactly_once();
}

// A batch that fails as one (a handler raises for some entries) applies
// again with each entry in a subtransaction of its own, in parts of at
// most 64, each a transaction: every other entry applies, in the order of
// its key, and the failing ones are dead-lettered alone.
TEST_F(ConsumeTest, FailedBatchAppliesAgainInPartsOfAtMost64) {
    {
        auto db = sink();
        // The transaction that applied each row, and the order of applies.
        db.exec("ALTER TABLE projection ADD COLUMN xid xid8 DEFAULT pg_current_xact_id(), "
                "ADD COLUMN applied bigserial");
        db.exec("GRANT USAGE ON SEQUENCE projection_applied_seq TO consumer_user");
        db.exec("INSERT INTO fail_keys VALUES ('k3')");
        auto app = connect();
        app.exec("SELECT count(outbox_emit('orders', 'k' || (i % 10), jsonb_build_object('n', i, 'amount', 1))) "
                 "FROM generate_series(1, 1000) i");
    }
    auto& relay = start_relay({"--batch-size", "1000"});
    ASSERT_TRUE(wait_all_published()) << relay.log();
    auto& consumer = start_consumer("w1", {"--batch-size", "200", "--min-idle", "100ms", "--claim-interval",
                                           "50ms", "--max-deliveries", "2"});
    ASSERT_TRUE(wait_applied(900, 60s)) << consumer.log();
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 100; }, 60s))
        << consumer.log();
    ASSERT_TRUE(eventually([&] { return pending("outbox:orders") == 0; }, 20s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), 900);
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection WHERE key = 'k3'"), 0);
    // Every batch of 200 held a failing entry: every row was applied in a
    // part of at most 64 entries.
    EXPECT_LE(sink_count("SELECT max(c) FROM (SELECT count(*) AS c FROM projection GROUP BY xid) t"), 64);
    EXPECT_GE(sink_count("SELECT count(DISTINCT xid) FROM projection"), 900 / 64);
    // Each key's events applied in the order they were emitted.
    EXPECT_EQ(sink_count("SELECT count(*) FROM (SELECT n < lag(n) OVER (PARTITION BY key ORDER BY applied) AS back "
                         "FROM projection) t WHERE back"),
              0);
    EXPECT_NE(consumer.log().find("failed as one, applying it again entry by entry"), std::string::npos);
    EXPECT_TRUE(consumer.running()) << consumer.log();
}

// A gap in the middle of a stream (an entry deleted before the group read
// it): the consumer reports exactly that entry's range, once, as a
// warning, a metric of its stream and a dead letter, and applies the rest.
TEST_F(ConsumeTest, DeletedEntryIsReportedAsAGap) {
    auto& relay = start_relay();
    publish(30);
    ASSERT_EQ(published_count(), 30u) << relay.log();
    const auto orders = stream("outbox:orders");
    ASSERT_EQ(orders.size(), 10u);
    EXPECT_EQ(orders[0].fields.at("prev"), "0-0");
    for (std::size_t i = 1; i < orders.size(); ++i) EXPECT_EQ(orders[i].fields.at("prev"), orders[i - 1].id);
    {
        auto redis = redis_->connect();
        redis.command({"XDEL", "outbox:orders", orders[4].id});
    }
    const int port = free_port();
    auto& consumer = start_consumer("w1", {"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    ASSERT_TRUE(wait_applied(29)) << consumer.log();
    const std::string range = "(" + orders[3].id + " " + orders[4].id + "]";
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 1; }, 10s));
    EXPECT_EQ(dead_letter_ids(), std::vector<std::string>{"outbox:orders " + range});
    {
        auto db = sink();
        auto r = db.exec("SELECT reason, fields IS NULL, event_id IS NULL FROM outbox.dead_letters");
        EXPECT_NE(std::string(r.get(0, 0)).find("up to and including " + orders[4].id), std::string::npos)
            << r.get(0, 0);
        EXPECT_EQ(r.get(0, 1), "t");
        EXPECT_EQ(r.get(0, 2), "t");
    }
    EXPECT_TRUE(eventually([&] { return gaps_metric(port, "outbox:orders") == 1; }, 5s));
    EXPECT_EQ(gaps_metric(port, "outbox:payments"), 0);
    EXPECT_EQ(gaps_metric(port, "outbox:audit"), 0);
    const auto log = consumer.log();
    const auto line = "stream \"outbox:orders\": gap " + range;
    EXPECT_NE(log.find(line), std::string::npos) << log;
    EXPECT_EQ(log.find(line, log.find(line) + 1), std::string::npos) << "reported twice";
    EXPECT_NE(log.find("warning " + line), std::string::npos) << log;
    // More entries: nothing more to report.
    emit(9, 30);
    ASSERT_TRUE(wait_applied(38));
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 1);
    EXPECT_EQ(gaps_metric(port, "outbox:orders"), 1);
}

// Entries trimmed (XTRIM) after the group's position while the worker
// waits: the first entry read names the last one trimmed; the range
// reported starts at the group's position. Trimmed before a worker
// starts, the range is reported once (by the group's lag), not twice.
TEST_F(ConsumeTest, TrimmedEntriesAreReportedOnce) {
    start_relay();
    publish(30);
    const int port = free_port();
    auto& consumer = start_consumer("w1", {"--metrics-address", "127.0.0.1:" + std::to_string(port),
                                           "--claim-interval", "60m"});
    ASSERT_TRUE(wait_applied(30)) << consumer.log();
    const auto before = stream("outbox:orders").back().id;
    consumer.signal(SIGSTOP);
    publish(30, 30);  // ten more on each stream
    {
        auto redis = redis_->connect();
        redis.command({"XTRIM", "outbox:orders", "MAXLEN", "3"});
    }
    const auto left = stream("outbox:orders");
    ASSERT_EQ(left.size(), 3u);
    consumer.signal(SIGCONT);
    ASSERT_TRUE(wait_applied(53)) << consumer.log();
    const std::string range = "(" + before + " " + left[0].fields.at("prev") + "]";
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 1; }, 10s));
    EXPECT_EQ(dead_letter_ids(), std::vector<std::string>{"outbox:orders " + range});
    EXPECT_TRUE(eventually([&] { return gaps_metric(port, "outbox:orders") == 1; }, 5s));
    consumer.signal(SIGTERM);
    EXPECT_EQ(consumer.wait(10s), 0);

    // Trimmed while no worker runs: at start the group's lag shows the
    // range (reported as "(A B)"), and the group moves past it; the first
    // entry's prev is then behind the group's position: no second report.
    publish(30, 60);
    {
        auto redis = redis_->connect();
        redis.command({"XTRIM", "outbox:orders", "MAXLEN", "2"});
    }
    auto& second = start_consumer("w2");
    ASSERT_TRUE(eventually([&] { return second.log().find("were trimmed from the stream") != std::string::npos; },
                           10s))
        << second.log();
    ASSERT_TRUE(wait_applied(53 + 22)) << second.log();
    std::this_thread::sleep_for(500ms);
    EXPECT_EQ(second.log().find("gap ("), std::string::npos) << second.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 2);
}

// A replay (the relay publishes the same positions again after a rewind),
// a restart of the consumer in the middle of a stream, a redelivery of
// pending entries to another worker: no gap is reported.
TEST_F(ConsumeTest, ReplayRestartAndRedeliveryRaiseNoGap) {
    auto& relay = start_relay();
    publish(30);
    auto& first = start_consumer("w1");
    ASSERT_TRUE(wait_applied(30)) << first.log();
    // Replay: everything published again; Redis refuses it as present.
    {
        auto pg = connect();
        pg.exec("SELECT outbox_rewind('g', 'beginning')");
    }
    ASSERT_TRUE(eventually([&] { return relay.log().find("were already in Redis") != std::string::npos; }, 10s))
        << relay.log();
    publish(15, 30);
    ASSERT_TRUE(wait_applied(45)) << first.log();
    // Restart mid-stream.
    first.signal(SIGTERM);
    EXPECT_EQ(first.wait(10s), 0);
    publish(15, 45);
    auto& second = start_consumer("w2");
    ASSERT_TRUE(wait_applied(60)) << second.log();
    second.signal(SIGTERM);
    EXPECT_EQ(second.wait(10s), 0);
    // Pending redelivery: a worker reads entries and dies before applying
    // them; another reclaims them, and goes on reading new ones.
    publish(15, 60);
    {
        auto redis = redis_->connect();
        for (const auto& t : kTopics)
            redis.command({"XREADGROUP", "GROUP", "accounting", "dead-worker", "COUNT", "3", "STREAMS",
                           "outbox:" + t, ">"});
    }
    auto& third = start_consumer("w3", {"--min-idle", "200ms", "--claim-interval", "100ms"});
    ASSERT_TRUE(wait_applied(75)) << third.log();
    publish(15, 75);
    ASSERT_TRUE(wait_applied(90)) << third.log();
    ASSERT_TRUE(eventually(
        [&] { return pending("outbox:orders") + pending("outbox:payments") + pending("outbox:audit") == 0; }, 15s));
    expect_projection_exactly_once();
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);
    for (const auto* p : {&first, &second, &third}) EXPECT_EQ(p->log().find("gap ("), std::string::npos) << p->log();
    // The chain in each stream is whole.
    for (const auto& t : kTopics) {
        std::string prev = "0-0";
        for (const auto& e : stream("outbox:" + t)) {
            EXPECT_EQ(e.fields.at("prev"), prev) << t;
            prev = e.id;
        }
    }
}

// A stream that lost its tail is republished by the relay: the entries
// appended again name the entry now before them, and a consumer that reads
// on sees no gap.
TEST_F(ConsumeTest, RepublishAfterLossKeepsTheChain) {
    auto& relay = start_relay();
    publish(30);
    auto entries = stream("outbox:orders");
    {
        // The lost tail: the stream recreated with its first 4 entries.
        auto redis = redis_->connect();
        redis.command({"DEL", "outbox:orders"});
        for (int i = 0; i < 4; ++i) {
            std::vector<std::string_view> argv{"XADD", "outbox:orders", entries[i].id};
            for (const auto& [f, v] : entries[i].fields) {
                argv.push_back(f);
                argv.push_back(v);
            }
            redis.command(argv);
        }
    }
    ASSERT_TRUE(eventually([&] { return relay.log().find("is behind") != std::string::npos; }, 10s)) << relay.log();
    ASSERT_TRUE(wait_all_published());
    const auto again = stream("outbox:orders");
    ASSERT_EQ(again.size(), 10u);
    for (std::size_t i = 0; i < again.size(); ++i) {
        EXPECT_EQ(again[i].id, entries[i].id);
        EXPECT_EQ(again[i].fields.at("prev"), i == 0 ? "0-0" : again[i - 1].id) << i;
    }
    auto& consumer = start_consumer("w1");
    ASSERT_TRUE(wait_applied(30)) << consumer.log();
    publish(6, 30);
    ASSERT_TRUE(wait_applied(36)) << consumer.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);
    EXPECT_EQ(consumer.log().find("gap ("), std::string::npos) << consumer.log();
}

// Redis-generated ids: prev is still the entry before in the stream, and
// a deleted entry is reported.
TEST_F(ConsumeTest, GapWithRedisGeneratedIds) {
    start_relay({"--id-mode", "redis"});
    emit(15);
    ASSERT_TRUE(wait_all_published());
    const auto orders = stream("outbox:orders");
    ASSERT_EQ(orders.size(), 5u);
    for (std::size_t i = 0; i < orders.size(); ++i)
        EXPECT_EQ(orders[i].fields.at("prev"), i == 0 ? "0-0" : orders[i - 1].id) << i;
    {
        auto redis = redis_->connect();
        redis.command({"XDEL", "outbox:orders", orders[2].id});
    }
    auto& consumer = start_consumer("w1");
    ASSERT_TRUE(wait_applied(14)) << consumer.log();
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 1; }, 10s));
    EXPECT_EQ(dead_letter_ids(),
              std::vector<std::string>{"outbox:orders (" + orders[1].id + " " + orders[2].id + "]"});
}

// Hostile prev fields, each between valid entries: each entry is
// dead-lettered alone as malformed, with its fields as received; the
// valid ones apply; no gap is reported around them; the worker runs on.
TEST_F(ConsumeTest, HostilePrevIsAnsweredAlone) {
    const std::string s = "outbox:orders";
    auto uuid = [](int i) {
        char buf[40];
        std::snprintf(buf, sizeof buf, "00000000-0000-4000-8000-%012d", i);
        return std::string(buf);
    };
    auto fields = [&](int i, const std::vector<std::string>& prevs) {
        std::vector<std::string> f{"event_id", uuid(i), "topic", "orders", "key", "k" + std::to_string(i),
                                   "payload", "{\"n\": " + std::to_string(i) + ", \"amount\": 1}"};
        for (const auto& p : prevs) f.insert(f.end(), {"prev", p});
        return f;
    };
    const std::vector<std::pair<std::string, std::vector<std::string>>> bad{
        {"22P02", {"abc"}},
        {"22P02", {""}},
        {"22P02", {std::string(1u << 20, '7')}},
        {"22P02", {std::string("5-1\0", 4)}},
        {"22023", {"prev-twice", "prev-twice"}},  // replaced below by the id before
        {"22023", {"999-0"}},                     // after the entry itself
        {"22023", {"self"}},                      // the entry's own id
    };
    auto redis = redis_->connect();
    std::string last = "0-0";
    int n = 0;
    auto add = [&](const std::vector<std::string>& f) {
        const std::string id = "100-" + std::to_string(n);
        std::vector<std::string_view> argv{"XADD", s, id};
        for (const auto& x : f) argv.emplace_back(x);
        auto r = redis.command(argv);
        last = id;
        return id;
    };
    std::vector<std::string> bad_ids;
    for (const auto& [state, prevs] : bad) {
        ++n;
        add(fields(n, {last}));
        ++n;
        std::vector<std::string> p = prevs;
        for (auto& x : p) {
            if (x == "prev-twice") x = last;
            if (x == "self") x = "100-" + std::to_string(n);
        }
        bad_ids.push_back(add(fields(n, p)));
    }
    ++n;
    add(fields(n, {last}));
    const int port = free_port();
    auto& consumer = start_consumer("w1", {"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    ASSERT_TRUE(wait_applied(static_cast<long long>(bad.size()) + 1)) << consumer.log();
    ASSERT_TRUE(eventually([&] { return pending(s) == 0; }, 10s)) << consumer.log();
    ASSERT_TRUE(eventually(
        [&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == static_cast<long long>(bad.size()); },
        10s))
        << consumer.log();
    EXPECT_TRUE(consumer.running());
    auto db = sink();
    for (std::size_t i = 0; i < bad.size(); ++i) {
        auto r = db.exec("SELECT sqlstate, reason FROM outbox.dead_letters WHERE entry_id = $1", {bad_ids[i]});
        ASSERT_EQ(r.rows(), 1) << bad_ids[i];
        EXPECT_EQ(r.get(0, 0), bad[i].first) << i << ": " << r.get(0, 1);
        EXPECT_NE(std::string(r.get(0, 1)).find("\"prev\""), std::string::npos) << r.get(0, 1);
    }
    // The huge value and the NUL byte are kept as received.
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE length(fields[10]) = 1048576"), 1);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE fields[10] = '\\x352d3100'::bytea"), 1);
    EXPECT_TRUE(eventually([&] { return metric(port, "pg_outbox_relay_entries_malformed_total") == 7; }, 5s));
    EXPECT_EQ(gaps_metric(port, s), 0);
    EXPECT_EQ(consumer.log().find("gap ("), std::string::npos) << consumer.log();
}

// The way docs/inbox.md gives to get a gap's events again: a second group publishes
// the range from the outbox to a stream of its own, and the consumer reads
// it; only the missing event applies, the others are duplicates.
TEST_F(ConsumeTest, GapEventsComeBackThroughARepairGroup) {
    start_relay();
    publish(30);
    const auto orders = stream("outbox:orders");
    {
        auto redis = redis_->connect();
        redis.command({"XDEL", "outbox:orders", orders[4].id});
    }
    auto& consumer = start_consumer("w1");
    ASSERT_TRUE(wait_applied(29)) << consumer.log();
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 1; }, 10s));
    EXPECT_EQ(dead_letter_ids(), std::vector<std::string>{"outbox:orders (" + orders[3].id + " " + orders[4].id + "]"});
    {
        auto pg = connect();
        pg.exec("SELECT outbox_group_create('repair-orders', ARRAY['orders'], 'beginning')");
        pg.exec("SELECT outbox_rewind('repair-orders', $1)", {orders[3].id});
    }
    start_process({PG_OUTBOX_RELAY_BINARY, "publish", "--group", "repair-orders", "--stream", "repair:{topic}",
                   "--pg", pg_->conninfo("app", "relay_user"), "--redis", redis_->address(), "--poll-interval",
                   "50ms", "--retry-min", "20ms", "--retry-max", "300ms"});
    auto& repair = start_process({PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting", "--pg",
                                  pg_->conninfo("sink", "consumer_user"), "--redis", redis_->address(), "--worker",
                                  "r1", "--stream", "repair:orders", "--group", "repair", "--handler", kHandler,
                                  "--block", "100ms", "--retry-min", "20ms", "--retry-max", "300ms"});
    ASSERT_TRUE(wait_applied(30)) << repair.log();
    ASSERT_TRUE(eventually([&] { return stream("repair:orders").size() == 6; }, 10s));
    std::this_thread::sleep_for(300ms);
    expect_projection_exactly_once();
    // The repair stream starts after A: its entries are the event at B
    // and the five after it, the first naming 0-0 (a new stream).
    const auto repaired = stream("repair:orders");
    EXPECT_EQ(repaired[0].id, orders[4].id);
    EXPECT_EQ(repaired[0].fields.at("prev"), "0-0");
    EXPECT_EQ(repair.log().find("gap ("), std::string::npos) << repair.log();
}

// Redis users that may not run XINFO or MULTI (ACLs): the worker still
// applies everything; without MULTI the position and the read are two
// commands (gaps still found, one worker); without XINFO gaps are not
// checked. Each says so once.
TEST_F(ConsumeTest, AclsWithoutXinfoOrMultiStillConsume) {
    {
        auto redis = redis_->connect();
        redis.command({"ACL", "SETUSER", "no_xinfo", "on", ">pw", "~*", "&*", "+@all", "-xinfo"});
        redis.command({"ACL", "SETUSER", "no_multi", "on", ">pw", "~*", "&*", "+@all", "-multi"});
    }
    start_relay();
    publish(30);
    const auto orders = stream("outbox:orders");
    {
        auto redis = redis_->connect();
        redis.command({"XDEL", "outbox:orders", orders[4].id});
    }
    const auto url = [&](const std::string& user) {
        return "redis://" + user + ":pw@127.0.0.1:" + std::to_string(redis_->port());
    };
    auto& no_xinfo = start_consumer("w1", {"--redis", url("no_xinfo")});
    ASSERT_TRUE(wait_applied(29)) << no_xinfo.log();
    no_xinfo.signal(SIGTERM);
    EXPECT_EQ(no_xinfo.wait(10s), 0);
    EXPECT_NE(no_xinfo.log().find("Redis refused XINFO GROUPS"), std::string::npos) << no_xinfo.log();
    EXPECT_EQ(no_xinfo.log().find("gap ("), std::string::npos) << no_xinfo.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);

    auto& no_multi = start_consumer("w2", {"--redis", url("no_multi"), "--group", "other"});
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 1; }, 10s))
        << no_multi.log();
    EXPECT_EQ(dead_letter_ids(), std::vector<std::string>{"outbox:orders (" + orders[3].id + " " + orders[4].id + "]"});
    const auto log = no_multi.log();
    EXPECT_NE(log.find("Redis refused MULTI"), std::string::npos) << log;
    EXPECT_EQ(log.find("Redis refused MULTI", log.find("Redis refused MULTI") + 1), std::string::npos);
    EXPECT_TRUE(no_multi.running());
}

// A handler whose function changes the session's search_path (a session
// setting, which outlives its entry): the worker's own calls are
// schema-qualified and keep working; a handler whose own unqualified name
// no longer resolves meets a configuration fault, and the entries held
// are retried on a new session, where the role's search_path is back: all
// apply, none is dead-lettered. On the SQL engine a batch's handler is
// planned once before its first entry runs (the body of a temporary
// function), so the entries of a batch resolve its name before any of them
// wanders: whether a fault comes depends on how the entries fall into
// batches, and only the outcome is checked.
TEST_F(ConsumeTest, HandlerThatChangesTheSearchPath) {
    {
        auto db = sink();
        db.exec("CREATE SCHEMA elsewhere");
        db.exec(R"(CREATE FUNCTION public.apply_and_wander(topic text, key text, payload jsonb, headers jsonb,
                                                          event_id uuid)
            RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.projection VALUES (event_id, topic, key, (payload->>'n')::int, 0);
                PERFORM pg_catalog.set_config('search_path', 'elsewhere', false);
            END $$)");
        db.exec("SELECT inbox_consumer_create('ledger', 'consumer_user')");
    }
    start_relay();
    publish(6);
    // Qualified, as the worker's calls: no fault at all.
    auto consume = [&](const std::string& consumer, const std::string& handler) -> Process& {
        return start_process({PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", consumer, "--pg",
                              pg_->conninfo("sink", "consumer_user"), "--redis", redis_->address(), "--stream",
                              "outbox:orders", "--stream", "outbox:payments", "--stream", "outbox:audit",
                              "--handler", handler, "--block", "100ms", "--max-deliveries", "1", "--retry-min",
                              "20ms", "--retry-max", "100ms"});
    };
    auto& qualified = consume("ledger", "SELECT public.apply_and_wander($1, $2, $3, $4, $5)");
    ASSERT_TRUE(wait_applied(6)) << qualified.log();
    EXPECT_EQ(qualified.log().find("configuration fault"), std::string::npos) << qualified.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0) << qualified.log();
    qualified.signal(SIGTERM);
    EXPECT_EQ(qualified.wait(20s), 0) << qualified.log();

    // Unqualified: after the first entry its name resolves no more on that
    // session, and each retry runs on a new one.
    auto& unqualified = consume("accounting", "SELECT apply_and_wander($1, $2, $3, $4, $5)");
    ASSERT_TRUE(wait_applied(12)) << unqualified.log();
    if (engine() != "sql") {
        EXPECT_NE(unqualified.log().find("SQLSTATE 42883"), std::string::npos) << unqualified.log();
        EXPECT_NE(unqualified.log().find("on a new session"), std::string::npos) << unqualified.log();
    }
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0) << unqualified.log();
    EXPECT_TRUE(unqualified.running()) << unqualified.log();
}

// Handlers that cannot run inside inbox_consume() (transaction control,
// what PostgreSQL refuses in a transaction block or a function, what
// changes the worker's session) pass PREPARE and EXPLAIN, and used to fail
// at run time for every entry, each dead-lettered. They are refused at
// start-up: exit 2 with the reason, before anything is read.
TEST_F(ConsumeTest, HandlersThatCannotRunInTheInboxExitTwo) {
    start_relay();
    publish(6);
    const std::vector<std::pair<std::string, std::string>> cases{
        {"COMMIT", "COMMIT is transaction control"},
        {"ROLLBACK", "ROLLBACK is transaction control"},
        {"  -- the end\n end", "END is transaction control"},
        {"SAVEPOINT s", "SAVEPOINT is transaction control"},
        {"RELEASE SAVEPOINT s", "RELEASE is transaction control"},
        {"PREPARE TRANSACTION 'x'", "PREPARE TRANSACTION is transaction control"},
        {"VACUUM", "VACUUM cannot run inside a transaction block"},
        {"vacuum analyze projection", "VACUUM cannot run inside a transaction block"},
        {"DEALLOCATE ALL", "DEALLOCATE changes the worker's session"},
        {"DISCARD ALL", "DISCARD changes the worker's session"},
        {"SET search_path = elsewhere", "SET changes the worker's session"},
        {"SET ROLE consumer_user", "SET changes the worker's session"},
        {"RESET ALL", "RESET changes the worker's session"},
        {"LISTEN ch", "LISTEN subscribes"},
        {"COPY projection FROM STDIN", "COPY from or to the client"},
    };
    for (const auto& [handler, reason] : cases) {
        auto& p = start_process({PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting", "--pg",
                                 pg_->conninfo("sink", "consumer_user"), "--redis", redis_->address(), "--worker",
                                 "w1", "--stream", "outbox:orders", "--stream", "outbox:payments", "--stream",
                                 "outbox:audit", "--handler", handler, "--block", "100ms", "--max-deliveries", "1"});
        EXPECT_EQ(p.wait(20s), 2) << handler << "\n" << p.log();
        EXPECT_NE(p.log().find("--handler: " + reason), std::string::npos) << handler << "\n" << p.log();
    }
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.inbox"), 0);
    start_consumer("w2");
    ASSERT_TRUE(wait_applied(6));
    expect_projection_exactly_once();
}

// What no start-up check can see: a function the handler calls that
// commits (2D000), that runs VACUUM (25001) or transaction control
// (0A000) with EXECUTE. Each is the handler's fault, the same for every
// entry: the entries are held, never dead-lettered, and apply once the
// function is fixed.
TEST_F(ConsumeTest, HandlerMisusingTheTransactionIsHeld) {
    {
        auto db = sink();
        db.exec("CREATE TABLE misbehave (how text)");
        db.exec("GRANT SELECT ON misbehave TO consumer_user");
        db.exec(R"(CREATE FUNCTION apply_or_misbehave(topic text, key text, payload jsonb, headers jsonb,
                                                     event_id uuid)
            RETURNS void LANGUAGE plpgsql AS $$
            DECLARE
                how text := (SELECT m.how FROM misbehave m);
            BEGIN
                INSERT INTO projection VALUES (event_id, topic, key, (payload->>'n')::int, 0);
                IF how = 'commit' THEN
                    COMMIT;
                ELSIF how IS NOT NULL THEN
                    EXECUTE how;
                END IF;
            END $$)");
    }
    start_relay();
    auto& consumer = start_consumer("w1", {"--handler", "SELECT apply_or_misbehave($1, $2, $3, $4, $5)",
                                           "--max-deliveries", "1", "--min-idle", "50ms", "--claim-interval", "50ms",
                                           "--retry-max", "200ms"});
    int applied = 0;
    for (const auto& [how, sqlstate] : std::vector<std::pair<std::string, std::string>>{
             {"commit", "2D000"}, {"VACUUM", "25001"}, {"ROLLBACK", "0A000"}, {"SAVEPOINT s", "0A000"}}) {
        {
            auto db = sink();
            db.exec("TRUNCATE misbehave");
            db.exec("INSERT INTO misbehave VALUES ($1)", {how});
        }
        const auto mark = consumer.log().size();
        publish(3, applied);
        ASSERT_TRUE(eventually(
            [&] {
                const auto log = consumer.log().substr(mark);
                return log.find("configuration fault") != std::string::npos &&
                       log.find("SQLSTATE " + sqlstate) != std::string::npos;
            },
            20s))
            << how << "\n" << consumer.log();
        std::this_thread::sleep_for(500ms);  // many times --min-idle, --max-deliveries 1
        EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0) << how << "\n" << consumer.log();
        EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), applied) << how;
        {
            auto db = sink();
            db.exec("TRUNCATE misbehave");
        }
        applied += 3;
        ASSERT_TRUE(wait_applied(applied)) << how << "\n" << consumer.log();
    }
    EXPECT_TRUE(consumer.running()) << consumer.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);
}
