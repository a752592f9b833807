// Integration tests of consume --pool: the workers of one consumer group
// share a sharded group's streams, each stream read by one live worker at
// a time, so that every key's events apply exactly once and in emit order
// while the shards apply in parallel; through workers joining, dying
// (SIGKILL) and pausing past their lease (SIGSTOP).
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "fixture.hpp"
#include "pg_outbox/stream_pool.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

constexpr int kShards = 4;
constexpr int kKeys = 24;
const char* const kStreamTemplate = "outbox:orders:{shard}";

class PoolTest : public RelayTest {
protected:
    void SetUp() override {
        RelayTest::SetUp();
        auto pg = connect();
        pg.exec("SELECT outbox_group_create('p', start_at => 'beginning', shards => " + std::to_string(kShards) + ")");
        sink_ = pg_->create_database("sink");
        PgConnection db(sink_, "tests");
        db.exec("CREATE ROLE consumer_user LOGIN IN ROLE outbox_consumer");
        // The order of applies (seq), and which session applied each.
        db.exec("CREATE TABLE projection (seq bigserial PRIMARY KEY, event_id uuid, key text, n int, "
                "pid int DEFAULT pg_backend_pid())");
        db.exec(R"(CREATE FUNCTION apply_event(topic text, key text, payload jsonb, headers jsonb, event_id uuid)
            RETURNS void LANGUAGE sql AS $$
                INSERT INTO projection (event_id, key, n) VALUES (event_id, key, (payload->>'n')::int)
            $$)");
        db.exec("GRANT ALL ON projection, projection_seq_seq TO consumer_user");
        db.exec("SELECT inbox_consumer_create('accounting', 'consumer_user')");
        for (int s = 0; s < kShards; ++s)
            start_process({PG_OUTBOX_RELAY_BINARY, "publish", "--group", "p/" + std::to_string(s), "--pg",
                           pg_->conninfo("app", "relay_user"), "--redis", redis_->address(), "--stream",
                           "outbox:{topic}:{shard}", "--poll-interval", "50ms", "--retry-min", "20ms", "--retry-max",
                           "300ms", "--batch-size", "50"});
    }

    Process& start_worker(const std::string& worker, const std::vector<std::string>& extra = {}) {
        std::vector<std::string> args{PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting", "--pg",
                                      pg_->conninfo("sink", "consumer_user"), "--redis", redis_->address(),
                                      "--worker", worker, "--stream", kStreamTemplate, "--shards",
                                      std::to_string(kShards), "--pool", "--pool-lease", "3s", "--pool-renew",
                                      "500ms", "--block", "100ms", "--batch-size", "20", "--handler",
                                      "SELECT apply_event($1, $2, $3, $4, $5)", "--retry-min", "20ms",
                                      "--retry-max", "300ms", "--log-level", "debug"};
        args.insert(args.end(), extra.begin(), extra.end());
        return start_process(args);
    }

    PgConnection sink() { return PgConnection(sink_, "tests"); }

    long long sink_count(const std::string& sql) {
        auto db = sink();
        return std::stoll(query_column(db, sql)[0]);
    }

    // Emits n events on rotating keys, a few per transaction; each key's
    // payload "n" counts its events from 0 in emit order.
    void emit_keyed(int n) {
        auto pg = connect();
        for (int i = 0; i < n; i += 5) {
            pg.exec("BEGIN");
            for (int j = i; j < std::min(n, i + 5); ++j) {
                const int key = j % kKeys;
                pg.exec("SELECT outbox_emit('orders', $1, jsonb_build_object('n', $2::int))",
                        {"k" + std::to_string(key), std::to_string(next_n_[key]++)});
            }
            pg.exec("COMMIT");
        }
        emitted_ += n;
    }

    bool wait_applied(std::chrono::milliseconds timeout = 60s) {
        return eventually([&] { return sink_count("SELECT count(*) FROM projection") >= emitted_; }, timeout, 100ms);
    }

    // The first events applied out of their key's emit order, "<key>
    // n=<emitted as> at <applied as>" ("" when none).
    std::string misplaced() {
        auto db = sink();
        return query_column(db, "SELECT coalesce(string_agg(key || ' n=' || n || ' at ' || rn, ', '), '') FROM ("
                                "SELECT key, n, rn FROM (SELECT key, n, row_number() OVER (PARTITION BY key "
                                "ORDER BY seq) - 1 AS rn FROM projection) x WHERE n <> rn ORDER BY key, rn "
                                "LIMIT 20) y")[0];
    }

