// Integration tests of parked keys (consume --on-failure park-key): a key
// whose event fails waits behind it, its later events parked in the
// consumer's database, while the other keys flow; once the failed event
// applies (on a retry, or after inbox_redrive) the key drains in order.
// With --on-failure skip, today's behaviour: the key goes on past its dead
// letter. Against real PostgreSQL and Redis, entries appended by hand.
#include <gtest/gtest.h>

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

const char* const kStream = "outbox:ledger";

class ParkTest : public RelayTest {
protected:
    void SetUp() override {
        RelayTest::SetUp();
        sink_ = pg_->create_database("sink");
        PgConnection db(sink_, "tests");
        db.exec("CREATE ROLE consumer_user LOGIN IN ROLE outbox_consumer");
        // The projection keeps the order of applies (seq); the handler
        // raises for an event marked "fail": "<bug>" while "broken" holds
        // that bug: deleting the row is the fix.
        db.exec("CREATE TABLE projection (seq bigserial PRIMARY KEY, event_id uuid, key text, n int)");
        db.exec("CREATE TABLE broken (why text)");
        db.exec("INSERT INTO broken VALUES ('bug')");
        db.exec(R"(CREATE FUNCTION apply_event(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
            RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM broken b WHERE b.why = payload->>'fail') THEN
                    RAISE EXCEPTION 'handler refuses event % of key %', payload->>'n', key;
                END IF;
                INSERT INTO projection (event_id, key, n) VALUES (event_id, key, (payload->>'n')::int);
            END $$)");
        db.exec("GRANT ALL ON projection, broken TO consumer_user");
        db.exec("GRANT USAGE ON SEQUENCE projection_seq_seq TO consumer_user");
        db.exec("SELECT inbox_consumer_create('accounting', 'consumer_user')");
    }

    Process& start_consumer(const std::vector<std::string>& extra) {
        std::vector<std::string> args{PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting",
                                      "--pg", pg_->conninfo("sink", "consumer_user"),
                                      "--redis", redis_->address(), "--worker", "w1", "--stream", kStream,
                                      "--handler", "SELECT apply_event($1, $2, $3, $4, $5)", "--block", "100ms",
                                      "--min-idle", "300ms", "--claim-interval", "100ms",
                                      "--retry-min", "20ms", "--retry-max", "300ms", "--log-level", "debug"};
        args.insert(args.end(), extra.begin(), extra.end());
        return start_process(args);
    }

    PgConnection sink() { return PgConnection(sink_, "tests"); }

    long long sink_count(const std::string& sql) {
        auto db = sink();
        return std::stoll(query_column(db, sql)[0]);
    }

    // Appends keys A, B and C interleaved, events 1 to n of each; A's
    // events in "fail" are marked with their bug.
    void append_interleaved(int n, const std::map<int, std::string>& fail) {
        auto redis = redis_->connect();
        auto pg = sink();
        for (int i = 1; i <= n; ++i) {
            for (const char* key : {"A", "B", "C"}) {
                const auto bug = std::string(key) == "A" ? fail.find(i) : fail.end();
                const std::string event_id = query_column(pg, "SELECT gen_random_uuid()::text")[0];
                const std::string payload = "{\"n\": " + std::to_string(i) +
                                            (bug != fail.end() ? ", \"fail\": \"" + bug->second + "\"}" : "}");
                auto r = redis.command({"XADD", kStream, "*", "event_id", event_id, "topic", "ledger", "key", key,
                                        "payload", payload});
                ASSERT_NE(r->type, REDIS_REPLY_ERROR) << reply_text(r.get());
            }
        }
    }

    // The n of a key's applied events, in the order they were applied.
    std::string applied(const std::string& key) {
        auto db = sink();
        std::string out;
        for (const auto& n : query_column(db, "SELECT n::text FROM projection WHERE key = '" + key + "' ORDER BY seq"))
            out += (out.empty() ? "" : " ") + n;
        return out;
    }

    long long pending() {
        auto redis = redis_->connect();
        auto r = redis.command({"XPENDING", kStream, "accounting"});
        return r->type == REDIS_REPLY_ARRAY ? r->element[0]->integer : -1;
    }

    // A series of the consumer's /metrics, -1 when absent; "extra"
    // labels follow the consumer's.
    static double metric(int port, const std::string& name, const std::string& extra = {}) {
        httplib::Client client("127.0.0.1", port);
        auto res = client.Get("/metrics");
        if (!res || res->status != 200) return -1;
        const std::string series =
            name + "{mode=\"consume\",consumer=\"accounting\",group=\"accounting\"" + extra + "} ";
        const auto at = res->body.find("\n" + series);
        if (at == std::string::npos) return -1;
        return std::stod(res->body.substr(at + series.size() + 1));
    }

    static std::pair<int, std::string> health(int port) {
        httplib::Client client("127.0.0.1", port);
        auto res = client.Get("/health");
        if (!res) return {0, ""};
        return {res->status, res->body};
    }

    std::string sink_;
};

}  // namespace

