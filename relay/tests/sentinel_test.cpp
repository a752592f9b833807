// Integration tests of --redis sentinel://: a master, a replica and three
// sentinels on loopback; the master fails over while writers emit, first
// by SENTINEL FAILOVER (the old master keeps taking writes until Sentinel
// demotes it, and loses them), then by killing the master by PID (what the
// replica had not received is lost). The relays follow the master, and
// what Redis lost is republished from the outbox: no event is lost,
// duplicated or reordered.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include "fixture.hpp"
#include "pg_outbox/errors.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

const char* const kMasterName = "pgoutbox";

// How often a substring occurs in a text.
std::size_t occurrences(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
    return n;
}

// A field of a reply that lists fields and values in turn, as text.
std::string field(const redisReply* map, std::string_view name) {
    return std::string(reply_text(map_field(map, name)));
}

class SentinelTest : public RelayTest {
protected:
    void SetUp() override {
        RelayTest::SetUp();  // PostgreSQL, and redis_: the first master
        replica_ = RedisServer::replica_of(*redis_);
        for (int i = 0; i < 3; ++i)
            sentinels_.push_back(std::make_unique<SentinelServer>(kMasterName, redis_->port(), 2));
        ASSERT_TRUE(wait_settled(*redis_, *replica_)) << sentinel_logs();
    }

    void TearDown() override {
        processes_.clear();
        sentinels_.clear();
        replica_.reset();
        RelayTest::TearDown();
    }

    std::string sentinel_url() const {
        std::string url = "sentinel://";
        for (std::size_t i = 0; i < sentinels_.size(); ++i) url += (i ? "," : "") + sentinels_[i]->address();
        return url + "/" + kMasterName;
    }

    std::string sentinel_logs() const {
        std::string out;
        for (const auto& s : sentinels_) out += "--- sentinel " + s->address() + "\n" + s->log();
        return out;
    }

    Process& start_publisher() {
        return start_process({PG_OUTBOX_RELAY_BINARY, "publish", "--group", "g",
                              "--pg", pg_->conninfo("app", "relay_user"), "--redis", sentinel_url(),
                              "--redis-timeout", "2s", "--poll-interval", "50ms", "--retry-min", "20ms",
                              "--retry-max", "300ms", "--stats-interval", "500ms", "--batch-size", "100"});
    }

    // Whether every sentinel names "master", sees the other two sentinels
    // and "replica" as its healthy replica, and the replica is in sync: a
    // failover can start, and choose the replica.
    bool settled(const RedisServer& master, const RedisServer& replica) {
        try {
            for (const auto& s : sentinels_) {
                if (s->master_port() != master.port()) return false;
                auto c = s->connect();
                auto others = c.command({"SENTINEL", "sentinels", kMasterName});
                if (others->elements != sentinels_.size() - 1) return false;
                auto replicas = c.command({"SENTINEL", "replicas", kMasterName});
                bool seen = false;
                for (std::size_t i = 0; i < replicas->elements; ++i) {
                    const redisReply* r = replicas->element[i];
                    if (field(r, "port") == std::to_string(replica.port()) && field(r, "flags") == "slave" &&
                        field(r, "master-link-status") == "ok" &&
                        field(r, "master-port") == std::to_string(master.port()))
                        seen = true;
                }
                if (!seen) return false;
            }
            auto r = replica.connect();
            auto info = std::string(reply_text(r.command({"INFO", "replication"}).get()));
            return info.find("role:slave") != std::string::npos &&
                   info.find("master_link_status:up") != std::string::npos &&
                   info.find("master_port:" + std::to_string(master.port()) + "\r") != std::string::npos;
        } catch (const std::exception&) {
            return false;
        }
    }

    bool wait_settled(const RedisServer& master, const RedisServer& replica) {
        return eventually([&] { return settled(master, replica); }, 60s, 200ms);
    }

    // The server every sentinel names as the master; nullptr while they
    // disagree or name neither.
    RedisServer* named_master() {
        const int port = sentinels_[0]->master_port();
        for (const auto& s : sentinels_)
            if (s->master_port() != port) return nullptr;
        if (port == redis_->port()) return redis_.get();
        if (port == replica_->port()) return replica_.get();
        return nullptr;
    }

