// Integration tests of publish mode against real PostgreSQL and Redis.
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include <httplib.h>

#include "fixture.hpp"
#include "pg_outbox/event.hpp"
#include "pg_outbox/position.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

class PublishTest : public RelayTest {
protected:
    // Every committed event, by topic, in feed order.
    std::map<std::string, std::vector<std::string>> committed() {
        auto pg = connect();
        auto r = pg.exec("SELECT topic, event_id, txid::text || '-' || seq FROM outbox.event ORDER BY txid, seq");
        std::map<std::string, std::vector<std::string>> out;
        for (int i = 0; i < r.rows(); ++i) out[std::string(r.get(i, 0))].emplace_back(r.get(i, 1));
        return out;
    }

    // Each stream holds exactly its topic's committed events, once each, in
    // feed order, with the position as entry id.
    void expect_exactly_once_in_order() {
        auto redis = redis_->connect();
        const auto want = committed();
        std::size_t total = 0;
        for (const auto& t : kTopics) {
            const auto entries = read_stream(redis, "outbox:" + t);
            std::vector<std::string> got;
            std::string prev = "0-0";  // each entry names the one before it in its stream
            for (const auto& e : entries) {
                got.push_back(e.fields.at("event_id"));
                EXPECT_EQ(e.id, e.fields.at("position"));
                EXPECT_EQ(e.fields.at("topic"), t);
                EXPECT_EQ(e.fields.count("prev") ? e.fields.at("prev") : "(none)", prev) << e.id;
                prev = e.id;
            }
            total += got.size();
            const auto it = want.find(t);
            const std::vector<std::string> expected = it == want.end() ? std::vector<std::string>{} : it->second;
            EXPECT_EQ(got, expected) << "stream outbox:" << t;
        }
        std::size_t want_total = 0;
        for (const auto& [t, ids] : want) want_total += ids.size();
        EXPECT_EQ(total, want_total);
    }

    std::string cursor() {
        auto pg = connect();
        return query_column(pg, "SELECT cursor_txid || '-' || cursor_seq FROM outbox.groups WHERE name = 'g'")[0];
    }

    // Each stream holds a prefix of its topic's committed events, in feed
    // order, then only entries in "foreign" (event ids); every event at or
    // below the cursor is there: nothing was skipped.
    void expect_prefixes_up_to_the_cursor(const std::set<std::string>& foreign = {}) {
        auto redis = redis_->connect();
        auto pg = connect();
        const auto at = *Position::parse(cursor());
        auto r = pg.exec("SELECT topic, event_id, txid::text || '-' || seq FROM outbox.event ORDER BY txid, seq");
        std::map<std::string, std::vector<std::string>> want, below_cursor;
        for (int i = 0; i < r.rows(); ++i) {
            const std::string topic(r.get(i, 0));
            want[topic].emplace_back(r.get(i, 1));
            if (*Position::parse(r.get(i, 2)) <= at) below_cursor[topic].emplace_back(r.get(i, 1));
        }
        for (const auto& t : kTopics) {
            std::vector<std::string> ours;
            bool foreign_seen = false;
            for (const auto& e : read_stream(redis, "outbox:" + t)) {
                if (foreign.count(e.fields.at("event_id"))) {
                    foreign_seen = true;
                    continue;
                }
                EXPECT_FALSE(foreign_seen) << "an entry of the relay after a foreign one in outbox:" << t;
                ours.push_back(e.fields.at("event_id"));
            }
            const auto& all = want[t];
            ASSERT_LE(ours.size(), all.size()) << "outbox:" << t;
            EXPECT_EQ(ours, std::vector<std::string>(all.begin(), all.begin() + ours.size())) << "outbox:" << t;
            EXPECT_GE(ours.size(), below_cursor[t].size()) << "the cursor passed unpublished events of " << t;
        }
    }

    // A counter of the relay's /metrics ("name{labels}"), -1 when absent.
    static double metric(httplib::Client& client, const std::string& series) {
        auto res = client.Get("/metrics");
        if (!res || res->status != 200) return -1;
        const auto at = res->body.find("\n" + series + " ");
        if (at == std::string::npos) return -1;
        return std::stod(res->body.substr(at + series.size() + 2));
    }

    static std::string series(const std::string& name, const std::string& extra = "") {
        return name + "{mode=\"publish\",group=\"g\"" + extra + "}";
    }

    // Stops a writer() thread when a test ends, also by a failed assertion.
    struct WriterStop {
        std::atomic<bool>& done;
        std::thread& w;
        ~WriterStop() {
            done = true;
            if (w.joinable()) w.join();
        }
    };

    // Emits transactions of 5 events on rotating topics until "done", at
    // most one every 5 ms, so that the relay keeps up.
    std::thread writer(std::atomic<bool>& done) {
        return std::thread([this, &done] {
            auto pg = connect();
            for (int i = 0; !done; ++i) {
                pg.exec("SELECT count(*) FROM outbox_emit_many($1, NULL, array_fill('{\"x\": 1}'::jsonb, ARRAY[5]))",
                        {kTopics[i % kTopics.size()]});
                std::this_thread::sleep_for(5ms);
            }
        });
    }
};

}  // namespace

// 8 concurrent writers with aborted transactions and rolled-back savepoints:
// every committed event reaches its stream exactly once, in feed order, and
// nothing else does.
TEST_F(PublishTest, ConcurrentWritersExactlyOnceInFeedOrder) {
    start_relay();
    std::vector<std::thread> writers;
    std::atomic<int> aborted{0};
    for (int w = 0; w < 8; ++w) {
        writers.emplace_back([&, w] {
            auto pg = connect();
            std::mt19937 rng(w);
            for (int t = 0; t < 150; ++t) {
                pg.exec("BEGIN");
                const int n = 1 + static_cast<int>(rng() % 3);
                for (int i = 0; i < n; ++i)
                    pg.exec("SELECT outbox_emit($1, $2, '{\"w\": 1}')",
                            {kTopics[rng() % kTopics.size()], "w" + std::to_string(w)});
                if (rng() % 10 == 0) {
                    pg.exec("SAVEPOINT s");
                    pg.exec("SELECT outbox_emit('orders', 'never', '{\"rolled_back\": true}')");
                    pg.exec("ROLLBACK TO SAVEPOINT s");
                }
                if (rng() % 10 == 0) {
                    pg.exec("ROLLBACK");
                    ++aborted;
                } else {
                    pg.exec("COMMIT");
                }
            }
        });
    }
    for (auto& t : writers) t.join();
    ASSERT_TRUE(wait_all_published());
    expect_exactly_once_in_order();
    EXPECT_GT(aborted.load(), 0);
    auto redis = redis_->connect();
    for (const auto& e : read_stream(redis, "outbox:orders")) EXPECT_NE(e.fields.at("key"), "never");
}