// A's third event fails until the fix. B and C are applied completely
// while A's later events are parked, never applied; A's event reaches
// --max-deliveries and is dead-lettered, A waits (dead). After the fix,
// inbox_redrive applies A's dead letter and then its parked events, in
// order, and un-parks A; the metrics follow.
TEST_F(ParkTest, KeyWaitsBehindItsFailedEventUntilRedriven) {
    const int port = free_port();
    auto& consumer = start_consumer({"--on-failure", "park-key", "--max-deliveries", "2", "--metrics-address",
                                     "127.0.0.1:" + std::to_string(port)});
    append_interleaved(5, {{3, "bug"}});
    ASSERT_TRUE(eventually([&] { return applied("B") == "1 2 3 4 5" && applied("C") == "1 2 3 4 5"; }, 30s))
        << consumer.log();
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.parked_keys WHERE key = 'A' AND state = 'dead'") == 1;
        },
        30s))
        << consumer.log();
    EXPECT_EQ(applied("A"), "1 2");
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_entries WHERE key = 'A'"), 2);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 1);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE key = 'A' AND replayed_at IS NULL"), 1);
    EXPECT_TRUE(eventually([&] { return pending() == 0; }, 10s)) << "the parked entries are acknowledged";
    EXPECT_TRUE(eventually([&] { return metric(port, "pg_outbox_relay_keys_parked") == 1; }, 10s));
    EXPECT_EQ(metric(port, "pg_outbox_relay_entries_parked_total"), 2);
    EXPECT_EQ(metric(port, "pg_outbox_relay_dead_letters_total"), 1);
    EXPECT_EQ(metric(port, "pg_outbox_relay_park_limit_reached"), 0);

    // The fix, then the redrive: asynchronous, the relay drains.
    sink().exec("DELETE FROM broken");
    auto db = sink();
    const auto result = query_column(db, "SELECT result FROM inbox_redrive('accounting', 'A')");
    ASSERT_EQ(result.size(), 1u);
    EXPECT_EQ(result[0], "requested");
    ASSERT_TRUE(eventually([&] { return applied("A") == "1 2 3 4 5"; }, 30s)) << applied("A") << consumer.log();
    EXPECT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.parked_keys") == 0; }, 10s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_entries"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE replayed_at IS NOT NULL"), 1);
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), 15);
    EXPECT_EQ(sink_count("SELECT count(DISTINCT event_id) FROM projection"), 15);
    EXPECT_TRUE(eventually([&] { return metric(port, "pg_outbox_relay_keys_parked") == 0; }, 10s));
    EXPECT_GE(metric(port, "pg_outbox_relay_entries_redriven_total"), 2);
    EXPECT_NE(consumer.log().find("un-parked"), std::string::npos) << consumer.log();
    // Nothing more for the relay to do: a second redrive is a no-op.
    EXPECT_EQ(query_column(db, "SELECT result FROM inbox_redrive('accounting', 'A')"),
              std::vector<std::string>{"not parked"});
}

// The fix lands before --max-deliveries: A's failed event applies on its
// retry and A's parked events drain by themselves, in order; nobody
// redrives, nothing is dead-lettered.
TEST_F(ParkTest, KeyDrainsByItselfWhenItsEventAppliesOnRetry) {
    auto& consumer = start_consumer({"--on-failure", "park-key", "--max-deliveries", "1000"});
    append_interleaved(5, {{3, "bug"}});
    ASSERT_TRUE(eventually([&] { return applied("B") == "1 2 3 4 5" && applied("C") == "1 2 3 4 5"; }, 30s))
        << consumer.log();
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.parked_entries WHERE key = 'A'") == 2 &&
                   sink_count("SELECT count(*) FROM outbox.parked_keys WHERE key = 'A' AND state = 'retrying'") == 1;
        },
        30s))
        << consumer.log();
    EXPECT_EQ(applied("A"), "1 2");
    sink().exec("DELETE FROM broken");
    ASSERT_TRUE(eventually([&] { return applied("A") == "1 2 3 4 5"; }, 30s)) << applied("A") << consumer.log();
    EXPECT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.parked_keys") == 0; }, 10s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_entries"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);
    EXPECT_TRUE(eventually([&] { return pending() == 0; }, 10s));
}

// --on-failure skip, today's behaviour: A's later events are applied
// while its failed event waits for its retries, which is then
// dead-lettered; nothing is parked.
TEST_F(ParkTest, SkipAppliesTheKeyPastItsFailedEvent) {
    auto& consumer = start_consumer({"--on-failure", "skip", "--max-deliveries", "2"});
    append_interleaved(5, {{3, "bug"}});
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 1; }, 30s))
        << consumer.log();
    EXPECT_TRUE(eventually([&] { return pending() == 0; }, 10s));
    EXPECT_EQ(applied("A"), "1 2 4 5");
    EXPECT_EQ(applied("B"), "1 2 3 4 5");
    EXPECT_EQ(applied("C"), "1 2 3 4 5");
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE key = 'A'"), 1);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_keys"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_entries"), 0);
}

