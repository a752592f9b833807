// pg_outbox's test kit: throwaway PostgreSQL clusters, Redis servers,
// Sentinels and Redis Clusters on loopback, and relay processes, for the
// relay's tests, the soak test and the benchmarks (the latter two through
// the pg_outbox_testkit program). Everything is stopped by PID.
//
// A server belongs to the process that made it (the default): it dies with
// that process, also when a crashed test runs no destructors, and its
// destructor stops it and removes its directory. A detached server
// (Placement::detached) outlives its maker, which is how the program starts
// servers for shell scripts; its directory is kept, and it is stopped by
// the PID the kit wrote there (stop_servers_in()).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pg_outbox/pg.hpp"
#include "pg_outbox/redis.hpp"
#include "pg_outbox/redis_cluster.hpp"

namespace pg_outbox::testing {

// A free TCP port on 127.0.0.1.
int free_port();

// Where a server runs and whom it belongs to. An empty dir is a new
// temporary directory, port 0 a free port.
struct Placement {
    std::string dir;
    int port = 0;
    bool detached = false;
};

// PostgreSQL's programs: PG_OUTBOX_PG_BIN, else the system's PostgreSQL 15.
const std::string& pg_bin();

// The engine of pg_outbox the tests install: PG_OUTBOX_ENGINE, "c" (the
// default: CREATE EXTENSION pg_outbox) or "sql" (CREATE EXTENSION
// pg_outbox_sql, and nothing preloaded: what a managed service has).
// Throws std::runtime_error naming the variable for any other value.
const std::string& engine();
// The extension of that engine: "pg_outbox" or "pg_outbox_sql".
const std::string& extension_name();

// Sends a signal to a process and waits until it is gone (a zombie is
// gone); SIGKILL after the timeout. Returns whether it was running.
bool stop_pid(pid_t pid, int sig, std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Stops every server the kit started detached under dir (recursively), by
// the PIDs it recorded there: PostgreSQL's postmaster.pid (fast shutdown,
// so also after a restart), redis.pid and sentinel.pid (SIGCONT, then
// SIGTERM). Returns how many were running.
int stop_servers_in(const std::string& dir);

// A PostgreSQL 15 cluster in a temporary directory. As root, initdb and the
// server run as the "postgres" user.
class PgServer {
public:
    // Extra postgresql.conf lines, e.g. "shared_preload_libraries = 'pg_outbox'",
    // after the tests' defaults (max_prepared_transactions = 20, fsync = off,
    // max_connections = 100). On the SQL engine (engine()), a line that
    // preloads pg_outbox throws std::logic_error: a test that needs it
    // tests the C engine only, and is listed so in relay/tests/CMakeLists.txt.
    explicit PgServer(const std::vector<std::string>& settings = {});
    // Only these settings after listen_addresses, port and the socket
    // directory (the directory itself): what scripts and benchmarks start.
    PgServer(const std::vector<std::string>& settings, Placement placement);
    // A streaming hot standby of "primary" (pg_basebackup -R).
    static std::unique_ptr<PgServer> standby_of(const PgServer& primary);
    ~PgServer();
    PgServer(const PgServer&) = delete;
    PgServer& operator=(const PgServer&) = delete;

    void start();
    void stop();                 // fast shutdown, by the postmaster's PID
    void restart() { stop(); start(); }
    pid_t pid() const { return pid_; }
    const std::string& dir() const { return dir_; }
    // Promotes a standby to a primary; waits until it is one.
    void promote();
    int port() const { return port_; }
    // A connection string for a database, as the superuser unless a user is given.
    std::string conninfo(const std::string& db, const std::string& user = "postgres") const;
    // Creates a database with the extension of engine() installed; returns
    // its conninfo.
    std::string create_database(const std::string& db);
    // The server's log so far.
    std::string log() const;

private:
    struct Standby {};
    PgServer(const PgServer& primary, Standby);
    void prepare_dir();
    void configure(const std::vector<std::string>& settings);

    std::string dir_;
    int port_;
    bool detached_ = false;
    pid_t pid_ = -1;
    pid_t watchdog_ = -1;  // stops the server if the test process dies
};

// A Redis server; with aof, every write is fsynced before it is acknowledged.
class RedisServer {
public:
    // extra: more redis-server arguments, e.g. {"--requirepass", "pw"}; a
    // requirepass is also used by connect().
    explicit RedisServer(bool aof = false, std::vector<std::string> extra = {}, Placement placement = {});
    ~RedisServer();
    RedisServer(const RedisServer&) = delete;
    RedisServer& operator=(const RedisServer&) = delete;

    // A replica of "master" (--replicaof), without persistence.
    static std::unique_ptr<RedisServer> replica_of(const RedisServer& master);

    void start();
    void stop();
    // SIGKILL by PID, as a crash: nothing is saved.
    void kill();
    pid_t pid() const { return pid_; }
    // Sends a signal (SIGKILL, SIGSTOP, SIGCONT); after SIGKILL the
    // process is reaped and start() may start it again.
    void signal(int sig);
    bool running() const { return pid_ > 0; }
    // The server's log so far.
    std::string log() const;
    int port() const { return port_; }
    std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
    const std::string& dir() const { return dir_; }
    RedisConnection connect() const;

private:
    std::string dir_;
    int port_;
    bool detached_;
    bool aof_;
    std::vector<std::string> extra_;
    std::string password_;
    pid_t pid_ = -1;
};

// A Redis Sentinel (redis-server --sentinel) monitoring one master, from a
// configuration file generated in its own directory (Sentinel rewrites it).
// Fails over quickly: the master is down after down_after without an
// answer, and a failover gives up after failover_timeout.
class SentinelServer {
public:
    // extra: more configuration lines; a "requirepass" is also used by
    // connect().
    SentinelServer(const std::string& master_name, int master_port, int quorum,
                   std::chrono::milliseconds down_after = std::chrono::milliseconds(1000),
                   std::chrono::milliseconds failover_timeout = std::chrono::milliseconds(4000),
                   const std::vector<std::string>& extra = {}, Placement placement = {});
    ~SentinelServer();
    SentinelServer(const SentinelServer&) = delete;
    SentinelServer& operator=(const SentinelServer&) = delete;

    void start();
    void stop();
    int port() const { return port_; }
    std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
    RedisConnection connect() const;
    // The port of the master as this sentinel names it; -1 when it cannot say.
    int master_port() const;
    std::string log() const;
    pid_t pid() const { return pid_; }

private:
    std::string dir_;
    std::string master_name_;
    std::string password_;
    int port_;
    bool detached_;
    pid_t pid_ = -1;
};

struct Entry;

// A Redis Cluster on loopback: masters, each with replicas, made by
// redis-cli --cluster create; each node a RedisServer in its own
// directory (its nodes.conf there), stopped by PID. Replicas sync at once
// (--repl-diskless-sync-delay 0: by default a master waits 5 s for more
// replicas, and a replica that never synced refuses to fail over).
class RedisClusterServers {
public:
    // extra: more redis-server arguments for every node. With a
    // placement, node i (from 1) runs in placement.dir/node<i>.
    explicit RedisClusterServers(int masters = 3, int replicas = 1,
                                 std::chrono::milliseconds node_timeout = std::chrono::milliseconds(1000),
                                 const std::vector<std::string>& extra = {}, const Placement& placement = {});
    RedisClusterServers(const RedisClusterServers&) = delete;
    RedisClusterServers& operator=(const RedisClusterServers&) = delete;

    // "redis+cluster://127.0.0.1:p1,127.0.0.1:p2,..." with every node.
    std::string url() const;
    std::size_t size() const { return nodes_.size(); }
    RedisServer& node(std::size_t i) { return *nodes_[i]; }
    // A node's cluster id (CLUSTER MYID).
    std::string id(std::size_t i);
    // The node serving a slot as master now, as its running nodes agree.
    std::size_t master_of(int slot);
    // A replica of a master (the first whose CLUSTER NODES says so).
    std::size_t replica_of(std::size_t master);
    // Whether every running node says cluster_state:ok and they agree
    // on the master of each slot.
    bool ok();
    bool wait_ok(std::chrono::milliseconds timeout = std::chrono::seconds(30));
    // Whether every running replica's link to its master is up (synced).
    bool wait_synced(std::chrono::milliseconds timeout = std::chrono::seconds(30));
    // Runs redis-cli with these arguments; returns its exit code, its
    // output appended to "log".
    int redis_cli(const std::vector<std::string>& args, std::string* log = nullptr);
    // Moves n slots from one master to another (redis-cli --cluster
    // reshard, migrating their keys); returns redis-cli's exit code.
    int reshard(std::size_t from, std::size_t to, int slots, std::string* log = nullptr);
    // A stream as read from the master of its slot.
    std::vector<Entry> read_stream(const std::string& key);

private:
    // Each running node's map from its CLUSTER SLOTS: "from-to:port ...".
    std::string slot_map(std::size_t i);

    std::vector<std::unique_ptr<RedisServer>> nodes_;
};

// A child process (the relay), its output in a log file.
class Process {
public:
    Process(const std::vector<std::string>& argv, const std::string& log_path);
    ~Process();
    Process(const Process&) = delete;
    Process& operator=(const Process&) = delete;

    pid_t pid() const { return pid_; }
    void signal(int sig);
    // Waits for the exit; returns the exit code, or 128 + signal.
    int wait(std::chrono::milliseconds timeout = std::chrono::seconds(30));
    bool running();
    std::string log() const;

private:
    pid_t pid_ = -1;
    std::string log_path_;
    int status_ = -1;
};

// A TCP proxy on loopback between the relay and a server, to cut the
// link without netem: blackhole() stops forwarding and accepting without
// closing anything (what either side sends is left unread, nothing comes
// back: to the relay, a link that drops every packet), forward() heals
// it, reset() closes every connection at once.
class TcpProxy {
public:
    explicit TcpProxy(int target_port);
    ~TcpProxy();
    TcpProxy(const TcpProxy&) = delete;
    TcpProxy& operator=(const TcpProxy&) = delete;

    int port() const { return port_; }
    void blackhole() { blackholed_ = true; }
    void forward() { blackholed_ = false; }
    void reset();

private:
    void run();

    int target_port_;
    int listen_fd_ = -1;
    int port_ = 0;
    std::atomic<bool> blackholed_{false};
    std::atomic<bool> reset_{false};
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

// One stream entry as read back.
struct Entry {
    std::string id;
    std::map<std::string, std::string> fields;
};

std::vector<Entry> read_stream(RedisConnection& redis, const std::string& key);

// Runs a statement, returns the first column of every row.
std::vector<std::string> query_column(PgConnection& pg, const std::string& sql,
                                      const std::vector<Param>& params = {});

// Polls "condition" until it holds or the timeout passes.
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
                std::chrono::milliseconds every = std::chrono::milliseconds(100));

// Makes a temporary directory whose name starts with prefix; returns its path.
std::string make_temp_dir(const std::string& prefix);

// A temporary directory, removed with everything in it when it goes away.
class TempDir {
public:
    explicit TempDir(const std::string& prefix) : path_(make_temp_dir(prefix)) {}
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

}  // namespace pg_outbox::testing