    // Every emitted event applied once, and each key's in emit order.
    void expect_once_in_key_order() {
        EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), emitted_);
        EXPECT_EQ(sink_count("SELECT count(DISTINCT event_id) FROM projection"), emitted_);
        EXPECT_EQ(misplaced(), "") << "events of a key applied out of emit order";
    }

    // The worker token holding each stream's lease ("" when none).
    std::map<std::string, std::string> lease_holders() {
        auto redis = redis_->connect();
        std::map<std::string, std::string> out;
        for (int s = 0; s < kShards; ++s) {
            const auto stream = "outbox:orders:" + std::to_string(s);
            auto r = redis.command({"GET", StreamPool::lease_key("accounting", stream)});
            out[stream] = r->type == REDIS_REPLY_STRING ? std::string(reply_text(r.get())) : "";
        }
        return out;
    }

    // Whether each stream is held, by workers whose names start with one
    // of "workers" each holding one stream.
    bool one_stream_each(const std::set<std::string>& workers) {
        std::set<std::string> holders;
        for (const auto& [stream, token] : lease_holders()) {
            const auto worker = token.substr(0, token.find('#'));
            if (!workers.count(worker)) return false;
            holders.insert(worker);
        }
        return holders.size() == workers.size();
    }

    long long pending() {
        auto redis = redis_->connect();
        long long n = 0;
        for (int s = 0; s < kShards; ++s) {
            auto r = redis.command({"XPENDING", "outbox:orders:" + std::to_string(s), "accounting"});
            n += r->type == REDIS_REPLY_ARRAY ? r->element[0]->integer : 0;
        }
        return n;
    }

    // Emits in the background until stopped.
    class Emitter {
    public:
        explicit Emitter(PoolTest& t) : thread_([this, &t] {
            while (!stop_) {
                t.emit_keyed(20);
                std::this_thread::sleep_for(50ms);
            }
        }) {}
        ~Emitter() { stop(); }
        void stop() {
            stop_ = true;
            if (thread_.joinable()) thread_.join();
        }

    private:
        std::atomic<bool> stop_{false};
        std::thread thread_;
    };

    std::string sink_;
    long long emitted_ = 0;
    std::map<int, int> next_n_;
};

// Two workers, then four: the streams are shared out (two each, then one
// each), every event applies once and each key's events in emit order; a
// stream is applied by one worker at a time: each session's applies to a
// shard form one run, never interleaved with another's.
TEST_F(PoolTest, WorkersShareTheShardsAndKeepEachKeysOrder) {
    start_worker("w1");
    start_worker("w2");
    emit_keyed(400);
    ASSERT_TRUE(wait_applied());
    ASSERT_TRUE(eventually(
        [&] {
            std::map<std::string, int> per_worker;
            for (const auto& [stream, token] : lease_holders()) per_worker[token.substr(0, token.find('#'))]++;
            return per_worker == std::map<std::string, int>{{"w1", 2}, {"w2", 2}};
        },
        20s));
    start_worker("w3");
    start_worker("w4");
    {
        Emitter emitter(*this);
        ASSERT_TRUE(eventually([&] { return one_stream_each({"w1", "w2", "w3", "w4"}); }, 30s)) << [&] {
            std::string s;
            for (const auto& [stream, token] : lease_holders()) s += stream + "=" + token + " ";
            return s;
        }();
        std::this_thread::sleep_for(500ms);
    }
    emit_keyed(200);
    ASSERT_TRUE(wait_applied());
    ASSERT_TRUE(eventually([&] { return pending() == 0; }, 20s));
    expect_once_in_key_order();
    auto db = sink();
    const auto runs = query_column(
        db, "SELECT count(*) FROM (SELECT pid, lag(pid) OVER (PARTITION BY shard ORDER BY seq) AS before FROM "
            "(SELECT seq, pid, outbox.shard_of('orders', key, " + std::to_string(kShards) + ") AS shard "
            "FROM projection) p) r WHERE before IS DISTINCT FROM pid")[0];
    const auto pairs = query_column(db, "SELECT count(DISTINCT (outbox.shard_of('orders', key, " +
                                            std::to_string(kShards) + "), pid)) FROM projection")[0];
    EXPECT_EQ(runs, pairs) << "a shard was applied by two workers in turn and back";
    EXPECT_GE(std::stoi(pairs), kShards);
}