// The relay published a batch to Redis but could not advance the cursor
// (here: it lost the privilege, and exited). Restarted, it publishes the
// same events again; Redis refuses them as present: no loss, no duplicate.
TEST_F(PublishTest, CrashBetweenXaddAndAdvanceDuplicatesNothing) {
    emit(250);
    {
        auto pg = connect();
        pg.exec("REVOKE EXECUTE ON FUNCTION outbox_advance(text, text, jsonb) FROM outbox_relay");
    }
    auto& first = start_relay();
    EXPECT_EQ(first.wait(30s), 1) << first.log();
    EXPECT_GT(published_count(), 0u);
    EXPECT_EQ(cursor(), "0-0");
    {
        auto pg = connect();
        pg.exec("GRANT EXECUTE ON FUNCTION outbox_advance(text, text, jsonb) TO outbox_relay");
    }
    auto& second = start_relay();
    ASSERT_TRUE(wait_all_published());
    ASSERT_TRUE(eventually([&] { return second.log().find("already in Redis") != std::string::npos; }, 10s));
    expect_exactly_once_in_order();
}

// SIGKILL at random moments while writers write: after the last restart
// every event is in Redis exactly once.
TEST_F(PublishTest, SigkillAtAnyMomentLosesAndDuplicatesNothing) {
    std::atomic<bool> done{false};
    std::thread writer([&] {
        auto pg = connect();
        for (int i = 0; !done; ++i)
            pg.exec("SELECT count(*) FROM outbox_emit_many($1, NULL, array_fill('{\"x\": 1}'::jsonb, ARRAY[5]))",
                    {kTopics[i % kTopics.size()]});
    });
    std::mt19937 rng(42);
    for (int k = 0; k < 6; ++k) {
        auto& relay = start_relay();
        std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 400));
        relay.signal(SIGKILL);
        relay.wait();
    }
    done = true;
    writer.join();
    auto& last = start_relay();
    ASSERT_TRUE(wait_all_published()) << last.log();
    expect_exactly_once_in_order();
}

// SIGTERM finishes the current batch and exits 0.
TEST_F(PublishTest, SigtermExitsCleanly) {
    emit(30);
    auto& relay = start_relay();
    ASSERT_TRUE(wait_all_published());
    relay.signal(SIGTERM);
    EXPECT_EQ(relay.wait(10s), 0) << relay.log();
    EXPECT_NE(relay.log().find("resigned"), std::string::npos);
}

// Redis down for 10 seconds: the relay retries and drains afterwards.
TEST_F(PublishTest, RedisDownThenDrains) {
    TearDown();
    start_servers(true);  // AOF, fsync always: the restart keeps what was acknowledged
    auto& relay = start_relay();
    emit(60);
    ASSERT_TRUE(wait_all_published());
    redis_->stop();
    emit(60);
    std::this_thread::sleep_for(10s);
    EXPECT_TRUE(relay.running());
    redis_->start();
    ASSERT_TRUE(wait_all_published());
    expect_exactly_once_in_order();
    EXPECT_NE(relay.log().find("Redis"), std::string::npos);
}

// PostgreSQL restarted: the relay reconnects and resumes.
TEST_F(PublishTest, PostgresRestartResumes) {
    auto& relay = start_relay();
    emit(60);
    ASSERT_TRUE(wait_all_published());
    pg_->restart();
    emit(60);
    ASSERT_TRUE(wait_all_published());
    expect_exactly_once_in_order();
    EXPECT_TRUE(relay.running());
}

// FLUSHALL: the relay notices and republishes everything from the outbox.
TEST_F(PublishTest, FlushallRepublishesFromTheOutbox) {
    auto& relay = start_relay();
    emit(90);
    ASSERT_TRUE(wait_all_published());
    {
        auto redis = redis_->connect();
        redis.command({"FLUSHALL"});
    }
    emit(9);
    ASSERT_TRUE(wait_all_published()) << relay.log();
    expect_exactly_once_in_order();
    EXPECT_NE(relay.log().find("is behind"), std::string::npos) << relay.log();
}