    // Fails "from" over to "to" with SENTINEL FAILOVER (retried while the
    // sentinel finds no good replica yet), and waits until every sentinel
    // names "to" and "from" is its replica again.
    void forced_failover(RedisServer& from, RedisServer& to) {
        ASSERT_TRUE(eventually(
            [&] {
                auto c = sentinels_[0]->connect();
                auto r = c.command_raw({"SENTINEL", "FAILOVER", kMasterName});
                return r->type != REDIS_REPLY_ERROR;
            },
            30s, 200ms))
            << sentinel_logs();
        ASSERT_TRUE(eventually([&] { return named_master() == &to; }, 30s, 100ms)) << sentinel_logs();
        ASSERT_TRUE(wait_settled(to, from)) << sentinel_logs();
    }

    // Kills the master "from" by PID; waits until every sentinel names "to".
    void crash_failover(RedisServer& from, RedisServer& to) {
        from.kill();
        ASSERT_TRUE(eventually([&] { return named_master() == &to; }, 60s, 100ms)) << sentinel_logs();
    }

    // The line a relay logs when Sentinel leads it to "server".
    static std::string found(const RedisServer& server) {
        return "named " + server.address() + " as the master \"" + kMasterName + "\"";
    }

    // Emits transactions of 5 events on rotating topics until "done".
    std::thread writer(std::atomic<bool>& done) {
        return std::thread([this, &done] {
            auto pg = connect();
            for (int i = 0; !done; ++i) {
                pg.exec("SELECT count(*) FROM outbox_emit_many($1, NULL, array_fill('{\"x\": 1}'::jsonb, ARRAY[5]))",
                        {kTopics[i % kTopics.size()]});
                std::this_thread::sleep_for(10ms);
            }
        });
    }

    struct WriterStop {
        std::atomic<bool>& done;
        std::thread& w;
        ~WriterStop() {
            done = true;
            if (w.joinable()) w.join();
        }
    };

    std::size_t master_count(RedisServer& master) {
        try {
            auto redis = master.connect();
            std::size_t n = 0;
            for (const auto& t : kTopics) {
                auto r = redis.command({"XLEN", "outbox:" + t});
                n += static_cast<std::size_t>(r->integer);
            }
            return n;
        } catch (const std::exception&) {
            return 0;
        }
    }

    // Each stream of the master holds exactly its topic's committed
    // events, once each, in feed order, with the position as entry id.
    void expect_exactly_once_in_order(RedisServer& master) {
        auto pg = connect();
        auto r = pg.exec("SELECT topic, event_id FROM outbox.event ORDER BY txid, seq");
        std::map<std::string, std::vector<std::string>> want;
        for (int i = 0; i < r.rows(); ++i) want[std::string(r.get(i, 0))].emplace_back(r.get(i, 1));
        auto redis = master.connect();
        for (const auto& t : kTopics) {
            std::vector<std::string> got;
            for (const auto& e : read_stream(redis, "outbox:" + t)) {
                got.push_back(e.fields.at("event_id"));
                EXPECT_EQ(e.id, e.fields.at("position"));
            }
            EXPECT_EQ(got.size(), want[t].size()) << "outbox:" << t;
            EXPECT_TRUE(got == want[t]) << "outbox:" << t << " is not its topic's events once each in feed order";
        }
    }

    std::unique_ptr<RedisServer> replica_;
    std::vector<std::unique_ptr<SentinelServer>> sentinels_;
};

}  // namespace