// A consumer whose parked entries reach its park_limit (OB005) holds its
// batch: nothing of it is acknowledged, the gauge is 1 and /health fails
// saying why; raising the limit lets the batch through.
TEST_F(ParkTest, ParkLimitHoldsTheWorkerLoudlyUntilRaised) {
    sink().exec("UPDATE outbox.config SET park_limit = 1");
    const int port = free_port();
    auto& consumer = start_consumer({"--on-failure", "park-key", "--max-deliveries", "1000", "--metrics-address",
                                     "127.0.0.1:" + std::to_string(port)});
    append_interleaved(5, {{3, "bug"}});
    ASSERT_TRUE(eventually([&] { return metric(port, "pg_outbox_relay_park_limit_reached") == 1; }, 30s))
        << consumer.log();
    const auto [status, body] = health(port);
    EXPECT_EQ(status, 503);
    EXPECT_NE(body.find("park_limit"), std::string::npos) << body;
    EXPECT_GE(metric(port, "pg_outbox_relay_errors_total", ",kind=\"park_limit\""), 1);
    EXPECT_LE(sink_count("SELECT count(*) FROM outbox.parked_entries"), 1);
    EXPECT_NE(applied("A").find("1 2"), std::string::npos);
    EXPECT_EQ(applied("A").find('4'), std::string::npos) << "a later event of A applied before its failed one";
    EXPECT_GT(pending(), 0);

    sink().exec("UPDATE outbox.config SET park_limit = 100");
    ASSERT_TRUE(eventually([&] { return metric(port, "pg_outbox_relay_park_limit_reached") == 0; }, 30s))
        << consumer.log();
    EXPECT_TRUE(eventually([&] { return health(port).first == 200; }, 10s));
    EXPECT_TRUE(eventually([&] { return applied("B") == "1 2 3 4 5" && applied("C") == "1 2 3 4 5"; }, 30s));
    EXPECT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.parked_entries") == 2; }, 30s));
    EXPECT_EQ(applied("A"), "1 2");
    sink().exec("DELETE FROM broken");
    EXPECT_TRUE(eventually([&] { return applied("A") == "1 2 3 4 5"; }, 30s)) << consumer.log();
}

// A redrive that meets another failing event of the key: the events
// before it apply, it is retried after --min-idle and then becomes the
// key's dead letter, and the key waits again from it on; a second fix and
// redrive apply the rest, in order.
TEST_F(ParkTest, RedriveStopsAtTheNextFailingEvent) {
    sink().exec("INSERT INTO broken VALUES ('second bug')");
    auto& consumer = start_consumer({"--on-failure", "park-key", "--max-deliveries", "2"});
    append_interleaved(5, {{3, "bug"}, {4, "second bug"}});
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.parked_keys WHERE key = 'A' AND state = 'dead'") == 1 &&
                   applied("B") == "1 2 3 4 5" && applied("C") == "1 2 3 4 5";
        },
        30s))
        << consumer.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_entries"), 2);
    sink().exec("DELETE FROM broken WHERE why = 'bug'");
    auto db = sink();
    EXPECT_EQ(query_column(db, "SELECT result FROM inbox_redrive('accounting', 'A')"),
              std::vector<std::string>{"requested"});
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.dead_letters") == 2 &&
                   sink_count("SELECT count(*) FROM outbox.parked_keys WHERE state = 'dead'") == 1;
        },
        30s))
        << consumer.log();
    EXPECT_EQ(applied("A"), "1 2 3");
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_entries"), 1);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE replayed_at IS NOT NULL"), 1);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_keys k JOIN outbox.dead_letters d "
                         "ON d.id = k.dead_letter_id WHERE d.reason LIKE '%event 4 of key A%'"),
              1);
    sink().exec("DELETE FROM broken");
    EXPECT_EQ(query_column(db, "SELECT result FROM inbox_redrive('accounting', 'A')"),
              std::vector<std::string>{"requested"});
    ASSERT_TRUE(eventually([&] { return applied("A") == "1 2 3 4 5"; }, 30s)) << applied("A") << consumer.log();
    EXPECT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.parked_keys") == 0; }, 10s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE replayed_at IS NULL"), 0);
}