// A stream whose tail was lost (Redis restarted without its last writes):
// the group rewinds and the missing entries come back.
TEST_F(PublishTest, StreamBehindCursorIsRepublished) {
    auto& relay = start_relay();
    emit(90);
    ASSERT_TRUE(wait_all_published());
    {
        // Simulate the lost tail: recreate the stream with its first 10 entries only.
        auto redis = redis_->connect();
        auto entries = read_stream(redis, "outbox:orders");
        redis.command({"DEL", "outbox:orders"});
        for (int i = 0; i < 10; ++i) {
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
    expect_exactly_once_in_order();
}

// Two relays on one group: one publishes; when it dies the other takes over.
TEST_F(PublishTest, TwoRelaysOneLeaderAndTakeover) {
    auto& first = start_relay();
    ASSERT_TRUE(eventually([&] { return first.log().find("leading group") != std::string::npos; }, 10s));
    auto& second = start_relay();
    emit(60);
    ASSERT_TRUE(wait_all_published());
    std::this_thread::sleep_for(500ms);
    EXPECT_EQ(second.log().find("leading group"), std::string::npos);
    first.signal(SIGKILL);
    first.wait();
    emit(60);
    ASSERT_TRUE(eventually([&] { return second.log().find("leading group") != std::string::npos; }, 10s))
        << second.log();
    ASSERT_TRUE(wait_all_published());
    expect_exactly_once_in_order();
}

// A wrong setting exits at once, non-zero, naming the setting.
TEST_F(PublishTest, UnknownGroupIsFatal) {
    auto pg = connect();
    pg.exec("SELECT outbox_group_drop('g')");
    auto& relay = start_relay();
    EXPECT_EQ(relay.wait(20s), 1);
    EXPECT_NE(relay.log().find("group \"g\" does not exist"), std::string::npos) << relay.log();
}

// The Prometheus endpoint counts what was published; health reports the role.
TEST_F(PublishTest, MetricsAndHealthEndpoints) {
    const int port = free_port();
    start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    emit(42);
    ASSERT_TRUE(wait_all_published());
    httplib::Client client("127.0.0.1", port);
    std::string body;
    ASSERT_TRUE(eventually(
        [&] {
            auto res = client.Get("/metrics");
            if (!res || res->status != 200) return false;
            body = res->body;
            return body.find("pg_outbox_relay_events_published_total{mode=\"publish\",group=\"g\"} 42") !=
                   std::string::npos;
        },
        10s))
        << body;
    EXPECT_NE(body.find("pg_outbox_relay_leader{mode=\"publish\",group=\"g\"} 1"), std::string::npos);
    EXPECT_NE(body.find("# TYPE pg_outbox_relay_batches_published_total counter"), std::string::npos);
    // The extension's version and engine as the relay read them at connect.
    auto pg = connect();
    const auto identity = query_column(pg, "SELECT version || ' ' || engine FROM outbox.engine()")[0];
    const auto extversion = identity.substr(0, identity.find(' '));
    const auto engine = identity.substr(identity.find(' ') + 1);
    EXPECT_EQ(engine, pg_outbox::testing::engine());
    EXPECT_NE(body.find("\npg_outbox_relay_build_info{version=\"" + extversion + "\",extension_version=\"" +
                        extversion + "\",engine=\"" + engine + "\"} 1\n"),
              std::string::npos)
        << body;
    for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes",
                             "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                             "process_start_time_seconds"})
        EXPECT_NE(body.find(std::string("\n") + name + " "), std::string::npos) << name;
    auto health = client.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
    EXPECT_EQ(health->body, "ok leader\n");
}

// What an operator alerts on, from two relays of one group: every error
// kind is a series at 0 from the start; the leader's lag_seconds is 0 once
// the feed is empty; the standby exposes leader 0 and no lag_events (a sum
// over relays is the backlog).
TEST_F(PublishTest, AlertableSeriesOnLeaderAndStandby) {
    const int leader_port = free_port();
    start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(leader_port), "--stats-interval", "100ms"});
    httplib::Client leader("127.0.0.1", leader_port);
    ASSERT_TRUE(eventually([&] { return metric(leader, series("pg_outbox_relay_leader")) == 1; }, 10s));
    const int standby_port = free_port();
    start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(standby_port), "--stats-interval", "100ms"});
    httplib::Client standby("127.0.0.1", standby_port);
    ASSERT_TRUE(eventually([&] { return metric(standby, series("pg_outbox_relay_pg_connected")) == 1; }, 10s));
    for (auto* client : {&leader, &standby})
        for (const auto* kind : {"pg", "redis_io", "redis_OOM", "maintenance", "redis_other"})
            EXPECT_EQ(metric(*client, series("pg_outbox_relay_errors_total", std::string(",kind=\"") + kind + "\"")),
                      0)
                << kind;
    {
        // Events a second old when they are published.
        auto pg = connect();
        pg.exec("BEGIN");
        for (int i = 0; i < 5; ++i) pg.exec("SELECT outbox_emit('orders', NULL, '{}')");
        std::this_thread::sleep_for(1200ms);
        pg.exec("COMMIT");
    }
    ASSERT_TRUE(wait_all_published());
    ASSERT_TRUE(eventually([&] { return metric(leader, series("pg_outbox_relay_lag_events")) == 0; }, 10s));
    EXPECT_TRUE(eventually([&] { return metric(leader, series("pg_outbox_relay_lag_seconds")) == 0; }, 10s))
        << metric(leader, series("pg_outbox_relay_lag_seconds"));
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(metric(standby, series("pg_outbox_relay_leader")), 0);
    auto res = standby.Get("/metrics");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->body.find("pg_outbox_relay_lag_events{"), std::string::npos) << res->body;
    EXPECT_EQ(metric(standby, series("pg_outbox_relay_lag_seconds")), 0);
}

// A standby says once that it stands by, and which session leads: the
// leader's backend pid and client address.
TEST_F(PublishTest, StandbyLogsOnceWhoLeads) {
    const int port = free_port();
    start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    httplib::Client leader("127.0.0.1", port);
    ASSERT_TRUE(eventually([&] { return metric(leader, series("pg_outbox_relay_leader")) == 1; }, 10s));
    auto pg = connect();
    const auto pid = query_column(pg, "SELECT leader_pid FROM outbox_group_stats('g')")[0];
    const auto addr = query_column(pg, "SELECT host(client_addr) || ':' || client_port FROM pg_stat_activity "
                                       "WHERE pid = " + pid)[0];
    auto& standby = start_relay();
    const std::string line = "standing by: group \"g\" is led by backend pid " + pid + " (client " + addr +
                             ", application \"pg_outbox_relay publish g\")";
    ASSERT_TRUE(eventually([&] { return standby.log().find(line) != std::string::npos; }, 10s)) << standby.log();
    emit(20);
    ASSERT_TRUE(wait_all_published());
    std::this_thread::sleep_for(500ms);
    const auto log = standby.log();
    EXPECT_EQ(log.find("standing by", log.find(line) + 1), std::string::npos) << "logged once\n" << log;
}

// While batches keep coming the cursor moves at most every 100 ms, not
// once per batch, and it catches up with the last batch once the feed runs
// dry. (A trigger counts the advances.)
TEST_F(PublishTest, CursorAdvancesAtIntervalsWhileBatchesKeepComing) {
    {
        auto pg = connect();
        pg.exec("CREATE TABLE public.advances (at timestamptz DEFAULT clock_timestamp())");
        pg.exec("GRANT INSERT ON public.advances TO PUBLIC");
        pg.exec("CREATE FUNCTION public.count_advance() RETURNS trigger LANGUAGE plpgsql AS "
                "$$BEGIN INSERT INTO public.advances DEFAULT VALUES; RETURN NULL; END$$");
        pg.exec("CREATE TRIGGER count_advance AFTER UPDATE ON outbox.groups "
                "FOR EACH ROW EXECUTE FUNCTION public.count_advance()");
    }
    const int port = free_port();
    start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    std::atomic<bool> done{false};
    std::vector<std::thread> writers;
    for (int w = 0; w < 2; ++w)
        writers.emplace_back([this, &done] {
            auto pg = connect();
            for (int i = 0; !done; ++i)
                pg.exec("SELECT count(*) FROM outbox_emit_many($1, NULL, array_fill('{\"x\": 1}'::jsonb, ARRAY[2]))",
                        {kTopics[i % kTopics.size()]});
        });
    std::this_thread::sleep_for(2s);
    done = true;
    for (auto& w : writers) w.join();
    ASSERT_TRUE(wait_all_published());
    expect_exactly_once_in_order();
    auto pg = connect();
    const auto last = query_column(pg, "SELECT txid || '-' || seq FROM outbox.event ORDER BY txid DESC, seq DESC LIMIT 1")[0];
    ASSERT_TRUE(eventually([&] { return cursor() == last; }, 10s)) << cursor() << " " << last;
    httplib::Client client("127.0.0.1", port);
    const double batches = metric(client, series("pg_outbox_relay_batches_published_total"));
    const double advances = std::stod(query_column(pg, "SELECT count(*) FROM public.advances")[0]);
    EXPECT_GT(batches, 40) << "the writers did not keep the relay busy";
    EXPECT_LT(advances, batches / 2) << advances << " advances for " << batches << " batches";
}