// The publisher follows two failovers mid-publish, a forced one and a
// crash of the master, and republishes what each new master lacks.
TEST_F(SentinelTest, PublisherFollowsFailoversAndRepublishesWhatWasLost) {
    RedisServer& a = *redis_;
    RedisServer& b = *replica_;
    auto& relay = start_publisher();
    std::atomic<bool> done{false};
    auto w = writer(done);
    WriterStop stop{done, w};
    ASSERT_TRUE(eventually([&] { return master_count(a) > 300; }, 30s)) << relay.log();

    // 1. SENTINEL FAILOVER: a becomes b's replica, and drops what it took
    // after b was promoted.
    forced_failover(a, b);
    ASSERT_TRUE(eventually([&] { return relay.log().find(found(b)) != std::string::npos; }, 30s)) << relay.log();
    const auto before = master_count(b);
    ASSERT_TRUE(eventually([&] { return master_count(b) > before + 300; }, 30s)) << relay.log();

    // 2. The master crashes (SIGKILL) while the relay writes to it: a is
    // promoted without what it had not yet received.
    crash_failover(b, a);
    ASSERT_TRUE(eventually([&] { return occurrences(relay.log(), found(a)) >= 2; }, 30s)) << relay.log();
    const auto after = master_count(a);
    ASSERT_TRUE(eventually([&] { return master_count(a) > after + 300; }, 30s)) << relay.log();

    done = true;
    w.join();
    ASSERT_TRUE(eventually([&] { return master_count(a) >= committed_count(); }, 60s)) << relay.log();
    EXPECT_TRUE(relay.running()) << relay.log();
    expect_exactly_once_in_order(a);
    // The writes the old master took after the forced failover's promotion
    // were lost, found by the stream-loss check and published again.
    EXPECT_NE(relay.log().find("is behind"), std::string::npos) << relay.log();
    relay.signal(SIGTERM);
    EXPECT_EQ(relay.wait(10s), 0) << relay.log();
}

// A consumer follows the same two failovers: every committed event is
// applied once, checked end to end by the history checker.
TEST_F(SentinelTest, ConsumerFollowsFailoversEveryEventAppliedOnce) {
    const auto sink = pg_->create_database("sink");
    {
        PgConnection db(sink, "tests");
        db.exec("CREATE ROLE consumer_user LOGIN IN ROLE outbox_consumer");
        db.exec("CREATE TABLE projection (event_id uuid NOT NULL, applied_at timestamptz NOT NULL DEFAULT "
                "clock_timestamp())");
        db.exec("GRANT INSERT, SELECT ON projection TO consumer_user");
        db.exec("SELECT inbox_consumer_create('accounting', 'consumer_user')");
    }
    RedisServer& a = *redis_;
    RedisServer& b = *replica_;
    auto& relay = start_publisher();
    auto& consumer = start_process({PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "accounting",
                                    "--pg", pg_->conninfo("sink", "consumer_user"), "--redis", sentinel_url(),
                                    "--worker", "w1", "--stream", "outbox:orders", "--stream", "outbox:payments",
                                    "--stream", "outbox:audit",
                                    "--handler", "INSERT INTO projection (event_id) VALUES ($5)",
                                    "--redis-timeout", "2s", "--block", "100ms", "--min-idle", "2s",
                                    "--claim-interval", "500ms", "--retry-min", "20ms", "--retry-max", "300ms"});
    auto applied = [&] {
        PgConnection db(sink, "tests");
        return std::stoul(query_column(db, "SELECT count(DISTINCT event_id) FROM projection")[0]);
    };
    std::atomic<bool> done{false};
    auto w = writer(done);
    WriterStop stop{done, w};
    ASSERT_TRUE(eventually([&] { return applied() > 300; }, 30s)) << consumer.log();

    forced_failover(a, b);
    ASSERT_TRUE(eventually([&] { return consumer.log().find(found(b)) != std::string::npos; }, 30s))
        << consumer.log();
    auto before = applied();
    ASSERT_TRUE(eventually([&] { return applied() > before + 300; }, 30s)) << consumer.log();

    crash_failover(b, a);
    ASSERT_TRUE(eventually([&] { return occurrences(consumer.log(), found(a)) >= 2; }, 30s)) << consumer.log();
    before = applied();
    ASSERT_TRUE(eventually([&] { return applied() > before + 300; }, 30s)) << consumer.log();

    done = true;
    w.join();
    ASSERT_TRUE(eventually([&] { return applied() >= committed_count(); }, 60s))
        << relay.log() << consumer.log();
    EXPECT_TRUE(relay.running());
    EXPECT_TRUE(consumer.running());

    // The history, in the checker's files.
    const std::string history = dir_ + "/history";
    std::filesystem::create_directories(history);
    {
        auto pg = connect();
        std::ofstream out(history + "/committed.tsv");
        auto r = pg.exec(
            "SELECT event_id, topic, txid || '-' || seq, extract(epoch FROM created_at) FROM outbox.event");
        for (int i = 0; i < r.rows(); ++i)
            out << r.get(i, 0) << '\t' << r.get(i, 1) << '\t' << r.get(i, 2) << '\t' << r.get(i, 3) << '\n';
    }
    {
        auto redis = a.connect();
        std::ofstream out(history + "/streams.tsv");
        for (const auto& t : kTopics)
            for (const auto& e : read_stream(redis, "outbox:" + t))
                out << "outbox:" << t << '\t' << e.id << '\t' << e.fields.at("event_id") << '\t'
                    << e.fields.at("position") << '\n';
    }
    {
        PgConnection db(sink, "tests");
        std::ofstream applies(history + "/applied.tsv");
        auto r = db.exec("SELECT event_id, extract(epoch FROM applied_at) FROM projection");
        for (int i = 0; i < r.rows(); ++i) applies << r.get(i, 0) << '\t' << r.get(i, 1) << '\n';
        std::ofstream dead(history + "/dead_letters.tsv");
        auto d = db.exec("SELECT stream, entry_id, coalesce(event_id::text, '') FROM outbox.dead_letters");
        for (int i = 0; i < d.rows(); ++i) dead << d.get(i, 0) << '\t' << d.get(i, 1) << '\t' << d.get(i, 2) << '\n';
        EXPECT_EQ(d.rows(), 0) << "dead letters after a failover";
    }
    const std::string command = std::string(PG_OUTBOX_CHECK_BINARY) + " " + history + " 2>&1";
    FILE* p = ::popen(command.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string verdict;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p) != nullptr) verdict += buf;
    const int status = ::pclose(p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << verdict << consumer.log();
    std::cout << verdict;
}