// inbox_skip gives the dead letter up, recording who and when, and the
// key's parked events apply without it, in order.
TEST_F(ParkTest, SkipGivesUpTheDeadLetterAndAppliesTheRest) {
    auto& consumer = start_consumer({"--on-failure", "park-key", "--max-deliveries", "1"});
    append_interleaved(5, {{3, "bug"}});
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.parked_keys WHERE key = 'A' AND state = 'dead'") == 1 &&
                   sink_count("SELECT count(*) FROM outbox.parked_entries") == 2;
        },
        30s))
        << consumer.log();
    auto db = sink();
    EXPECT_EQ(query_column(db, "SELECT result FROM inbox_skip('accounting', 'A')"),
              std::vector<std::string>{"skipped"});
    ASSERT_TRUE(eventually([&] { return applied("A") == "1 2 4 5"; }, 30s)) << applied("A") << consumer.log();
    EXPECT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.parked_keys") == 0; }, 10s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE skipped_at IS NOT NULL AND skipped_by = "
                         "session_user AND replayed_at IS NULL"),
              1);
    EXPECT_EQ(applied("B"), "1 2 3 4 5");
    EXPECT_EQ(applied("C"), "1 2 3 4 5");
}

// An event that meets a configuration fault (here the handler's 42501)
// inside a batch applied entry by entry is held and retried; the later
// events of its key are held behind it, in its part and in the later
// parts of the batch, never applied before it, while the other keys
// apply. Once the fault is gone, the key applies in order.
TEST_F(ParkTest, ConfigurationFaultHoldsTheLaterEventsOfItsKey) {
    sink().exec(R"(CREATE OR REPLACE FUNCTION apply_event(topic text, key text, payload jsonb, headers jsonb,
                                                          event_id uuid)
        RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM broken b WHERE b.why = payload->>'fail') THEN
                RAISE EXCEPTION 'permission denied for event % of key %', payload->>'n', key
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
            INSERT INTO projection (event_id, key, n) VALUES (event_id, key, (payload->>'n')::int);
        END $$)");
    // 90 entries, appended before the worker starts so that it reads them
    // as one batch, applied again in parts of 64 and 26. (A worker held by
    // a configuration fault reads nothing new: entries appended while it
    // reads would wait behind the fault, whatever their key.)
    append_interleaved(30, {{2, "bug"}});
    auto& consumer = start_consumer({"--on-failure", "park-key", "--batch-size", "200"});
    std::string all;
    for (int i = 1; i <= 30; ++i) all += (i > 1 ? " " : "") + std::to_string(i);
    ASSERT_TRUE(eventually([&] { return applied("B") == all && applied("C") == all; }, 30s)) << consumer.log();
    ASSERT_TRUE(eventually(
        [&] { return consumer.log().find("configuration fault") != std::string::npos; }, 10s))
        << consumer.log();
    EXPECT_EQ(applied("A"), "1") << "a later event of A applied before its held one";
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_keys"), 0) << "a configuration fault parks nothing";
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 0);
    sink().exec("DELETE FROM broken");
    ASSERT_TRUE(eventually([&] { return applied("A") == all; }, 30s)) << applied("A") << consumer.log();
    EXPECT_TRUE(eventually([&] { return pending() == 0; }, 10s));
}

// Hostile keys: a key of 1 MB and a key of every byte from 0x01 to 0x7f
// (control characters included) park, are listed by inbox_parked_keys()
// with their exact bytes, and redrive by their exact text, in order; the
// worker's own log lines show 64 bytes of a key.
TEST_F(ParkTest, HugeAndControlCharacterKeysParkAndRedrive) {
    std::string control_bytes;
    for (int c = 1; c < 0x80; ++c) control_bytes.push_back(static_cast<char>(c));
    const std::string huge(1u << 20, 'k');
    const std::string control = control_bytes;
    const std::vector<const std::string*> keys{&huge, &control};
    auto& consumer = start_consumer({"--on-failure", "park-key", "--max-deliveries", "1"});
    {
        auto redis = redis_->connect();
        auto pg = sink();
        for (int i = 1; i <= 3; ++i)
            for (const auto* key : keys) {
                const std::string event_id = query_column(pg, "SELECT gen_random_uuid()::text")[0];
                const std::string payload =
                    "{\"n\": " + std::to_string(i) + (i == 2 ? ", \"fail\": \"bug\"}" : "}");
                auto r = redis.command({"XADD", kStream, "*", "event_id", event_id, "topic", "ledger", "key", *key,
                                        "payload", payload});
                ASSERT_NE(r->type, REDIS_REPLY_ERROR) << reply_text(r.get());
            }
    }
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.parked_keys WHERE state = 'dead'") == 2 &&
                   sink_count("SELECT count(*) FROM outbox.parked_entries") == 2;
        },
        30s))
        << consumer.log().substr(0, 20000);
    auto db = sink();
    for (const auto* key : keys) {
        EXPECT_EQ(query_column(db, "SELECT count(*)::text FROM inbox_parked_keys('accounting') WHERE key = $1 AND "
                                   "key_bytes = convert_to($1, 'UTF8')",
                               {Param(*key)}),
                  std::vector<std::string>{"1"});
        EXPECT_EQ(query_column(db, "SELECT string_agg(n::text, ' ' ORDER BY seq) FROM projection WHERE key = $1",
                               {Param(*key)}),
                  std::vector<std::string>{"1"});
    }
    // The relay's own lines show the first 64 bytes of the huge key (the
    // handler's error message is the handler's).
    EXPECT_NE(consumer.log().find(std::string(64, 'k') + "\" (1 MiB)"), std::string::npos);
    db.exec("DELETE FROM broken");
    for (const auto* key : keys)
        EXPECT_EQ(query_column(db, "SELECT result FROM inbox_redrive('accounting', $1)", {Param(*key)}),
                  std::vector<std::string>{"requested"});
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.parked_keys") == 0; }, 30s))
        << consumer.log().substr(0, 20000);
    for (const auto* key : keys)
        EXPECT_EQ(query_column(db, "SELECT string_agg(n::text, ' ' ORDER BY seq) FROM projection WHERE key = $1",
                               {Param(*key)}),
                  std::vector<std::string>{"1 2 3"});
}

