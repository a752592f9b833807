// Every wait is bounded (I-18): a link that takes nothing, cut with a TCP
// proxy that stops forwarding without closing (no netem), is found within
// --pg-timeout or --redis-timeout; the leader stops saying it leads once
// its lease can no longer have been renewed; SIGTERM is honoured within
// about a second while a link is cut; SIGHUP is ignored with a log line;
// a flood of idle connections to the metrics endpoint neither blinds
// /health nor takes the data connections' descriptors. The measured
// figures are recorded as test properties; the assertions only hold them
// to generous bounds.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "fixture.hpp"

namespace pg_outbox::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

long long ms_since(Clock::time_point t0) {
    return std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
}

// /health's answer ("" when it gives none within a few seconds).
std::string health(int port) {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(3, 0);
    auto res = client.Get("/health");
    return res ? std::to_string(res->status) + " " + res->body : std::string();
}

std::size_t count_of(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

// The soft and hard limits of open files of a process, from /proc.
std::pair<std::string, std::string> open_files_limit(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/limits");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Max open files", 0) != 0) continue;
        std::istringstream fields(line.substr(14));
        std::string soft, hard;
        fields >> soft >> hard;
        return {soft, hard};
    }
    return {};
}

std::size_t open_descriptors(pid_t pid) {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd"))
        ++n;
    return n;
}

class NetBoundsTest : public RelayTest {
protected:
    std::string proxied_pg(const TcpProxy& proxy) const {
        return "host=127.0.0.1 port=" + std::to_string(proxy.port()) + " dbname=app user=relay_user";
    }
};

// A leader whose link to PostgreSQL takes nothing: /health stops saying
// "leader" once its lease has run out (here well before --pg-timeout
// finds the dead link), the link is found dead within --pg-timeout, the
// relay publishes again after the link heals, and SIGTERM while the link
// is cut ends it within about a second.
TEST_F(NetBoundsTest, BlackholedPostgresIsFoundAndTheLeaderStopsSayingItLeads) {
    TcpProxy proxy(pg_->port());
    const int metrics_port = free_port();
    auto& relay = start_relay({"--pg", proxied_pg(proxy), "--lease", "3s", "--pg-timeout", "8s",
                               "--metrics-address", "127.0.0.1:" + std::to_string(metrics_port)});
    emit(10);
    ASSERT_TRUE(wait_all_published()) << relay.log();
    ASSERT_TRUE(eventually([&] { return health(metrics_port).find("ok leader") != std::string::npos; },
                           seconds(20)))
        << relay.log();

    proxy.blackhole();
    const auto cut = Clock::now();
    emit(5, 10);  // a batch for the leader to fetch, on a link that takes nothing

    // Past the lease, no longer "leader", while the wait on the dead link
    // still runs (--pg-timeout 8s against a lease of 3s).
    std::string said;
    ASSERT_TRUE(eventually(
        [&] {
            said = health(metrics_port);
            return !said.empty() && said.find("leader") == std::string::npos;
        },
        seconds(30), milliseconds(200)))
        << said << relay.log();
    const auto stopped_leading_ms = ms_since(cut);
    RecordProperty("health_stopped_saying_leader_ms", std::to_string(stopped_leading_ms));
    EXPECT_NE(said.find("not leading"), std::string::npos) << said;
    EXPECT_EQ(count_of(relay.log(), "no answer from PostgreSQL"), 0u)
        << "the lease, not the dead link's detection, must end the leadership here\n" << relay.log();

    // Found dead within --pg-timeout (a generous bound for a loaded machine).
    ASSERT_TRUE(eventually([&] { return relay.log().find("no answer from PostgreSQL within 8000 ms") !=
                                        std::string::npos; },
                           seconds(40), milliseconds(100)))
        << relay.log();
    RecordProperty("pg_blackhole_detected_ms", std::to_string(ms_since(cut)));

    // Healed: publishing resumes.
    std::this_thread::sleep_for(seconds(2));
    proxy.forward();
    const auto healed = Clock::now();
    ASSERT_TRUE(wait_all_published(seconds(60))) << relay.log();
    RecordProperty("pg_heal_to_published_ms", std::to_string(ms_since(healed)));

    // Cut again, with the relay waiting on the link: SIGTERM is honoured
    // at once.
    proxy.blackhole();
    emit(1, 15);
    std::this_thread::sleep_for(seconds(2));
    const auto term = Clock::now();
    relay.signal(SIGTERM);
    const int code = relay.wait(seconds(6));
    RecordProperty("sigterm_to_exit_ms", std::to_string(ms_since(term)));
    EXPECT_EQ(code, 0) << relay.log();
    EXPECT_LT(ms_since(term), 6000) << relay.log();
}