// The lag metric counts the group's backlog on a connection of its own: it
// follows a backlog the relay cannot publish (Redis is down) and goes back
// to 0 once the backlog is published.
TEST_F(PublishTest, LagMetricCountsTheBacklogOnItsOwnConnection) {
    const int port = free_port();
    start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port), "--stats-interval", "100ms"});
    emit(10);
    ASSERT_TRUE(wait_all_published());
    httplib::Client client("127.0.0.1", port);
    const auto lag = series("pg_outbox_relay_lag_events");
    ASSERT_TRUE(eventually([&] { return metric(client, lag) == 0; }, 10s));
    auto pg = connect();
    EXPECT_EQ(pg.exec("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_outbox_relay lag g'")
                  .get(0, 0),
              "1");
    redis_->stop();
    emit(42);
    EXPECT_TRUE(eventually([&] { return metric(client, lag) == 42; }, 10s)) << metric(client, lag);
    redis_->start();
    ASSERT_TRUE(wait_all_published());
    EXPECT_TRUE(eventually([&] { return metric(client, lag) == 0; }, 10s)) << metric(client, lag);
}

// Another writer put an entry with a higher id into the relay's stream:
// Redis refuses the relay's next entries as "smaller than the top", but they
// were never published. The relay does not count them as published; it
// stops, loudly, and resumes once the foreign entry is gone.
TEST_F(PublishTest, ForeignEntryAboveTheRelayIsNotMistakenForPublished) {
    auto& relay = start_relay();
    emit(3);
    ASSERT_TRUE(wait_all_published());
    {
        auto redis = redis_->connect();
        redis.command({"XADD", "outbox:orders", "99999999999-1", "event_id", "not-ours", "payload", "{}"});
    }
    emit(3, 3);
    ASSERT_TRUE(eventually([&] { return relay.log().find("did not write") != std::string::npos; }, 10s)) << relay.log();
    EXPECT_EQ(cursor().substr(0, 1) != "0", true);
    {
        auto redis = redis_->connect();
        auto entries = read_stream(redis, "outbox:orders");
        EXPECT_EQ(entries.size(), 2u);  // one of ours, the foreign one
        redis.command({"DEL", "outbox:orders"});
    }
    ASSERT_TRUE(wait_all_published());
    expect_exactly_once_in_order();
}

// Without a background worker, the leading relay runs partition
// maintenance: an event that landed in the default partition is moved out
// and published.
TEST_F(PublishTest, RelayRunsMaintenanceWhenNoWorkerDoes) {
    {
        auto pg = connect();
        pg.exec("UPDATE outbox.config SET partition_width = 100, premake = 2");
        pg.exec("SELECT outbox_drop_empty_partitions()");
    }
    emit(3);
    auto& relay = start_relay({"--maintain-interval", "200ms"});
    ASSERT_TRUE(wait_all_published());
    auto pg = connect();
    ASSERT_TRUE(eventually([&] { return query_column(pg, "SELECT count(*) FROM outbox.event_default")[0] == "0"; },
                           10s))
        << relay.log();
    // The relay logs the run once its statement returned, which may be
    // after the moved rows became visible here.
    EXPECT_TRUE(eventually([&] { return relay.log().find("partition maintenance: moved outbox.event_") != std::string::npos; },
                           5s))
        << relay.log();
    emit(3, 3);
    ASSERT_TRUE(wait_all_published());
    expect_exactly_once_in_order();
}

// In a plain drain every batch goes through the fast path (streams checked
// under WATCH, plain XADD in MULTI/EXEC), new streams included; none needs
// the append script.
TEST_F(PublishTest, PlainDrainUsesTheTransactionPath) {
    emit(600);
    const int port = free_port();
    start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    ASSERT_TRUE(wait_all_published());
    expect_exactly_once_in_order();
    httplib::Client client("127.0.0.1", port);
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_events_published_total")) == 600; },
                           10s));
    // Batches of 100, 200 and 300 events (full batches grow).
    EXPECT_GE(metric(client, series("pg_outbox_relay_redis_batches_total", ",path=\"transaction\"")), 3);
    EXPECT_EQ(metric(client, series("pg_outbox_relay_redis_batches_total", ",path=\"script\"")), 0);
    EXPECT_EQ(metric(client, series("pg_outbox_relay_events_already_published_total")), 0);
}

// A foreign entry (an id Redis generated, above every feed position) lands
// in a stream while the relay drains it: the relay stops at that stream,
// loudly, without skipping an event or writing one after the foreign
// entry, and resumes once the stream is removed.
TEST_F(PublishTest, ForeignEntryDuringDrainStopsLoudly) {
    // The periodic stream check and backlog count stay out of the way: the
    // relay finds the stream changed on its own, batch by batch.
    auto& relay = start_relay({"--stats-interval", "10s"});
    std::atomic<bool> done{false};
    auto w = writer(done);
    ASSERT_TRUE(eventually([&] { return published_count() >= 200; }, 20s)) << relay.log();
    {
        auto redis = redis_->connect();
        auto r = redis.command({"XADD", "outbox:orders", "*", "event_id", "not-ours", "payload", "{}"});
        ASSERT_EQ(r->type, REDIS_REPLY_STRING);
    }
    ASSERT_TRUE(eventually([&] { return relay.log().find("did not write") != std::string::npos; }, 20s))
        << relay.log();
    done = true;
    w.join();
    std::this_thread::sleep_for(500ms);  // the relay retries meanwhile
    EXPECT_TRUE(relay.running());
    expect_prefixes_up_to_the_cursor({"not-ours"});
    {
        auto redis = redis_->connect();
        redis.command({"DEL", "outbox:orders"});
    }
    ASSERT_TRUE(wait_all_published()) << relay.log();
    expect_exactly_once_in_order();
}