// A connection found through Sentinel whose server turns replica under it
// (demoted without its clients being disconnected: it answers READONLY)
// says it lost the master, and the relay asks Sentinel again; a
// connection to a named address does not.
TEST_F(SentinelTest, ConnectionNoticesItsMasterTurnedReplica) {
    RedisConnection c(RedisAddress::parse(sentinel_url()), "", 0, 2s);
    EXPECT_EQ(c.server().port, redis_->port());
    EXPECT_FALSE(c.lost_master());
    RedisConnection plain = redis_->connect();
    EXPECT_FALSE(plain.lost_master());
    {
        auto admin = redis_->connect();
        admin.command({"REPLICAOF", "127.0.0.1", std::to_string(replica_->port())});
    }
    auto r = c.command_raw({"XADD", "outbox:orders", "*", "f", "v"});
    ASSERT_EQ(r->type, REDIS_REPLY_ERROR);
    EXPECT_EQ(reply_text(r.get()).substr(0, 8), "READONLY");
    EXPECT_TRUE(c.lost_master());
    EXPECT_FALSE(plain.lost_master());
    auto admin = redis_->connect();
    admin.command({"REPLICAOF", "NO", "ONE"});
}

// Settings that cannot work exit 2 at start, naming --redis: a master
// name no sentinel monitors, an address that is no Sentinel.
TEST_F(SentinelTest, SettingsThatCannotWorkExit2) {
    std::string unknown = sentinel_url();
    unknown = unknown.substr(0, unknown.rfind('/')) + "/nosuch";
    auto run = [&](const std::string& redis) -> Process& {
        return start_process({PG_OUTBOX_RELAY_BINARY, "publish", "--group", "g",
                              "--pg", pg_->conninfo("app", "relay_user"), "--redis", redis,
                              "--redis-timeout", "2s", "--retry-max", "300ms"});
    };
    auto& a = run(unknown);
    EXPECT_EQ(a.wait(30s), 2) << a.log();
    EXPECT_NE(a.log().find("--redis: sentinel"), std::string::npos) << a.log();
    EXPECT_NE(a.log().find("monitors no master named \"nosuch\""), std::string::npos) << a.log();
    auto& b = run("sentinel://" + redis_->address() + "/" + kMasterName);
    EXPECT_EQ(b.wait(30s), 2) << b.log();
    EXPECT_NE(b.log().find("is not a Redis Sentinel"), std::string::npos) << b.log();
    // A sentinel that does not answer, beside one that does: the next is asked.
    auto& c = run("sentinel://127.0.0.1:" + std::to_string(free_port()) + "," + sentinels_[1]->address() + "/" +
                  kMasterName);
    ASSERT_TRUE(eventually([&] { return c.log().find(found(*redis_)) != std::string::npos; }, 30s)) << c.log();
    EXPECT_TRUE(c.running());
}