// A link to Redis that takes nothing, with the default bounds: SIGTERM
// still ends the relay within about a second, not after --redis-timeout.
TEST_F(NetBoundsTest, SigtermIsHonouredWhileRedisIsBlackholed) {
    TcpProxy proxy(redis_->port());
    auto& relay = start_relay({"--redis", "127.0.0.1:" + std::to_string(proxy.port())});
    emit(5);
    ASSERT_TRUE(wait_all_published()) << relay.log();

    proxy.blackhole();
    emit(5, 5);  // the leader writes them on a link that takes nothing
    std::this_thread::sleep_for(seconds(2));
    const auto term = Clock::now();
    relay.signal(SIGTERM);
    const int code = relay.wait(seconds(8));
    RecordProperty("sigterm_to_exit_ms", std::to_string(ms_since(term)));
    EXPECT_EQ(code, 0) << relay.log();
    EXPECT_LT(ms_since(term), 5000) << "the default --redis-timeout is 10s: the wait was not cut short\n"
                                    << relay.log();
}

// The same link, found dead within --redis-timeout; publishing resumes
// after it heals, nothing lost.
TEST_F(NetBoundsTest, BlackholedRedisIsFoundWithinTheTimeout) {
    TcpProxy proxy(redis_->port());
    auto& relay = start_relay({"--redis", "127.0.0.1:" + std::to_string(proxy.port()), "--redis-timeout", "2s"});
    emit(5);
    ASSERT_TRUE(wait_all_published()) << relay.log();
    proxy.blackhole();
    const auto cut = Clock::now();
    emit(5, 5);
    ASSERT_TRUE(eventually([&] { return relay.log().find("no answer from Redis") != std::string::npos; },
                           seconds(30), milliseconds(100)))
        << relay.log();
    RecordProperty("redis_blackhole_detected_ms", std::to_string(ms_since(cut)));
    proxy.forward();
    const auto healed = Clock::now();
    ASSERT_TRUE(wait_all_published(seconds(60))) << relay.log();
    RecordProperty("redis_heal_to_published_ms", std::to_string(ms_since(healed)));
}

// Consume mode shares the bounds: a consumer whose PostgreSQL link takes
// nothing finds it within --pg-timeout, and SIGTERM ends it at once.
TEST_F(NetBoundsTest, ConsumerBoundsItsWaitsOnPostgres) {
    {
        auto pg = connect();
        pg.exec("CREATE ROLE consumer_user LOGIN IN ROLE outbox_consumer");
        pg.exec("CREATE TABLE public.seen (event_id uuid)");
        pg.exec("GRANT INSERT ON public.seen TO consumer_user");
        pg.exec("CREATE FUNCTION public.apply_event(topic text, key text, payload jsonb, headers jsonb, "
                "event_id uuid) RETURNS void LANGUAGE sql AS 'INSERT INTO public.seen VALUES (event_id)'");
        pg.exec("SELECT inbox_consumer_create('c', 'consumer_user')");
    }
    TcpProxy proxy(pg_->port());
    auto redis = redis_->connect();
    auto add = [&](const std::string& event_id) {
        redis.command({"XADD", "s", "*", "event_id", event_id, "topic", "t", "key", "k", "payload", "{}",
                       "position", "0/1", "created_at", "now"});
    };
    add("00000000-0000-0000-0000-000000000001");
    auto& consumer = start_process(
        {PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "c", "--stream", "s", "--handler",
         "SELECT public.apply_event($1, $2, $3, $4, $5)", "--pg",
         "host=127.0.0.1 port=" + std::to_string(proxy.port()) + " dbname=app user=consumer_user", "--redis",
         redis_->address(), "--pg-timeout", "2s", "--retry-min", "20ms", "--retry-max", "300ms", "--block", "100ms",
         "--log-level", "debug"});
    ASSERT_TRUE(eventually(
        [&] {
            auto pg = connect();
            return query_column(pg, "SELECT count(*) FROM public.seen")[0] == "1";
        },
        seconds(30)))
        << consumer.log();
    proxy.blackhole();
    const auto cut = Clock::now();
    add("00000000-0000-0000-0000-000000000002");
    ASSERT_TRUE(eventually([&] { return consumer.log().find("no answer from PostgreSQL within 2000 ms") !=
                                        std::string::npos; },
                           seconds(30), milliseconds(100)))
        << consumer.log();
    RecordProperty("consume_pg_blackhole_detected_ms", std::to_string(ms_since(cut)));
    const auto term = Clock::now();
    consumer.signal(SIGTERM);
    const int code = consumer.wait(seconds(6));
    RecordProperty("sigterm_to_exit_ms", std::to_string(ms_since(term)));
    EXPECT_EQ(code, 0) << consumer.log();
    EXPECT_LT(ms_since(term), 5000) << consumer.log();
}