// FLUSHALL several times while the relay drains a feed being written:
// each time the relay finds its streams behind (before or under WATCH),
// rewinds and republishes; in the end every event is there exactly once.
TEST_F(PublishTest, FlushallDuringDrainRepublishes) {
    // The periodic stream check and backlog count stay out of the way: the
    // relay finds the stream changed on its own, batch by batch.
    auto& relay = start_relay({"--stats-interval", "10s"});
    std::atomic<bool> done{false};
    auto w = writer(done);
    for (int i = 0; i < 3; ++i) {
        ASSERT_TRUE(eventually([&] { return published_count() >= 100; }, 20s)) << relay.log();
        auto redis = redis_->connect();
        redis.command({"FLUSHALL"});
    }
    done = true;
    w.join();
    ASSERT_TRUE(wait_all_published()) << relay.log();
    expect_exactly_once_in_order();
    EXPECT_NE(relay.log().find("is behind"), std::string::npos) << relay.log();
}

// Redis out of memory refuses the transaction at EXEC (and the script after
// it): nothing is written, the cursor stays, the error is counted as OOM;
// once memory is raised the relay catches up, back on the fast path.
TEST_F(PublishTest, OutOfMemoryWritesNothingAndResumes) {
    const int port = free_port();
    auto& relay = start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    httplib::Client client("127.0.0.1", port);
    emit(30);
    ASSERT_TRUE(wait_all_published());
    // The cursor follows what Redis acknowledged within 100 ms.
    std::string last;
    {
        auto pg = connect();
        last = query_column(pg, "SELECT txid || '-' || seq FROM outbox.event ORDER BY txid DESC, seq DESC LIMIT 1")[0];
    }
    ASSERT_TRUE(eventually([&] { return cursor() == last; }, 10s)) << relay.log();
    const auto before = cursor();
    {
        auto redis = redis_->connect();
        redis.command({"CONFIG", "SET", "maxmemory", "1"});
    }
    emit(30, 30);
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_errors_total", ",kind=\"redis_OOM\"")) >= 3; },
                           20s))
        << relay.log();
    EXPECT_EQ(published_count(), 30u);
    EXPECT_EQ(cursor(), before);
    expect_prefixes_up_to_the_cursor();
    const auto transactions = metric(client, series("pg_outbox_relay_redis_batches_total", ",path=\"transaction\""));
    {
        auto redis = redis_->connect();
        redis.command({"CONFIG", "SET", "maxmemory", "0"});
    }
    ASSERT_TRUE(wait_all_published()) << relay.log();
    emit(30, 60);
    ASSERT_TRUE(wait_all_published()) << relay.log();
    expect_exactly_once_in_order();
    EXPECT_GT(metric(client, series("pg_outbox_relay_redis_batches_total", ",path=\"transaction\"")), transactions);
    EXPECT_EQ(metric(client, series("pg_outbox_relay_events_already_published_total")), 0);
}

// A Redis that refuses MULTI (here an ACL; a proxy may too): the relay
// finds out when it connects and writes every batch with the script.
TEST_F(PublishTest, RefusedTransactionsFallBackToTheScript) {
    {
        auto redis = redis_->connect();
        auto r = redis.command({"ACL", "SETUSER", "default", "-multi"});
        ASSERT_EQ(r->type, REDIS_REPLY_STATUS) << reply_text(r.get());
    }
    emit(300);
    const int port = free_port();
    auto& relay = start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    ASSERT_TRUE(wait_all_published()) << relay.log();
    expect_exactly_once_in_order();
    EXPECT_NE(relay.log().find("Redis refused MULTI"), std::string::npos) << relay.log();
    httplib::Client client("127.0.0.1", port);
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_events_published_total")) == 300; },
                           10s));
    EXPECT_EQ(metric(client, series("pg_outbox_relay_redis_batches_total", ",path=\"transaction\"")), 0);
    EXPECT_GE(metric(client, series("pg_outbox_relay_redis_batches_total", ",path=\"script\"")), 2);
}

// Full batches grow to 4 times --batch-size while the backlog lasts, and
// the first batch that is not full goes back to it.
TEST_F(PublishTest, FullBatchesGrowAndAPartialOneShrinks) {
    emit(2000);
    const int port = free_port();
    auto& relay = start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    ASSERT_TRUE(wait_all_published()) << relay.log();
    httplib::Client client("127.0.0.1", port);
    // 100, 200, 400, then 400 each: 2000 events in 6 batches (7 with the
    // partial last one), where batches of 100 took 20.
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_events_published_total")) == 2000; },
                           10s));
    const auto grown = metric(client, series("pg_outbox_relay_redis_batches_total", ",path=\"transaction\""));
    EXPECT_GE(grown, 6);
    EXPECT_LE(grown, 8);
    // A trickle: each batch is partial, so each asks for 100 again, and a
    // burst of 150 then takes two batches (100 and 50), not one.
    emit(1);
    ASSERT_TRUE(wait_all_published());
    emit(150);
    ASSERT_TRUE(wait_all_published());
    expect_exactly_once_in_order();
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_events_published_total")) == 2151; },
                           10s));
    EXPECT_GE(metric(client, series("pg_outbox_relay_redis_batches_total", ",path=\"transaction\"")), grown + 3);
}

// Maintenance, due when the relay starts, waits for the backlog to be
// published: it can take the better part of a second on a large table.
TEST_F(PublishTest, MaintenanceWaitsForTheBacklog) {
    emit(300);
    auto& relay = start_relay({"--maintain-interval", "10s"});
    ASSERT_TRUE(wait_all_published());
    ASSERT_TRUE(eventually([&] { return relay.log().find("partition maintenance") != std::string::npos; }, 10s))
        << relay.log();
    const auto log = relay.log();
    EXPECT_LT(log.find("published 100 events"), log.find("partition maintenance")) << log;
    expect_exactly_once_in_order();
}