// A data node user the ACL refuses ROLE and INFO (no @admin, no
// @dangerous): the master is taken as Sentinel names it, and the URL's
// user and password are the data node's.
TEST_F(SentinelTest, AclUserWithoutRoleTakesSentinelsWord) {
    {
        auto admin = redis_->connect();
        admin.command({"ACL", "SETUSER", "relay", "on", ">pw", "~*", "&*", "+@all", "-@admin", "-@dangerous"});
        auto refused = admin.command_raw({"AUTH", "relay", "pw"});
        ASSERT_NE(refused->type, REDIS_REPLY_ERROR) << reply_text(refused.get());
        EXPECT_EQ(admin.command_raw({"ROLE"})->type, REDIS_REPLY_ERROR);
    }
    std::string url = sentinel_url();
    url.insert(std::string_view("sentinel://").size(), "relay:pw@");
    const auto address = RedisAddress::parse(url);
    RedisConnection c(address, address.password, 0, 2s);
    EXPECT_EQ(c.server().port, redis_->port());
    EXPECT_EQ(c.server().user, "relay");
    EXPECT_FALSE(c.lost_master());
    EXPECT_EQ(c.command_raw({"XADD", "s", "*", "f", "v"})->type, REDIS_REPLY_STRING);
    // A wrong password for the data node is the settings' fault, at once.
    EXPECT_THROW(RedisConnection(address, "wrong", 0, 2s), RedisSetupError);

    // Refused ROLE only: INFO replication tells, a replica included.
    {
        auto admin = redis_->connect();
        admin.command({"ACL", "SETUSER", "noroles", "on", ">pw", "~*", "&*", "+@all", "-role"});
    }
    url = sentinel_url();
    url.insert(std::string_view("sentinel://").size(), "noroles:pw@");
    const auto info_only = RedisAddress::parse(url);
    RedisConnection d(info_only, info_only.password, 0, 2s);
    EXPECT_EQ(d.server().port, redis_->port());
    EXPECT_FALSE(d.lost_master());
    {
        auto admin = redis_->connect();
        admin.command({"REPLICAOF", "127.0.0.1", std::to_string(replica_->port())});
    }
    EXPECT_TRUE(d.lost_master());
    auto admin = redis_->connect();
    admin.command({"REPLICAOF", "NO", "ONE"});
}

// A sentinel with a password of its own: refused without
// --sentinel-password or with a wrong one (exit 2 naming it, the password
// not shown), found with it; the data nodes need none.
TEST_F(SentinelTest, SentinelPasswordIsTheSentinelsOwn) {
    SentinelServer guarded(kMasterName, redis_->port(), 2, 1000ms, 4000ms, {"requirepass Sentinel-Pw"});
    auto address = RedisAddress::parse("sentinel://" + guarded.address() + "/" + kMasterName);
    for (const char* password : {"", "Sekr3t-wrong"}) {
        address.sentinel_password = password;
        try {
            RedisConnection c(address, "", 0, 2s);
            ADD_FAILURE() << "connected with sentinel password \"" << password << "\"";
        } catch (const RedisSetupError& e) {
            EXPECT_EQ(e.setting(), "--sentinel-password") << e.what();
            EXPECT_EQ(std::string(e.what()).find("Sekr3t"), std::string::npos) << e.what();
        }
    }
    address.sentinel_password = "Sentinel-Pw";
    RedisConnection c(address, "", 0, 2s);
    EXPECT_EQ(c.server().port, redis_->port());

    auto& relay = start_process({PG_OUTBOX_RELAY_BINARY, "publish", "--group", "g",
                                 "--pg", pg_->conninfo("app", "relay_user"),
                                 "--redis", "sentinel://" + guarded.address() + "/" + kMasterName,
                                 "--sentinel-password", "Sekr3t-wrong", "--redis-timeout", "2s"});
    EXPECT_EQ(relay.wait(30s), 2) << relay.log();
    EXPECT_NE(relay.log().find("--sentinel-password: sentinel " + guarded.address()), std::string::npos)
        << relay.log();
    EXPECT_EQ(relay.log().find("Sekr3t"), std::string::npos) << relay.log();
}