// A handler that raises for one key: every batch holding one of its
// events fails as one transaction and applies again entry by entry. The
// key's events are dead-lettered alone (--on-failure skip: with the pool's
// default, park-key, the key's first event would park the rest), and every
// other key's apply once, in emit order, whichever worker holds their
// shard.
TEST_F(PoolTest, BatchesThatFailAsOneKeepEachKeysOrder) {
    {
        auto db = sink();
        db.exec(R"(CREATE OR REPLACE FUNCTION apply_event(topic text, key text, payload jsonb, headers jsonb,
                                                          event_id uuid)
            RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                IF key = 'k5' THEN
                    RAISE EXCEPTION 'handler refuses key %', key;
                END IF;
                INSERT INTO projection (event_id, key, n) VALUES (event_id, key, (payload->>'n')::int);
            END $$)");
    }
    auto& w1 = start_worker("w1", {"--max-deliveries", "1", "--on-failure", "skip"});
    auto& w2 = start_worker("w2", {"--max-deliveries", "1", "--on-failure", "skip"});
    emit_keyed(480);
    const long long refused = 480 / kKeys;
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") >= 480 - refused; }, 60s))
        << w1.log() << w2.log();
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.dead_letters") == refused; }, 30s))
        << w1.log() << w2.log();
    ASSERT_TRUE(eventually([&] { return pending() == 0; }, 20s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection"), 480 - refused);
    EXPECT_EQ(sink_count("SELECT count(DISTINCT event_id) FROM projection"), 480 - refused);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE key <> 'k5'"), 0);
    EXPECT_EQ(misplaced(), "") << "events of a key applied out of emit order";
    EXPECT_NE((w1.log() + w2.log()).find("failed as one, applying it again entry by entry"), std::string::npos);
}

// A worker killed with SIGKILL mid-run: its streams are taken over once
// its lease runs out, its pending entries applied first; nothing is lost
// and each key's events stay in order.
TEST_F(PoolTest, KilledWorkersStreamsAreTakenOver) {
    auto& victim = start_worker("w1");
    start_worker("w2");
    start_worker("w3");
    start_worker("w4");
    {
        Emitter emitter(*this);
        ASSERT_TRUE(eventually([&] { return one_stream_each({"w1", "w2", "w3", "w4"}); }, 30s));
        ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") > 300; }, 30s));
        victim.signal(SIGKILL);
        EXPECT_EQ(victim.wait(10s), 128 + SIGKILL);
        // The survivors hold every stream, one of them two.
        ASSERT_TRUE(eventually(
            [&] {
                std::set<std::string> holders;
                for (const auto& [stream, token] : lease_holders()) holders.insert(token.substr(0, token.find('#')));
                return holders == std::set<std::string>{"w2", "w3", "w4"};
            },
            30s));
        const auto before = sink_count("SELECT count(*) FROM projection");
        ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") > before + 100; }, 30s));
    }
    ASSERT_TRUE(wait_applied());
    ASSERT_TRUE(eventually([&] { return pending() == 0; }, 20s));
    expect_once_in_key_order();
}

// The pool's default, --on-failure park-key, with 4 workers: key k5 fails
// from its first event, parks, and is dead-lettered after
// --max-deliveries while every other key applies. The owner of k5's
// stream is killed (SIGKILL) while k5 waits: the new owner goes on
// parking k5's new events. After the fix, inbox_redrive applies k5's dead
// letter and then its parked events, in emit order, through the worker
// that holds the stream now.
TEST_F(PoolTest, ParkedKeySurvivesItsWorkersDeathAndRedrivesInOrder) {
    {
        auto db = sink();
        db.exec("CREATE TABLE broken (key text)");
        db.exec("INSERT INTO broken VALUES ('k5')");
        db.exec("GRANT SELECT ON broken TO consumer_user");
        db.exec(R"(CREATE OR REPLACE FUNCTION apply_event(topic text, key text, payload jsonb, headers jsonb,
                                                          event_id uuid)
            RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM broken b WHERE b.key = apply_event.key) THEN
                    RAISE EXCEPTION 'handler refuses key %', key;
                END IF;
                INSERT INTO projection (event_id, key, n) VALUES (event_id, key, (payload->>'n')::int);
            END $$)");
    }
    std::map<std::string, Process*> workers;
    for (const char* w : {"w1", "w2", "w3", "w4"})
        workers[w] = &start_worker(w, {"--max-deliveries", "2", "--min-idle", "300ms", "--claim-interval", "100ms"});
    ASSERT_TRUE(eventually([&] { return one_stream_each({"w1", "w2", "w3", "w4"}); }, 30s));
    emit_keyed(240);
    const long long k5_events = 240 / kKeys;
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") >= 240 - k5_events; }, 60s));
    ASSERT_TRUE(eventually(
        [&] {
            return sink_count("SELECT count(*) FROM outbox.parked_keys WHERE key = 'k5' AND state = 'dead'") == 1 &&
                   sink_count("SELECT count(*) FROM outbox.parked_entries") == k5_events - 1;
        },
        30s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection WHERE key = 'k5'"), 0);
    std::string stream;
    {
        auto db = sink();
        stream = query_column(db, "SELECT stream FROM outbox.parked_keys")[0];
    }
    const auto token = lease_holders()[stream];
    const auto owner = token.substr(0, token.find('#'));
    ASSERT_TRUE(workers.count(owner)) << token;
    workers[owner]->signal(SIGKILL);
    EXPECT_EQ(workers[owner]->wait(10s), 128 + SIGKILL);
    ASSERT_TRUE(eventually(
        [&] {
            const auto now = lease_holders()[stream];
            return !now.empty() && now.substr(0, now.find('#')) != owner;
        },
        30s));
    // New events of k5 while it waits park behind the dead letter.
    emit_keyed(48);
    ASSERT_TRUE(eventually(
        [&] { return sink_count("SELECT count(*) FROM outbox.parked_entries") == k5_events + 1; }, 30s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM projection WHERE key = 'k5'"), 0);

    sink().exec("DELETE FROM broken");
    {
        auto db = sink();
        EXPECT_EQ(query_column(db, "SELECT result FROM inbox_redrive('accounting', 'k5')"),
                  std::vector<std::string>{"requested"});
    }
    ASSERT_TRUE(wait_applied());
    ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM outbox.parked_keys") == 0; }, 20s));
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.parked_entries"), 0);
    EXPECT_EQ(sink_count("SELECT count(*) FROM outbox.dead_letters WHERE replayed_at IS NULL"), 0);
    ASSERT_TRUE(eventually([&] { return pending() == 0; }, 20s));
    expect_once_in_key_order();
}

// A worker paused (SIGSTOP) past its lease while the others go on: its
// streams are taken over; resumed, it reads nothing more of them (it logs
// the loss, no key's order breaks), and it rejoins, holding a stream again.
TEST_F(PoolTest, PausedWorkerStopsReadingLostStreamsAndRejoins) {
    auto& paused = start_worker("w1");
    start_worker("w2");
    start_worker("w3");
    start_worker("w4");
    {
        Emitter emitter(*this);
        ASSERT_TRUE(eventually([&] { return one_stream_each({"w1", "w2", "w3", "w4"}); }, 30s));
        ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") > 300; }, 30s));
        paused.signal(SIGSTOP);
        ASSERT_TRUE(eventually(
            [&] {
                for (const auto& [stream, token] : lease_holders())
                    if (token.empty() || token.rfind("w1#", 0) == 0) return false;
                return true;
            },
            30s));
        const auto before = sink_count("SELECT count(*) FROM projection");
        ASSERT_TRUE(eventually([&] { return sink_count("SELECT count(*) FROM projection") > before + 100; }, 30s));
        paused.signal(SIGCONT);
        ASSERT_TRUE(eventually([&] { return paused.log().find("pool: lost stream") != std::string::npos; }, 30s))
            << paused.log();
        ASSERT_TRUE(eventually([&] { return one_stream_each({"w1", "w2", "w3", "w4"}); }, 30s));
    }
    ASSERT_TRUE(wait_applied());
    ASSERT_TRUE(eventually([&] { return pending() == 0; }, 20s));
    expect_once_in_key_order();
    EXPECT_TRUE(paused.running());
}

// SIGTERM lets go of the worker's streams at once: another worker takes
// them without waiting for the lease to run out; hostile flags exit 2.
TEST_F(PoolTest, CleanExitReleasesAndBadFlagsExitTwo) {
    auto& leaving = start_worker("w1");
    start_worker("w2");
    ASSERT_TRUE(eventually([&] { return one_stream_each({"w1", "w2"}); }, 30s));
    leaving.signal(SIGTERM);
    EXPECT_EQ(leaving.wait(10s), 0) << leaving.log();
    EXPECT_NE(leaving.log().find("released stream"), std::string::npos) << leaving.log();
    ASSERT_TRUE(eventually([&] { return one_stream_each({"w2"}); }, 30s));
    emit_keyed(100);
    ASSERT_TRUE(wait_applied());
    expect_once_in_key_order();

    for (const auto& [extra, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"--shards", "0"}, "--shards: \"0\" is not a shard count (1 to 256)"},
             {{"--shards", "257"}, "--shards: \"257\" is not a shard count (1 to 256)"},
             {{"--shards", "many"}, "--shards: \"many\" is not a shard count"},
             {{"--pool-lease", "100ms"}, "--pool-lease: must be between 1s and 10m"},
         }) {
        std::vector<std::string> args{PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting",
                                      "--handler", "SELECT 1", "--stream", kStreamTemplate, "--pool"};
        if (extra[0] != "--shards") args.insert(args.end(), {"--shards", "4"});
        args.insert(args.end(), extra.begin(), extra.end());
        auto& bad = start_process(args);
        EXPECT_EQ(bad.wait(10s), 2) << bad.log();
        EXPECT_NE(bad.log().find(message), std::string::npos) << bad.log();
    }
    auto& no_shards = start_process({PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting", "--handler",
                                     "SELECT 1", "--stream", "outbox:orders", "--pool"});
    EXPECT_EQ(no_shards.wait(10s), 2);
    EXPECT_NE(no_shards.log().find("--pool: needs --shards N and a --stream template with {shard}"), std::string::npos)
        << no_shards.log();
}

}  // namespace