namespace {

// A UUID of its own for the n-th event a test writes by itself (the
// inbox keys on event ids): no round trip to PostgreSQL per event.
std::string test_event_id(unsigned tag, unsigned long long n) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%08x-0000-4000-8000-%012llx", tag, n);
    return buf;
}

// "from to": the numbers from..to separated by spaces, as applied() gives them.
std::string numbers(int from, int to) {
    std::string out;
    for (int i = from; i <= to; ++i) out += (i > from ? " " : "") + std::to_string(i);
    return out;
}

// The worker's resident set, in kB, from /proc; -1 when unreadable.
long long resident_kb(pid_t pid) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(status, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
    return -1;
}

}  // namespace

// A key whose redrive is under way receives new events meanwhile (and so
// does another key): the new events of A are parked behind the drain, or
// applied once the key is un-parked, never before an earlier one; at the
// end every event of A is applied exactly once, in stream order, A is
// un-parked and B is complete.
TEST_F(ParkTest, NewEventsDuringTheRedriveApplyOnceInOrder) {
    auto& consumer = start_consumer({"--on-failure", "park-key", "--max-deliveries", "1", "--batch-size", "50"});
    append_interleaved(200, {{3, "bug"}});
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.parked_keys WHERE key = 'A' AND state = 'dead'") == 1 &&
                   sink_count("SELECT count(*) FROM outbox.parked_entries WHERE key = 'A'") == 197 &&
                   applied("B") == numbers(1, 200);
        },
        60s))
        << consumer.log().substr(0, 20000);
    EXPECT_EQ(applied("A"), "1 2");
    sink().exec("DELETE FROM broken");

    // A writer appends events 201 to 600 of A and of B, one pair every few
    // milliseconds, from before the redrive (these park behind the dead
    // head) through the drain until after it (these apply as they come).
    std::atomic<bool> started{false};
    std::string writer_error;
    std::thread writer([&] {
        try {
            auto redis = redis_->connect();
            for (int i = 201; i <= 600; ++i) {
                for (const char* key : {"A", "B"}) {
                    const std::string payload = "{\"n\": " + std::to_string(i) + "}";
                    redis.command({"XADD", kStream, "*", "event_id",
                                   test_event_id(key[0] == 'A' ? 0xa : 0xb, static_cast<unsigned long long>(i)),
                                   "topic", "ledger", "key", key, "payload", payload});
                }
                if (i == 250) started = true;
                std::this_thread::sleep_for(3ms);
            }
        } catch (const std::exception& e) {
            writer_error = e.what();
        }
        started = true;
    });
    while (!started) std::this_thread::sleep_for(1ms);
    auto db = sink();
    const auto result = query_column(db, "SELECT result FROM inbox_redrive('accounting', 'A')");
    writer.join();
    ASSERT_EQ(writer_error, "");
    EXPECT_EQ(result, std::vector<std::string>{"requested"});
    ASSERT_TRUE(eventually([&] { return applied("A") == numbers(1, 600); }, 60s))
        << applied("A") << consumer.log().substr(0, 20000);
    EXPECT_TRUE(eventually([&] { return applied("B") == numbers(1, 600); }, 30s)) << applied("B");
    EXPECT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM inbox_parked_keys('accounting')") == 0; },
                           30s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_entries"), 0);
    EXPECT_EQ(applied("C"), numbers(1, 200));
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), 1400);
    EXPECT_EQ(sink_count("SELECT count(DISTINCT event_id) FROM projection"), 1400);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE replayed_at IS NULL"), 0);
    EXPECT_TRUE(eventually([&] { return pending() == 0; }, 10s));
}