// outbox_rewind() while the relay leads and writers keep it busy: the
// relay reads ahead of its cursor and advances to what it published, so
// without the group's generation a backward rewind was undone by its next
// advance (nothing republished) and a forward one made its advance fail
// (the relay exited). Backward: every event published before the rewind
// is read again, and Redis refuses each as already present. Forward: the
// relay goes on after the new cursor.
TEST_F(PublishTest, RewindWhileLeadingTakesEffect) {
    const int port = free_port();
    auto& relay = start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port), "--stats-interval", "60m"});
    httplib::Client client("127.0.0.1", port);
    std::atomic<bool> done{false};
    auto w = writer(done);
    WriterStop stop{done, w};
    ASSERT_TRUE(eventually([&] { return published_count() >= 300; }, 30s)) << relay.log();
    const auto before = published_count();
    {
        auto pg = connect();
        pg.exec("SELECT outbox_rewind('g', 'beginning')");
    }
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_cursor_moves_total")) >= 1; }, 10s))
        << relay.log();
    // Everything published before the rewind comes round again (the batch in
    // flight at the rewind, at most two of 100, may be new to Redis).
    EXPECT_TRUE(eventually(
        [&] {
            return metric(client, series("pg_outbox_relay_events_already_published_total")) >=
                   static_cast<double>(before) - 200;
        },
        30s))
        << relay.log();

    // Forward: skip to now; the relay stays up and publishes what follows.
    {
        auto pg = connect();
        pg.exec("SELECT outbox_rewind('g', 'now')");
    }
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_cursor_moves_total")) >= 2; }, 10s))
        << relay.log();
    std::this_thread::sleep_for(300ms);
    done = true;
    w.join();
    EXPECT_TRUE(relay.running()) << relay.log();
    std::string last;
    {
        auto pg = connect();
        last = query_column(pg, "SELECT txid || '-' || seq FROM outbox.event ORDER BY txid DESC, seq DESC LIMIT 1")[0];
    }
    EXPECT_TRUE(eventually([&] { return cursor() == last; }, 10s)) << relay.log();
    EXPECT_NE(relay.log().find("publishing from the moved cursor"), std::string::npos);
    expect_prefixes_up_to_the_cursor();
}

// A leader that stops making progress (SIGSTOP: a paused VM or container
// keeps its connection, and the kernel answers TCP keepalives for it)
// loses the group once its lease has run out: the standby publishes what
// is written meanwhile while the leader is still stopped. When the old
// leader continues, its next call is refused (fenced off by the new
// generation) and it stands by; whatever it was writing when it stopped
// neither duplicates nor reorders anything.
TEST_F(PublishTest, HungLeaderLosesItsLeaseToTheStandby) {
    constexpr auto kLease = 2s;
    const std::vector<std::string> flags{"--lease", "2s", "--batch-size", "20"};
    std::atomic<bool> done{false};
    auto w = writer(done);
    WriterStop stop{done, w};
    auto& first = start_relay(flags);
    ASSERT_TRUE(eventually([&] { return first.log().find("leading group") != std::string::npos; }, 10s));
    auto& second = start_relay(flags);
    ASSERT_TRUE(eventually([&] { return second.log().find("standing by") != std::string::npos; }, 10s));
    std::string generation_before;
    {
        auto pg = connect();
        generation_before = query_column(pg, "SELECT generation FROM outbox_group_stats('g')")[0];
    }
    std::this_thread::sleep_for(500ms);
    first.signal(SIGSTOP);
    const auto stopped = std::chrono::steady_clock::now();
    const auto at_stop = committed_count();
    // Three leases later the old leader is still stopped; by then the
    // standby leads and has published what was committed when it stopped.
    const bool took_over = eventually(
        [&] { return second.log().find("leading group") != std::string::npos && published_count() >= at_stop; },
        3 * kLease, 20ms);
    const auto takeover = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
    RecordProperty("takeover_seconds", std::to_string(takeover));
    std::this_thread::sleep_until(stopped + 3 * kLease);
    {
        auto pg = connect();
        const auto row = pg.exec("SELECT leader_pid IS NOT NULL, generation FROM outbox_group_stats('g')");
        EXPECT_EQ(row.get(0, 0), "t");
        EXPECT_GT(std::stoll(std::string(row.get(0, 1))), std::stoll(generation_before)) << "no new generation";
    }
    first.signal(SIGCONT);
    ASSERT_TRUE(took_over) << "the standby did not take over while the leader was stopped\n" << second.log();
    ASSERT_TRUE(eventually(
        [&] { return first.log().find("is led by another session now; standing by") != std::string::npos; }, 10s))
        << first.log();
    done = true;
    w.join();
    ASSERT_TRUE(wait_all_published()) << second.log();
    std::this_thread::sleep_for(300ms);
    EXPECT_TRUE(first.running());
    EXPECT_TRUE(second.running());
    expect_exactly_once_in_order();
}

// A leader with nothing to publish keeps its group: it renews its lease
// while it waits, and before its own maintenance runs (no background
// worker here), and the standby never leads.
TEST_F(PublishTest, IdleLeaderKeepsItsLease) {
    auto& first = start_relay({"--lease", "2s", "--poll-interval", "300ms", "--maintain-interval", "1s"});
    ASSERT_TRUE(eventually([&] { return first.log().find("leading group") != std::string::npos; }, 10s));
    auto& second = start_relay({"--lease", "2s", "--poll-interval", "300ms", "--maintain-interval", "1s"});
    std::this_thread::sleep_for(5s);
    EXPECT_EQ(second.log().find("leading group"), std::string::npos) << second.log();
    emit(20);
    ASSERT_TRUE(wait_all_published());
    EXPECT_EQ(second.log().find("leading group"), std::string::npos) << second.log();
    expect_exactly_once_in_order();
}