namespace {

// The lease logic alone against a real Redis, several pools in one
// process standing for workers: shares, handovers, losses, the keys each
// command is routed by. No PostgreSQL.
class StreamPoolTest : public ::testing::Test {
protected:
    struct Worker {
        Config config;
        Metrics metrics{"consume", "g"};
        std::unique_ptr<RedisConnection> redis;
        std::unique_ptr<StreamPool> pool;
    };

    Worker& add(const std::string& name, std::chrono::milliseconds lease = 10s) {
        auto w = std::make_unique<Worker>();
        w->config.consumer_group = "g:1";
        w->config.worker = name;
        w->config.streams = {"s:0", "s:1", "s:2", "s:3"};
        w->config.pool = true;
        w->config.pool_lease = lease;
        w->config.pool_renew = lease / 3;
        w->redis = std::make_unique<RedisConnection>(redis_.connect());
        auto* conn = w->redis.get();
        w->pool = std::make_unique<StreamPool>(
            w->config, w->metrics, [this, conn](std::string_view key, const std::vector<std::string_view>& argv) {
                // Every command names the key it is routed by (EVAL's
                // first key, or the command's key): a cluster sends it to
                // that key's slot.
                const auto named = argv[0] == "EVAL" ? argv.at(3) : argv.at(1);
                EXPECT_EQ(key, named) << argv[0];
                routed_.insert(std::string(key));
                return redis_conn(conn, argv);
            });
        workers_.push_back(std::move(w));
        return *workers_.back();
    }