// Hostile: 100,000 entries of one key parked behind its dead head, then
// redriven. All apply exactly once, in order; the drain goes in steps of
// at most 64 entries, each its own transaction (the handler's rows carry
// their transaction's id), and the worker's memory does not grow with the
// number of parked entries.
TEST_F(ParkTest, HundredThousandParkedEntriesOfOneKeyDrainInOrder) {
    constexpr int kParked = 100000;
    const auto started = std::chrono::steady_clock::now();
    sink().exec("ALTER TABLE projection ADD COLUMN tx bigint DEFAULT txid_current()");
    auto& consumer = start_consumer({"--on-failure", "park-key", "--max-deliveries", "1", "--batch-size", "1000",
                                     "--log-level", "info"});
    {
        auto redis = redis_->connect();
        // Event 1 fails (the head, dead at once); 2 to 100,001 park.
        constexpr int kPipeline = 1000;
        for (int from = 1; from <= kParked + 1; from += kPipeline) {
            const int to = std::min(from + kPipeline - 1, kParked + 1);
            for (int i = from; i <= to; ++i) {
                const std::string payload =
                    "{\"n\": " + std::to_string(i) + (i == 1 ? ", \"fail\": \"bug\"}" : "}");
                const std::string event_id = test_event_id(0xa, static_cast<unsigned long long>(i));
                redis.append({"XADD", kStream, "*", "event_id", event_id, "topic", "ledger", "key", "A", "payload",
                              payload});
            }
            auto replies = redis.read_replies(static_cast<std::size_t>(to - from + 1));
            for (std::size_t r = 0; r < replies.size(); ++r)
                ASSERT_NE(replies.raw(r).type, REDIS_REPLY_ERROR) << reply_text(&replies.raw(r));
        }
    }
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.parked_entries WHERE key = 'A'") == kParked &&
                   sink_count("SELECT count(*) FROM outbox.parked_keys WHERE key = 'A' AND state = 'dead'") == 1;
        },
        300s, 500ms))
        << consumer.log().substr(0, 20000);
    EXPECT_TRUE(eventually([&] { return pending() == 0; }, 30s));
    const auto parked_at = std::chrono::steady_clock::now();
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), 0);
    const long long rss_before = resident_kb(consumer.pid());
    ASSERT_GT(rss_before, 0);

    sink().exec("DELETE FROM broken");
    auto db = sink();
    EXPECT_EQ(query_column(db, "SELECT result FROM inbox_redrive('accounting', 'A')"),
              std::vector<std::string>{"requested"});
    long long rss_peak = rss_before;
    ASSERT_TRUE(eventually(
        [&] {
            rss_peak = std::max(rss_peak, resident_kb(consumer.pid()));
            return sink_count("SELECT count(*) FROM projection") == kParked + 1;
        },
        600s, 500ms))
        << consumer.log().substr(0, 20000);
    const auto drained_at = std::chrono::steady_clock::now();
    EXPECT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.parked_keys") == 0; }, 30s));
    rss_peak = std::max(rss_peak, resident_kb(consumer.pid()));

    // In order, each event exactly once.
    EXPECT_EQ(sink_count("SELECT count(DISTINCT event_id) FROM projection"), kParked + 1);
    EXPECT_EQ(sink_count("SELECT count(*) FROM (SELECT n, row_number() OVER (ORDER BY seq) AS r FROM projection) p "
                         "WHERE n <> r"),
              0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_entries"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE replayed_at IS NULL"), 0);
    // No transaction applied more than 64 entries.
    EXPECT_LE(sink_count("SELECT max(c) FROM (SELECT count(*) AS c FROM projection GROUP BY tx) t"), 64);
    EXPECT_GE(sink_count("SELECT count(DISTINCT tx) FROM projection"), (kParked + 63) / 64);
    // The drain reads about the entries it applies, not every entry still
    // parked at each step (a drain quadratic in the entries parked): the
    // index tuples read from parked_entries, once the statistics of its
    // deletes are in, are a few per entry.
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT n_tup_del FROM pg_stat_user_tables "
                              "WHERE relid = 'outbox.parked_entries'::regclass") >= kParked;
        },
        30s));
    const long long index_reads = sink_count(
        "SELECT sum(idx_tup_read)::bigint FROM pg_stat_user_indexes WHERE relid = 'outbox.parked_entries'::regclass");
    EXPECT_LT(index_reads, 10LL * kParked);
    // Bounded memory: a generous bound, far below what holding the parked
    // entries would take.
    EXPECT_LT(rss_peak, 200 * 1024) << "VmRSS before the redrive: " << rss_before << " kB";
    const auto seconds = [](auto d) { return std::chrono::duration<double>(d).count(); };
    std::printf("[ info ] 100,000 parked: parked in %.1f s, drained in %.1f s; VmRSS %lld kB before, peak %lld kB; "
                "%lld index tuples read from parked_entries\n",
                seconds(parked_at - started), seconds(drained_at - parked_at), rss_before, rss_peak, index_reads);
}