// What a fenced-off leader writes late is harmless: entry ids are feed
// positions, and the append script writes an entry only above the
// stream's last id, skipping one that is there with the same event id.
// Both leaders write the same batch of one stream, the old one stopping
// halfway at different points, in every interleaving of their halves: the
// stream ends up with each entry once, in order.
TEST_F(PublishTest, LateWritesOfAFencedLeaderAreHarmless) {
    std::vector<Event> batch(10);
    for (std::size_t i = 0; i < batch.size(); ++i) {
        batch[i].position = "1000-" + std::to_string(i + 1);
        batch[i].event_id = "00000000-0000-7000-8000-00000000000" + std::to_string(i);
        batch[i].topic = "orders";
        batch[i].payload = "{\"n\": " + std::to_string(i) + "}";
        batch[i].created_at = "2026-12-01T00:00:00.000000Z";
    }
    auto redis = redis_->connect();
    const auto loaded = redis.command({"SCRIPT", "LOAD", kAppendScript});
    ASSERT_EQ(loaded->type, REDIS_REPLY_STRING);
    const std::string sha(loaded->str, loaded->len);
    // Writes events [from, to) of the batch; returns {written, already}.
    auto write = [&](const std::string& key, std::size_t from, std::size_t to) {
        std::vector<const Event*> events;
        for (std::size_t i = from; i < to; ++i) events.push_back(&batch[i]);
        std::vector<std::string> counts;
        EntryFields fields;
        auto r = redis.command(
            append_script_argv(sha, key, events, IdMode::explicit_position, "0", "", counts, fields));
        EXPECT_EQ(r->type, REDIS_REPLY_ARRAY);
        EXPECT_EQ(r->elements, 2u) << "the script refused the write";
        return std::pair<long long, long long>{r->element[0]->integer, r->element[1]->integer};
    };
    int round = 0;
    for (std::size_t half = 0; half <= batch.size(); half += 3) {
        for (std::size_t new_first = 0; new_first <= batch.size(); new_first += 5) {
            const std::string key = "fenced:" + std::to_string(round++);
            write(key, 0, half);               // the old leader, before it stopped
            write(key, 0, new_first);          // the new leader's first part
            write(key, half, batch.size());    // the old leader, late: the rest of its batch
            const auto last = write(key, 0, batch.size());  // the new leader, all of it
            EXPECT_EQ(last.first, 0) << key;
            EXPECT_EQ(last.second, static_cast<long long>(batch.size())) << key;
            const auto entries = read_stream(redis, key);
            ASSERT_EQ(entries.size(), batch.size()) << key;
            for (std::size_t i = 0; i < batch.size(); ++i) {
                EXPECT_EQ(entries[i].id, batch[i].position) << key;
                EXPECT_EQ(entries[i].fields.at("event_id"), batch[i].event_id) << key;
                // Whoever wrote it, each entry names the one before it.
                EXPECT_EQ(entries[i].fields.at("prev"), i == 0 ? "0-0" : batch[i - 1].position) << key;
            }
        }
    }
}

// The relay role's own DateStyle, TimeZone, client_encoding, ... change
// nothing in an entry: created_at is RFC 3339 in UTC with microseconds,
// equal to the event's created_at, and text is UTF-8.
TEST_F(PublishTest, EntriesDoNotDependOnTheRolesSettings) {
    {
        auto pg = connect();
        pg.exec("ALTER ROLE relay_user SET DateStyle = 'SQL, DMY'");
        pg.exec("ALTER ROLE relay_user SET TimeZone = 'Asia/Kolkata'");
        pg.exec("ALTER ROLE relay_user SET IntervalStyle = 'sql_standard'");
        pg.exec("ALTER ROLE relay_user SET extra_float_digits = -15");
        pg.exec("ALTER ROLE relay_user SET client_encoding = 'LATIN1'");
        pg.exec("SELECT outbox_emit('orders', 'caf\u00e9', '{\"name\": \"cr\u00e8me\"}')");
    }
    emit(5);
    auto& relay = start_relay();
    ASSERT_TRUE(wait_all_published()) << relay.log();
    expect_exactly_once_in_order();
    auto pg = connect();
    auto r = pg.exec(
        "SELECT event_id, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM outbox.event");
    std::map<std::string, std::string> want;
    for (int i = 0; i < r.rows(); ++i) want[std::string(r.get(i, 0))] = r.get(i, 1);
    ASSERT_EQ(want.size(), 6u);
    const std::regex rfc3339(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z)");
    auto redis = redis_->connect();
    std::size_t seen = 0;
    for (const auto& t : kTopics) {
        for (const auto& e : read_stream(redis, "outbox:" + t)) {
            const auto& created_at = e.fields.at("created_at");
            EXPECT_TRUE(std::regex_match(created_at, rfc3339)) << created_at;
            EXPECT_EQ(created_at, want.at(e.fields.at("event_id")));
            ++seen;
        }
    }
    EXPECT_EQ(seen, 6u);
    const auto first = read_stream(redis, "outbox:orders").at(0);
    EXPECT_EQ(first.fields.at("key"), "caf\u00e9");
    EXPECT_EQ(first.fields.at("payload"), "{\"name\": \"cr\u00e8me\"}");
}

namespace {

// Publish tests against a Redis of 2 MB maxmemory that evicts nothing.
class RedisPressureTest : public PublishTest {
protected:
    void SetUp() override {
        PublishTest::SetUp();
        redis_ = std::make_unique<RedisServer>(false, std::vector<std::string>{"--maxmemory", "2mb",
                                                                               "--maxmemory-policy", "noeviction"});
    }

    std::int64_t used_memory() {
        auto redis = redis_->connect();
        auto r = redis.command({"INFO", "memory"});
        const std::string info(reply_text(r.get()));
        const auto at = info.find("used_memory:");
        return std::stoll(info.substr(at + 12));
    }

    // Sets filler keys of 16 KB until Redis uses at least "target" bytes
    // (one growing string would double its allocation at times).
    void fill_to(std::int64_t target) {
        auto redis = redis_->connect();
        const std::string piece(16 * 1024, 'f');
        for (int i = 0; used_memory() < target; ++i) {
            auto r = redis.command({"SET", "filler:" + std::to_string(i), piece});
            ASSERT_EQ(r->type, REDIS_REPLY_STATUS) << reply_text(r.get());
        }
    }

    // Frees the memory the filler keys hold.
    void free_filler() {
        auto redis = redis_->connect();
        for (int i = 0;; ++i) {
            auto r = redis.command({"DEL", "filler:" + std::to_string(i)});
            if (r->integer == 0) return;
        }
    }

    // One transaction of n events on each topic, each about "bytes" of payload.
    void emit_large(int n, int bytes) {
        auto pg = connect();
        pg.exec("BEGIN");
        for (const auto& t : kTopics)
            pg.exec("SELECT count(*) FROM outbox_emit_many($1, NULL, "
                    "array_fill(jsonb_build_object('pad', repeat('x', $2::int)), ARRAY[$3::int]))",
                    {t, std::to_string(bytes), std::to_string(n)});
        pg.exec("COMMIT");
    }
};

}  // namespace