    static RedisReply redis_conn(RedisConnection* conn, const std::vector<std::string_view>& argv) {
        return conn->command(argv);
    }

    // No stream is held by two workers at once; the count each holds.
    std::vector<std::size_t> held_counts() {
        std::vector<std::size_t> out;
        for (const auto& s : workers_.front()->config.streams) {
            int holders = 0;
            for (const auto& w : workers_) holders += w->pool->holds(s);
            EXPECT_LE(holders, 1) << s << " held by two workers";
        }
        for (const auto& w : workers_) out.push_back(w->pool->held().size());
        return out;
    }

    RedisServer redis_;
    std::vector<std::unique_ptr<Worker>> workers_;
    std::set<std::string> routed_;
};

TEST_F(StreamPoolTest, SharesJoinsAndLeaves) {
    auto& a = add("a");
    auto& b = add("b");
    auto& c = add("c");
    // Joining takes nothing; the next round each takes up to its share,
    // ceil(4 / 3) = 2, and the third finds nothing left.
    for (auto* w : {&a, &b, &c}) EXPECT_TRUE(w->pool->maintain().empty());
    EXPECT_EQ(a.pool->maintain().size(), 2u);
    EXPECT_EQ(b.pool->maintain().size(), 2u);
    EXPECT_TRUE(c.pool->maintain().empty());
    EXPECT_EQ(held_counts(), (std::vector<std::size_t>{2, 2, 0}));
    // A fourth joins: the share is 1; the two over it let one go each,
    // the two under take them.
    auto& d = add("d");
    d.pool->maintain();
    a.pool->maintain();
    b.pool->maintain();
    EXPECT_EQ(held_counts(), (std::vector<std::size_t>{1, 1, 0, 0}));
    EXPECT_EQ(c.pool->maintain().size(), 1u);
    EXPECT_EQ(d.pool->maintain().size(), 1u);
    EXPECT_EQ(held_counts(), (std::vector<std::size_t>{1, 1, 1, 1}));
    EXPECT_EQ(a.metrics.pool_released.load(), 1u);
    EXPECT_EQ(a.metrics.pool_streams_owned.load(), 1);
    const auto rendered = a.metrics.render();
    const std::string labels = "{mode=\"consume\",consumer=\"\",group=\"g\"";
    EXPECT_NE(rendered.find("pg_outbox_relay_pool_streams_owned" + labels + "} 1"), std::string::npos) << rendered;
    EXPECT_NE(rendered.find("pg_outbox_relay_pool_handovers_total" + labels + ",event=\"taken\"} 2"), std::string::npos)
        << rendered;
    // d leaves cleanly: its stream is free at once and c takes it (the
    // share is 2 again).
    d.pool->leave();
    EXPECT_EQ(held_counts(), (std::vector<std::size_t>{1, 1, 1, 0}));
    EXPECT_EQ(c.pool->maintain().size(), 1u);
    EXPECT_EQ(held_counts(), (std::vector<std::size_t>{1, 1, 2, 0}));
    // The keys: one lease per stream, and the heartbeat set, each routed
    // by itself.
    EXPECT_TRUE(routed_.count(StreamPool::workers_key("g:1")));
    EXPECT_EQ(StreamPool::lease_key("g:1", "s:0"), "pg_outbox:pool:3:g:1:lease:s:0");
    EXPECT_EQ(StreamPool::workers_key("g:1"), "pg_outbox:pool:3:g:1:workers");
    EXPECT_NE(StreamPool::lease_key("a", "b:lease:c"), StreamPool::lease_key("a:b", "c"));
}

// A lease taken over behind a worker's back (another token in the key) is
// lost at its next renewal; a lease not renewed in time is lost on the
// worker's own clock, and another worker takes the stream once Redis lets
// the key expire.
TEST_F(StreamPoolTest, LostLeasesAreDroppedAndTakenOver) {
    auto& a = add("a", 1s);
    auto& b = add("b", 1s);
    a.pool->maintain();
    a.pool->maintain();  // alone: takes all four
    EXPECT_EQ(held_counts(), (std::vector<std::size_t>{4, 0}));
    {
        auto redis = redis_.connect();
        redis.command({"SET", StreamPool::lease_key("g:1", "s:2"), "intruder#1"});
    }
    a.pool->maintain();
    EXPECT_FALSE(a.pool->holds("s:2"));
    EXPECT_EQ(a.metrics.pool_lost.load(), 1u);
    // a stops renewing (paused): its holds end on its clock first, then b,
    // which renews, takes what Redis lets expire.
    b.pool->maintain();
    ASSERT_TRUE(eventually([&] { return a.pool->held().empty(); }, 10s));
    ASSERT_TRUE(eventually(
        [&] {
            b.pool->maintain();
            return b.pool->held().size() == 3;
        },
        10s, 200ms));
    EXPECT_EQ(held_counts(), (std::vector<std::size_t>{0, 3}));
    // a wakes: it logs and counts the loss, keeps nothing, and rejoins.
    a.pool->maintain();
    EXPECT_EQ(a.metrics.pool_lost.load(), 4u);
    EXPECT_EQ(held_counts(), (std::vector<std::size_t>{0, 3}));
}

}  // namespace
