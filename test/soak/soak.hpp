// pg_outbox_soak: the soak test's state shared by its parts: the servers,
// the relays and workers, the random fault schedule and the helpers that
// run programs and queries (soak.cpp), the faults (faults.cpp) and the
// network mode's hosts and faults (network.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "pg_outbox/testkit/servers.hpp"

namespace pg_outbox::soak {

using testing::PgServer;
using testing::Process;
using testing::RedisClusterServers;
using testing::RedisServer;

using Rows = std::vector<std::vector<std::string>>;

// Thrown out of a wait once SIGINT or SIGTERM came: the soak stops,
// cleans up and exits with 130.
struct Interrupted : std::runtime_error {
    Interrupted() : std::runtime_error("interrupted") {}
};
extern std::atomic<bool> g_interrupted;

// Sleeps, unless interrupted (then throws Interrupted).
void nap(double seconds);
// Polls a condition every 0.1 s for at most "seconds".
bool wait_for(double seconds, const std::function<bool()>& condition);
// Seconds since the epoch, with a fraction.
double epoch_now();
std::string epoch_text(double t);

// What a program said and how it ended.
struct RunResult {
    int status = -1;  // the exit code, 128 + a signal, -1 after the timeout
    std::string output;
    bool ok() const { return status == 0; }
};

class Soak;

// The network mode's hosts, links and faults (network.cpp): network
// namespaces "db" (PostgreSQL and Redis), relay1, relay2 and consumer,
// joined by veth pairs, one per host and server.
class Network {
public:
    explicit Network(Soak& soak);
    ~Network();
    // Why this machine cannot make the namespaces, veth pairs and
    // iptables rules, or "" when it can (it then knows which iptables to use).
    std::string unavailable();
    void setup();
    // Deletes this run's namespaces and interfaces (after killing what
    // still runs in them); never anything of another name.
    void teardown();

    // While it lives, this thread (and what it forks) is in the db
    // namespace: the servers are started there.
    class InDb {
    public:
        explicit InDb(Network& net);
        ~InDb();
        InDb(const InDb&) = delete;
        InDb& operator=(const InDb&) = delete;

    private:
        int saved_ = -1;
    };

    // The host a relay or worker runs on, the prefix of its argv, the
    // address of the db end of its host's link to "pg" or "redis".
    static std::string host_of(const std::string& name);
    std::vector<std::string> exec_prefix(const std::string& host) const;
    static std::string db_addr(const std::string& host, const std::string& kind);
    // PostgreSQL's settings and Redis's arguments for the db host.
    std::vector<std::string> pg_settings() const;
    std::vector<std::string> redis_args() const;
    std::string redis_socket() const;

    // The faults, one at a time, until SOAK_SECONDS - 5.
    void faults();
    // The report's record (network.tsv).
    std::string results;

private:
    void fault(int n);
    std::string leader();
    long long published();
    long long applied();
    void rules(const std::string& op, const std::string& kind, const std::string& dev);
    void cut(const std::string& kind, const std::string& dev);
    void heal(const std::string& kind, const std::string& dev);
    std::string dev(const std::string& host, const std::string& kind, bool db_side = true) const;
    RunResult ip(const std::vector<std::string>& args);

    Soak& soak_;
    std::string prefix_;
    std::string iptables_ = "iptables";
    int shift_ = 0;
    int standby_shift_ = 0;
    bool made_ = false;
};

struct Options {
    int seconds = 120;
    unsigned seed = 0;
    std::string ordering = "commit";
    // c (CREATE EXTENSION pg_outbox) or sql (pg_outbox_sql, nothing
    // preloaded).
    std::string engine = "c";
    std::string mode = "single";
    // Consume with --on-failure park-key, and fail the handler for a hot
    // key for a while now and then (the "key fail" fault).
    bool park = false;
    int fault_max = 0;
    std::string pg_options;
    bool keep = false;
};

class Soak {
public:
    explicit Soak(Options options);
    ~Soak();
    Soak(const Soak&) = delete;
    Soak& operator=(const Soak&) = delete;

    // The whole run; returns the exit status (0 passed, 1 failed).
    int run();

    // ---- what the parts share

    const Options opt;
    std::mt19937 rng;
    // $RANDOM % n as the shell soak drew it.
    int draw(int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); }

    std::string work;
    int pg_port = 0;
    int redis_port = 0;
    std::string pg_host;  // where the soak itself reaches PostgreSQL
    std::unique_ptr<PgServer> pg;
    std::unique_ptr<RedisServer> redis;
    std::unique_ptr<RedisClusterServers> cluster;
    std::unique_ptr<Network> net;
    std::string redis_url;
    int shards = 1;
    int lease_ms = 1000;
    int poll_ms = 200;
    std::vector<std::string> streams, relays, workers;
    std::map<std::string, std::unique_ptr<Process>> procs;

    // (Re)starts a relay or a worker.
    void start(const std::string& name);
    // Stops a relay or a worker as stop_pid did: continued, SIGTERM,
    // SIGKILL after 60 s.
    void stop(const std::string& name);
    void signal(const std::string& name, int sig);
    bool running(const std::string& name);

    // A statement in database "db" on a connection of its own (a restart
    // of PostgreSQL breaks any connection kept); returns the rows as text
    // (NULL as ""). Throws PgError.
    Rows query(const std::string& db, const std::string& sql, const std::vector<std::optional<std::string>>& params = {});
    // The first column of the first row, "" when none.
    std::string value(const std::string& db, const std::string& sql,
                      const std::vector<std::optional<std::string>>& params = {});
    std::string conninfo(const std::string& db) const;

    // A connection to the Redis server that holds a key (in a cluster, the
    // master of its slot now).
    RedisConnection redis_for(const std::string& key);

    // Runs a program (argv, never a shell) with a timeout; its output
    // (standard output and error) is returned and, with a log path,
    // appended there too.
    RunResult run_program(const std::vector<std::string>& argv, std::chrono::seconds timeout = std::chrono::seconds(60),
                          const std::string& log = {});

    // A fault's line in faults.log; a remark of a fault in shell.log.
    void note(const std::string& line);
    void remark(const std::string& line);

    // The relay that leads, by the last leadership line of its log, among
    // the candidates (the first when none says it leads).
    std::string leading_relay(const std::vector<std::string>& candidates);

    // ---- the faults (faults.cpp)
    void fault();          // one single-node fault
    void cluster_fault();  // one Redis Cluster fault
    void key_fault();      // the handler fails for a hot key (SOAK_PARK)
    bool cluster_settled();

private:
    void setup_servers();
    void setup_databases();
    void write_scripts();
    void writers();
    void faults();
    void drain();
    int history_and_check();
    void cleanup();

    // The cluster's helpers (faults.cpp).
    std::size_t cluster_port_index();
    std::vector<std::pair<std::string, int>> cluster_masters();
    std::string cluster_nodes();
    int slot_master(int slot);
    int node_index(int port);
    bool failed_over(int port);
    bool replicating(int port);
    void kill_master(bool lagging);
    void reshard();
    void migrate_stream_slot();
    void cluster_fix();
    RedisConnection node_connection(int port);

    std::ofstream faults_log_;
    std::ofstream shell_log_;
    std::vector<std::string> mix_;
    std::atomic<bool> writers_stop_{false};
    std::thread writers_;
    std::atomic<unsigned> run_counter_{0};
    bool passed_ = false;
};

}  // namespace pg_outbox::soak