// Redis has 1.5 of its 2 MB in use: a batch of 360 events (about 230 KB)
// is refused whole for OOM, and goes in smaller parts; nothing stalls.
TEST_F(RedisPressureTest, BatchGoesInSmallerPartsWhileRedisHasRoom) {
    fill_to(1500 * 1024);
    emit_large(120, 500);
    const int port = free_port();
    auto& relay = start_relay({"--batch-size", "1000", "--metrics-address", "127.0.0.1:" + std::to_string(port)});
    ASSERT_TRUE(wait_all_published(20s)) << relay.log();
    expect_exactly_once_in_order();
    EXPECT_NE(relay.log().find("Redis is short of memory"), std::string::npos) << relay.log();
    EXPECT_EQ(relay.log().find("not even one entry fits"), std::string::npos) << relay.log();
    httplib::Client client("127.0.0.1", port);
    EXPECT_EQ(metric(client, series("pg_outbox_relay_redis_oom")), 0);
    auto health = client.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->body, "ok leader\n");
}

// Redis fills up part-way through the backlog: what got in is a prefix of
// each stream, the cursor passes nothing unpublished, /health and the
// gauge say why; once memory is freed everything is published exactly
// once, in feed order.
TEST_F(RedisPressureTest, FullRedisLosesNothingAndResumesWhenFreed) {
    fill_to(1850 * 1024);
    emit_large(300, 500);
    const int port = free_port();
    auto& relay = start_relay({"--batch-size", "1000", "--metrics-address", "127.0.0.1:" + std::to_string(port)});
    httplib::Client client("127.0.0.1", port);
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_redis_oom")) == 1; }, 20s))
        << relay.log();
    auto health = client.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 503);
    EXPECT_NE(health->body.find("Redis refuses writes: OOM"), std::string::npos) << health->body;
    std::this_thread::sleep_for(1s);  // retries while full change nothing
    const auto partial = published_count();
    EXPECT_LT(partial, committed_count());
    expect_prefixes_up_to_the_cursor();
    free_filler();
    ASSERT_TRUE(wait_all_published(20s)) << relay.log();
    expect_exactly_once_in_order();
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_redis_oom")) == 0; }, 5s));
    health = client.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->body, "ok leader\n");
    EXPECT_GT(partial, 0u) << relay.log();
}

// An event too large to publish, stored before outbox_emit() checked the
// size of JSON text (2,100 numbers of 131,072 digits: some kilobytes
// stored, 275 MB as text). The relay publishes the events before it, then
// holds there instead of exiting (which met it again at every restart):
// it keeps running and leading, /health says which event and how to pass
// it, the gauge is 1, the log names it once, and each fetch that is
// refused again costs the server little. outbox_skip() passes it, with a
// record, and the events after it follow.
TEST_F(PublishTest, EventTooLargeToPublishHoldsUntilSkipped) {
    const int port = free_port();
    auto& relay = start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
    httplib::Client client("127.0.0.1", port);
    emit(5);
    std::string big;
    {
        auto pg = connect();
        pg.exec("BEGIN");
        pg.exec("SELECT outbox_emit('orders', 'just before', '{}')");
        pg.exec("INSERT INTO outbox.event (txid, seq, event_id, topic, key, payload, headers, created_at)"
                " SELECT pg_current_xact_id(), 2, gen_random_uuid(), 'orders', 'big', jsonb_agg('1e131071'::jsonb),"
                "        NULL, now() FROM generate_series(1, 2100)");
        pg.exec("COMMIT");
        big = query_column(pg, "SELECT txid || '-' || seq FROM outbox.event WHERE key = 'big'")[0];
    }
    emit(5, 5);

    // The fetch that meets the event prints it (275 MB of JSON): seconds,
    // more on the SQL engine and on a loaded machine.
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_event_too_large")) == 1; }, 90s))
        << relay.log();
    auto health = client.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 503);
    EXPECT_NE(health->body.find("the event at position " + big + " of group \"g\" is too large to publish"),
              std::string::npos)
        << health->body;
    EXPECT_NE(health->body.find("outbox_skip('g', '" + big + "', '<reason>')"), std::string::npos)
        << health->body;
    // Everything before it is published, nothing after it; the relay fetches
    // again, refused each time, and logs the event once.
    ASSERT_TRUE(eventually([&] { return published_count() == 6; }, 10s)) << relay.log();
    ASSERT_TRUE(eventually(
        [&] { return metric(client, series("pg_outbox_relay_errors_total", ",kind=\"event_too_large\"")) >= 3; }, 20s))
        << relay.log();
    EXPECT_EQ(published_count(), 6u);
    EXPECT_TRUE(relay.running()) << relay.log();
    EXPECT_EQ(metric(client, series("pg_outbox_relay_leader")), 1);
    const auto log = relay.log();
    const std::string held = "group \"g\" holds at position " + big;
    const auto first = log.find(held);
    ASSERT_NE(first, std::string::npos) << log;
    EXPECT_EQ(log.find(held, first + 1), std::string::npos) << "logged once as an error: " << log;
    EXPECT_NE(log.find("outbox_skip('g', '" + big + "', '<reason>')"), std::string::npos) << log;
    // The relay advanced up to it: the position it names is the group's
    // next event, which outbox_skip() takes.
    {
        auto pg = connect();
        ASSERT_TRUE(eventually(
            [&] {
                return query_column(pg, "SELECT count(*) FROM outbox.event e, outbox.groups g"
                                        " WHERE g.name = 'g' AND (e.txid, e.seq) > (g.cursor_txid, g.cursor_seq)")[0] ==
                       "6";
            },
            10s))
            << relay.log();
        EXPECT_EQ(query_column(pg, "SELECT outbox_skip('g', $1, 'test: 2,100 numbers of 131,072 digits')", {big})[0],
                  big);
        EXPECT_EQ(query_column(pg, "SELECT pos || ' ' || key FROM outbox.skipped_events")[0], big + " big");
    }
    ASSERT_TRUE(eventually([&] { return published_count() == 11; }, 20s)) << relay.log();
    ASSERT_TRUE(eventually([&] { return metric(client, series("pg_outbox_relay_event_too_large")) == 0; }, 10s))
        << relay.log();
    health = client.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->body, "ok leader\n");
    EXPECT_TRUE(relay.running()) << relay.log();
    // Every stream holds its events in feed order, the skipped one left out.
    auto pg = connect();
    const auto big_id = query_column(pg, "SELECT event_id FROM outbox.event WHERE key = 'big'")[0];
    auto redis = redis_->connect();
    for (const auto& e : read_stream(redis, "outbox:orders")) EXPECT_NE(e.fields.at("event_id"), big_id);
}