// SIGHUP is logged and ignored: the relay goes on publishing, and a
// SIGTERM after it still resigns.
TEST_F(NetBoundsTest, SighupIsIgnoredWithALogLine) {
    auto& relay = start_relay();
    emit(5);
    ASSERT_TRUE(wait_all_published()) << relay.log();
    relay.signal(SIGHUP);
    ASSERT_TRUE(eventually([&] { return relay.log().find("SIGHUP received and ignored") != std::string::npos; },
                           seconds(10)))
        << relay.log();
    EXPECT_TRUE(relay.running()) << relay.log();
    emit(5, 5);
    ASSERT_TRUE(wait_all_published()) << relay.log();
    relay.signal(SIGTERM);
    EXPECT_EQ(relay.wait(), 0) << relay.log();
    EXPECT_NE(relay.log().find("resigned the leadership"), std::string::npos) << relay.log();
}

// A flood of idle connections to the metrics endpoint, in a relay kept to
// 160 descriptors: /health still answers, Redis can still be connected to
// again (its connection killed during the flood), and publishing goes on.
// Also: the relay raised its soft limit of open files to the hard one.
TEST_F(NetBoundsTest, IdleConnectionFloodLeavesHealthAndReconnectsAlone) {
    const int metrics_port = free_port();
    // The relay starts with a soft limit below the hard one (inherited).
    rlimit mine{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &mine), 0);
    ASSERT_GT(mine.rlim_max, 2048u);
    rlimit low = mine;
    low.rlim_cur = 512;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
    auto& relay = start_relay({"--metrics-address", "127.0.0.1:" + std::to_string(metrics_port)});
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &mine), 0);
    emit(5);
    ASSERT_TRUE(wait_all_published()) << relay.log();
    const auto [soft, hard] = open_files_limit(relay.pid());
    EXPECT_EQ(soft, hard) << "the soft limit of open files was not raised to the hard one";

    // Then kept to 160 descriptors, soft and hard.
    rlimit tight{160, 160};
    ASSERT_EQ(prlimit(relay.pid(), RLIMIT_NOFILE, &tight, nullptr), 0);

    std::vector<int> idle;
    for (int i = 0; i < 400; ++i) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<uint16_t>(metrics_port));
        ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);  // in progress; never sends a byte
        idle.push_back(fd);
    }
    std::this_thread::sleep_for(seconds(2));
    const auto descriptors = open_descriptors(relay.pid());
    RecordProperty("relay_descriptors_during_flood", std::to_string(descriptors));

    // Redis drops the relay's connection: it must connect again.
    auto redis = redis_->connect();
    redis.command({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
    emit(5, 5);
    const auto t0 = Clock::now();
    std::string said;
    EXPECT_TRUE(eventually(
        [&] {
            said = health(metrics_port);
            return said.rfind("200 ", 0) == 0;
        },
        seconds(40), milliseconds(200)))
        << said << relay.log();
    RecordProperty("health_answered_during_flood_ms", std::to_string(ms_since(t0)));
    EXPECT_TRUE(wait_all_published(seconds(40))) << relay.log();
    EXPECT_EQ(relay.log().find("Too many open files"), std::string::npos) << relay.log();
    EXPECT_LT(descriptors, 140u);
    for (int fd : idle) ::close(fd);
    relay.signal(SIGTERM);
    EXPECT_EQ(relay.wait(), 0) << relay.log();
}

}  // namespace
}  // namespace pg_outbox::testing