// inbox_redrive and inbox_skip are role-checked: a role that does not own
// the consumer gets 42501 and changes nothing. A key that is not parked
// gives one row, 'not parked', from both: a no-op, not an error.
TEST_F(ParkTest, RedriveByAnotherRoleIsRefusedAndNotParkedIsANoOp) {
    {
        PgConnection db(sink_, "tests");
        db.exec("CREATE ROLE other_user LOGIN IN ROLE outbox_consumer");
        db.exec("CREATE ROLE other_owner");
        db.exec("SELECT inbox_consumer_create('billing', 'other_owner')");
        db.exec("GRANT other_owner TO other_user");
    }
    auto& consumer = start_consumer({"--on-failure", "park-key", "--max-deliveries", "1"});
    append_interleaved(5, {{3, "bug"}});
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.parked_keys WHERE key = 'A' AND state = 'dead'") == 1 &&
                   sink_count("SELECT count(*) FROM outbox.parked_entries") == 2;
        },
        30s))
        << consumer.log();
    sink().exec("DELETE FROM broken");
    const std::string state_sql =
        "SELECT concat_ws(' ', k.state, k.parked, k.redrive_requested_at IS NULL, d.replayed_at IS NULL, "
        "d.skipped_at IS NULL) FROM outbox.parked_keys k JOIN outbox.dead_letters d ON d.id = k.dead_letter_id "
        "WHERE k.key = 'A'";
    auto db = sink();
    const auto before = query_column(db, state_sql);
    ASSERT_EQ(before, std::vector<std::string>{"dead 2 t t t"});

    PgConnection other(pg_->conninfo("sink", "other_user"), "tests");
    for (const std::string sql :
         {"SELECT * FROM inbox_redrive('accounting', 'A')", "SELECT * FROM inbox_redrive('accounting', 'A', $1)",
          "SELECT * FROM inbox_skip('accounting', 'A')", "SELECT * FROM inbox_skip('accounting', 'A', $1)"}) {
        try {
            if (sql.find("$1") != std::string::npos)
                other.exec(sql, {kStream});
            else
                other.exec(sql);
            ADD_FAILURE() << sql << " by a role that does not own the consumer succeeded";
        } catch (const PgError& e) {
            EXPECT_EQ(e.sqlstate(), "42501") << sql << ": " << e.what();
        }
    }
    // It owns billing: its own consumer answers, and A is parked nowhere there.
    EXPECT_EQ(query_column(other, "SELECT result FROM inbox_redrive('billing', 'A')"),
              std::vector<std::string>{"not parked"});
    std::this_thread::sleep_for(500ms);  // The relay would drain a key set draining by now.
    EXPECT_EQ(query_column(db, state_sql), before);
    EXPECT_EQ(applied("A"), "1 2");

    // Keys parked nowhere: B (flowing), an unknown key, and A on another stream.
    for (const std::string fn : {"inbox_redrive", "inbox_skip"}) {
        for (const std::string key : {"B", "nobody"}) {
            const auto r = db.exec("SELECT stream IS NULL, state IS NULL, parked, result FROM " + fn +
                                       "('accounting', $1)",
                                   {key});
            ASSERT_EQ(r.rows(), 1) << fn << " " << key;
            EXPECT_EQ(std::string(r.get(0, 0)) + " " + std::string(r.get(0, 1)) + " " + std::string(r.get(0, 2)) +
                          " " + std::string(r.get(0, 3)),
                      "t t 0 not parked")
                << fn << " " << key;
        }
        const auto r = db.exec("SELECT stream, result FROM " + fn + "('accounting', 'A', 'outbox:elsewhere')");
        ASSERT_EQ(r.rows(), 1) << fn;
        EXPECT_EQ(std::string(r.get(0, 0)) + " " + std::string(r.get(0, 1)), "outbox:elsewhere not parked") << fn;
    }
    EXPECT_EQ(query_column(db, state_sql), before);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_keys"), 1);

    // The owner's role redrives.
    PgConnection owner(pg_->conninfo("sink", "consumer_user"), "tests");
    EXPECT_EQ(query_column(owner, "SELECT result FROM inbox_redrive('accounting', 'A')"),
              std::vector<std::string>{"requested"});
    ASSERT_TRUE(eventually([&] { return applied("A") == "1 2 3 4 5"; }, 30s)) << consumer.log();
}

// Entries that park nothing: a keyless entry whose handler fails is
// retried and dead-lettered alone after --max-deliveries; an entry whose
// key is not valid UTF-8 is malformed, dead-lettered alone at once. No
// key is parked, and the other keys (and the later keyless entries) flow.
TEST_F(ParkTest, KeylessAndMalformedEntriesNeverPark) {
    auto& consumer = start_consumer({"--on-failure", "park-key", "--max-deliveries", "2"});
    {
        auto redis = redis_->connect();
        unsigned long long n = 0;
        const auto add = [&](const char* key, int i, bool fail) {
            std::vector<std::string> argv{"XADD", kStream, "*", "event_id", test_event_id(0xc, ++n), "topic",
                                          "ledger"};
            if (key != nullptr) {
                argv.emplace_back("key");
                argv.emplace_back(key);
            }
            argv.emplace_back("payload");
            argv.emplace_back("{\"n\": " + std::to_string(i) + (fail ? ", \"fail\": \"bug\"}" : "}"));
            std::vector<std::string_view> views(argv.begin(), argv.end());
            auto r = redis.command(views);
            ASSERT_NE(r->type, REDIS_REPLY_ERROR) << reply_text(r.get());
        };
        for (int i = 1; i <= 5; ++i) {
            add(nullptr, i, i == 2);    // keyless: its second event fails
            add("\xff\xfe", i, false);  // not UTF-8: malformed, every one
            add("B", i, false);
            add("C", i, false);
        }
    }
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == 6; }, 30s))
        << consumer.log();
    EXPECT_TRUE(eventually([&] { return pending() == 0; }, 10s));
    EXPECT_EQ(applied("B"), "1 2 3 4 5");
    EXPECT_EQ(applied("C"), "1 2 3 4 5");
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection WHERE key IS NULL"), 4);
    EXPECT_EQ(sink_count("SELECT (string_agg(n::text, ' ' ORDER BY seq) = '1 3 4 5')::int FROM projection "
                         "WHERE key IS NULL"),
              1);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_keys"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_entries"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM inbox_parked_keys('accounting')"), 0);
    // The keyless one after its deliveries, the handler's error; the
    // others malformed, at once.
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE key IS NULL AND deliveries = 2 "
                         "AND reason LIKE '%handler refuses event 2%'"),
              1);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE reason LIKE 'malformed entry:%' "
                         "AND deliveries = 1"),
              5);
    EXPECT_NE(consumer.log().find("is malformed"), std::string::npos);
}

// A gap parks nothing: entries carrying "prev" (as the relay writes them),
// keys A, B and C interleaved, A's second event failing and dead-lettered
// at once, and B's fourth entry deleted before the group read it. The gap
// is reported as always (one dead letter for the range, keyless) and B
// goes on past it, unparked; A's events after the gap still park behind
// its dead letter, and drain in order once redriven.
TEST_F(ParkTest, GapParksNothingAndTheParkedKeyStaysParkedPastIt) {
    std::vector<std::string> ids;
    {
        auto redis = redis_->connect();
        auto pg = sink();
        std::string prev = "0-0";
        for (int i = 1; i <= 5; ++i)
            for (const char* key : {"A", "B", "C"}) {
                const std::string id = std::to_string(ids.size() + 1) + "-1";
                const std::string event_id = query_column(pg, "SELECT gen_random_uuid()::text")[0];
                const std::string fail = std::string(key) == "A" && i == 2 ? ", \"fail\": \"bug\"" : "";
                auto r = redis.command({"XADD", kStream, id, "event_id", event_id, "topic", "ledger", "key", key,
                                        "payload", "{\"n\": " + std::to_string(i) + fail + "}", "prev", prev});
                ASSERT_NE(r->type, REDIS_REPLY_ERROR) << reply_text(r.get());
                ids.push_back(id);
                prev = id;
            }
        // B's fourth event: the 11th entry (A4 is the 10th).
        auto r = redis.command({"XDEL", kStream, ids[10]});
        ASSERT_EQ(r->integer, 1);
    }
    auto& consumer = start_consumer({"--on-failure", "park-key", "--max-deliveries", "1"});
    ASSERT_TRUE(eventually([&] { return applied("B") == "1 2 3 5" && applied("C") == "1 2 3 4 5"; }, 30s))
        << consumer.log();
    ASSERT_TRUE(eventually(
        [&] { return sink_count("SELECT count(*) FROM outbox.parked_entries WHERE key = 'A'") == 3; }, 30s))
        << consumer.log();
    EXPECT_EQ(applied("A"), "1");
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_keys"), 1) << "only A is parked";
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_keys WHERE key = 'A' AND state = 'dead'"), 1);
    const std::string range = "(" + ids[9] + " " + ids[10] + "]";
    EXPECT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.dead_letters WHERE entry_id = '" + range +
                              "' AND key IS NULL AND fields IS NULL") == 1;
        },
        10s))
        << consumer.log();
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters"), 2) << "A's event and the gap";
    EXPECT_NE(consumer.log().find("gap " + range), std::string::npos) << consumer.log();
    EXPECT_TRUE(eventually([&] { return pending() == 0; }, 10s));

    sink().exec("DELETE FROM broken");
    auto db = sink();
    EXPECT_EQ(query_column(db, "SELECT result FROM inbox_redrive('accounting', 'A')"),
              std::vector<std::string>{"requested"});
    ASSERT_TRUE(eventually([&] { return applied("A") == "1 2 3 4 5"; }, 30s)) << applied("A") << consumer.log();
    EXPECT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.parked_keys") == 0; }, 10s));
    EXPECT_EQ(applied("B"), "1 2 3 5") << "the gap's event is not applied by the redrive of another key";
}
