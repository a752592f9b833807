// pg_outbox's test kit: the servers of the relay's tests, the soak test and
// the benchmarks, started one way. See the header for who owns what.
#include "pg_outbox/testkit/servers.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <random>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace pg_outbox::testing {

namespace fs = std::filesystem;

namespace {

// Runs a command, as the "postgres" user when we are root; throws on failure.
void run_as_postgres(const std::string& command) {
    std::string full = ::geteuid() == 0 ? "runuser -u postgres -- " + command : command;
    if (std::system(full.c_str()) != 0) throw std::runtime_error("command failed: " + full);
}

// In a forked child about to exec a server or the relay: the child dies
// with the test process, also when a crashed test runs no destructors.
void die_with_parent(pid_t parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
}

// pg_ctl detaches the postmaster from the test process, so a watchdog
// process stops it (fast shutdown) once the test process is gone.
pid_t watch_over(pid_t server) {
    const pid_t test = ::getpid();
    const pid_t watchdog = ::fork();
    if (watchdog == 0) {
        while (::getppid() == test) ::sleep(1);
        ::kill(server, SIGINT);
        ::_exit(0);
    }
    return watchdog;
}

pid_t read_pid_file(const std::string& path) {
    std::ifstream in(path);
    pid_t pid = -1;
    in >> pid;
    return pid;
}

void write_pid_file(const std::string& path, pid_t pid) {
    std::ofstream out(path);
    out << pid << '\n';
    if (!out) throw std::runtime_error("cannot write " + path);
}

// Whether a process runs: a zombie (killed, not yet reaped by a parent
// that is not us) has ended.
bool alive(pid_t pid) {
    if (pid <= 0 || ::kill(pid, 0) != 0) return false;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto paren = line.rfind(')');
    return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

// Starts a program with its output appended to a log file. An attached
// child dies with this process; a detached one is a new session's leader
// whose parent (a short-lived intermediate) is gone, so that it outlives
// us and is reaped by the system. Returns its PID.
pid_t spawn(const std::vector<std::string>& args, const std::string& log_path, bool detached) {
    const pid_t self = ::getpid();
    int pipe_fds[2];
    if (detached && ::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    const pid_t child = ::fork();
    if (child < 0) throw std::runtime_error("fork failed");
    if (child == 0) {
        if (detached) {
            ::setsid();
            const pid_t server = ::fork();
            if (server != 0) {
                // The intermediate: tell the maker the server's PID, go.
                (void)!::write(pipe_fds[1], &server, sizeof server);
                ::_exit(server > 0 ? 0 : 127);
            }
            const int null = ::open("/dev/null", O_RDONLY);
            ::dup2(null, 0);
        } else {
            die_with_parent(self);
        }
        int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        std::vector<std::string> copy = args;
        std::vector<char*> argv;
        for (auto& a : copy) argv.push_back(a.data());
        argv.push_back(nullptr);
        if (copy[0].find('/') == std::string::npos)
            ::execvp(argv[0], argv.data());
        else
            ::execv(argv[0], argv.data());
        ::_exit(127);
    }
    if (!detached) return child;
    ::close(pipe_fds[1]);
    pid_t server = -1;
    const bool got = ::read(pipe_fds[0], &server, sizeof server) == static_cast<ssize_t>(sizeof server);
    ::close(pipe_fds[0]);
    ::waitpid(child, nullptr, 0);
    if (!got || server <= 0) throw std::runtime_error("could not start " + args[0]);
    return server;
}

// Stops a server the kit spawned: reaps it when it is our child.
void stop_spawned(pid_t pid, int sig, bool detached) {
    if (pid <= 0) return;
    if (detached) {
        stop_pid(pid, sig);
        return;
    }
    ::kill(pid, sig);
    ::waitpid(pid, nullptr, 0);
}

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// A placement's directory: the one given (made if missing), else a new
// temporary one.
std::string place_dir(const Placement& placement, const std::string& prefix) {
    if (placement.dir.empty()) return make_temp_dir(prefix);
    fs::create_directories(placement.dir);
    ::chmod(placement.dir.c_str(), 0755);
    return fs::absolute(placement.dir).lexically_normal().string();
}

}  // namespace

// PostgreSQL's programs; PG_OUTBOX_PG_BIN names another installation's
// (a copy of the tree with this checkout's extension installed into it by
// "make install DESTDIR=...", so that tests need not use the system's).
const std::string& pg_bin() {
    static const std::string bin = [] {
        const char* b = std::getenv("PG_OUTBOX_PG_BIN");
        return std::string(b && *b ? b : "/usr/lib/postgresql/15/bin");
    }();
    return bin;
}

const std::string& engine() {
    static const std::string chosen = [] {
        const char* e = std::getenv("PG_OUTBOX_ENGINE");
        return std::string(e && *e ? e : "c");
    }();
    if (chosen != "c" && chosen != "sql")
        throw std::runtime_error("PG_OUTBOX_ENGINE must be c or sql, not \"" + chosen + "\"");
    return chosen;
}

const std::string& extension_name() {
    static const std::string c = "pg_outbox", sql = "pg_outbox_sql";
    return engine() == "sql" ? sql : c;
}

bool stop_pid(pid_t pid, int sig, std::chrono::milliseconds timeout) {
    if (!alive(pid)) return false;
    ::kill(pid, sig);
    // Our own child (a server started attached) is reaped here.
    auto gone = [pid] {
        ::waitpid(pid, nullptr, WNOHANG);
        return !alive(pid);
    };
    if (!eventually(gone, timeout, std::chrono::milliseconds(50))) {
        ::kill(pid, SIGKILL);
        eventually(gone, std::chrono::seconds(10), std::chrono::milliseconds(50));
    }
    return true;
}

int stop_servers_in(const std::string& dir) {
    int stopped = 0;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return 0;
    std::vector<std::pair<pid_t, int>> redis;
    std::vector<pid_t> postgres;
    for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) break;
        const auto name = it->path().filename().string();
        if (name == "postmaster.pid")
            postgres.push_back(read_pid_file(it->path().string()));
        else if (name == "redis.pid" || name == "sentinel.pid")
            redis.emplace_back(read_pid_file(it->path().string()), SIGTERM);
    }
    // Redis first, continued in case a fault left it stopped.
    for (const auto& [pid, sig] : redis) {
        if (pid > 0) ::kill(pid, SIGCONT);
        stopped += stop_pid(pid, sig) ? 1 : 0;
    }
    for (pid_t pid : postgres) stopped += stop_pid(pid, SIGINT) ? 1 : 0;
    return stopped;
}

// A TCP port on 127.0.0.1 that nothing listens on, below the kernel's
// ephemeral range (as scripts/lib.sh picks them): a port of that range (what
// binding port 0 gives) may become the local end of any outgoing
// connection, of this test's relays and clients included, before the
// server that was to listen on it starts.
int free_port() {
    int low = 32768;
    if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> low;
    if (low <= 11000) low = 32768;
    static std::mt19937 random(std::random_device{}());
    std::uniform_int_distribution<int> pick(10000, low - 1);
    for (int attempt = 0; attempt < 1000; ++attempt) {
        const int port = pick(random);
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = htons(static_cast<std::uint16_t>(port));
        const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
        ::close(fd);
        if (bound) return port;
    }
    throw std::runtime_error("no free TCP port on 127.0.0.1 below the ephemeral range");
}

std::string make_temp_dir(const std::string& prefix) {
    std::string tmpl = (fs::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    ::chmod(tmpl.c_str(), 0755);
    return tmpl;
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
                std::chrono::milliseconds every) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (true) {
        if (condition()) return true;
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(every);
    }
}

// ---- PostgreSQL

namespace {

// The settings of a test's server before its own.
std::vector<std::string> with_test_defaults(const std::vector<std::string>& settings) {
    std::vector<std::string> all{"max_prepared_transactions = 20", "fsync = off", "max_connections = 100"};
    all.insert(all.end(), settings.begin(), settings.end());
    return all;
}

// The SQL engine runs without pg_outbox.so: a test that preloads it tests
// something only the C engine has.
const std::vector<std::string>& checked_for_engine(const std::vector<std::string>& settings) {
    if (engine() == "sql")
        for (const auto& line : settings)
            if (line.find("shared_preload_libraries") != std::string::npos && line.find("pg_outbox") != std::string::npos)
                throw std::logic_error("PG_OUTBOX_ENGINE=sql: \"" + line +
                                       "\" loads pg_outbox.so, which the SQL engine runs without; a test that needs "
                                       "it is C-only (relay/tests/CMakeLists.txt lists them)");
    return settings;
}

}  // namespace

PgServer::PgServer(const std::vector<std::string>& settings)
    : PgServer(with_test_defaults(checked_for_engine(settings)), Placement{}) {}

PgServer::PgServer(const std::vector<std::string>& settings, Placement placement)
    : dir_(place_dir(placement, "pg_outbox_pg_")),
      port_(placement.port ? placement.port : free_port()),
      detached_(placement.detached) {
    prepare_dir();
    run_as_postgres(pg_bin() + "/initdb -D " + dir_ + "/data -A trust -U postgres --no-sync >" + dir_ +
                    "/initdb.log 2>&1");
    configure(settings);
    start();
}

PgServer::PgServer(const PgServer& primary, Standby) : dir_(make_temp_dir("pg_outbox_pg_")), port_(free_port()) {
    prepare_dir();
    // -R: standby.signal and primary_conninfo; the copied configuration
    // gets this server's port and socket directory appended.
    run_as_postgres(pg_bin() + "/pg_basebackup -h 127.0.0.1 -p " + std::to_string(primary.port()) +
                    " -U postgres -D " + dir_ + "/data -R -X stream -c fast --no-sync >" + dir_ + "/basebackup.log 2>&1");
    configure(with_test_defaults({"hot_standby = on"}));
    start();
}

std::unique_ptr<PgServer> PgServer::standby_of(const PgServer& primary) {
    return std::unique_ptr<PgServer>(new PgServer(primary, Standby{}));
}

void PgServer::prepare_dir() {
    if (::geteuid() == 0) {
        passwd* pw = ::getpwnam("postgres");
        if (pw == nullptr) throw std::runtime_error("user postgres is missing");
        ::chown(dir_.c_str(), pw->pw_uid, pw->pw_gid);
    }
}

void PgServer::configure(const std::vector<std::string>& settings) {
    std::ofstream conf(dir_ + "/data/postgresql.conf", std::ios::app);
    conf << "listen_addresses = '127.0.0.1'\nport = " << port_ << "\nunix_socket_directories = '" << dir_ << "'\n";
    for (const auto& line : settings) conf << line << '\n';
}

void PgServer::promote() {
    run_as_postgres(pg_bin() + "/pg_ctl -D " + dir_ + "/data -w -t 60 promote >/dev/null");
}

PgServer::~PgServer() {
    if (detached_) return;
    try {
        stop();
    } catch (...) {
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
}

void PgServer::start() {
    run_as_postgres(pg_bin() + "/pg_ctl -D " + dir_ + "/data -l " + dir_ + "/server.log -w -t 60 start >/dev/null");
    pid_ = read_pid_file(dir_ + "/data/postmaster.pid");
    if (!detached_) watchdog_ = watch_over(pid_);
}

void PgServer::stop() {
    if (watchdog_ > 0) {
        ::kill(watchdog_, SIGKILL);
        ::waitpid(watchdog_, nullptr, 0);
        watchdog_ = -1;
    }
    stop_pid(pid_, SIGINT);  // fast shutdown
    pid_ = -1;
}

std::string PgServer::conninfo(const std::string& db, const std::string& user) const {
    return "host=127.0.0.1 port=" + std::to_string(port_) + " dbname=" + db + " user=" + user;
}

std::string PgServer::log() const { return read_file(dir_ + "/server.log"); }

std::string PgServer::create_database(const std::string& db) {
    {
        PgConnection admin(conninfo("postgres"), "pg_outbox_tests");
        admin.exec("CREATE DATABASE " + db);
    }
    PgConnection conn(conninfo(db), "pg_outbox_tests");
    conn.exec("CREATE EXTENSION " + extension_name());
    return conninfo(db);
}

// ---- Redis

RedisServer::RedisServer(bool aof, std::vector<std::string> extra, Placement placement)
    : dir_(place_dir(placement, "pg_outbox_redis_")),
      port_(placement.port ? placement.port : free_port()),
      detached_(placement.detached),
      aof_(aof),
      extra_(std::move(extra)) {
    for (std::size_t i = 0; i + 1 < extra_.size(); ++i)
        if (extra_[i] == "--requirepass") password_ = extra_[i + 1];
    start();
}

RedisServer::~RedisServer() {
    if (detached_) return;
    stop();
    std::error_code ec;
    fs::remove_all(dir_, ec);
}

void RedisServer::start() {
    std::vector<std::string> args{"redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1", "--dir",
                                  dir_, "--save", "", "--daemonize", "no", "--appendonly", aof_ ? "yes" : "no"};
    if (aof_) args.insert(args.end(), {"--appendfsync", "always"});
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = spawn(args, dir_ + "/redis.log", detached_);
    if (detached_) write_pid_file(dir_ + "/redis.pid", pid_);
    const bool up = eventually(
        [this] {
            try {
                auto r = connect();
                return r.command({"PING"})->type == REDIS_REPLY_STATUS;
            } catch (const std::exception&) {
                return false;
            }
        },
        std::chrono::seconds(20), std::chrono::milliseconds(20));
    if (!up) {
        const std::string tail = log();
        stop_spawned(pid_, SIGKILL, detached_);
        pid_ = -1;
        throw std::runtime_error("redis-server did not start on port " + std::to_string(port_) + ": " +
                                 tail.substr(tail.size() > 2000 ? tail.size() - 2000 : 0));
    }
}

void RedisServer::stop() {
    stop_spawned(pid_, SIGTERM, detached_);
    pid_ = -1;
}

void RedisServer::kill() {
    stop_spawned(pid_, SIGKILL, detached_);
    pid_ = -1;
}

std::unique_ptr<RedisServer> RedisServer::replica_of(const RedisServer& master) {
    std::vector<std::string> extra{"--replicaof", "127.0.0.1", std::to_string(master.port())};
    if (!master.password_.empty()) extra.insert(extra.end(), {"--masterauth", master.password_});
    return std::make_unique<RedisServer>(false, std::move(extra));
}

RedisConnection RedisServer::connect() const {
    // A server bound elsewhere (in a network namespace) that listens on a
    // Unix socket is reached there.
    for (std::size_t i = 0; i + 1 < extra_.size(); ++i) {
        if (extra_[i] == "--unixsocket") {
            RedisAddress unix_socket;
            unix_socket.unix_path = extra_[i + 1];
            return RedisConnection(unix_socket, password_, 0, std::chrono::seconds(5));
        }
    }
    return RedisConnection(RedisAddress::parse(address()), password_, 0, std::chrono::seconds(5));
}

// ---- Redis Sentinel

SentinelServer::SentinelServer(const std::string& master_name, int master_port, int quorum,
                               std::chrono::milliseconds down_after, std::chrono::milliseconds failover_timeout,
                               const std::vector<std::string>& extra, Placement placement)
    : dir_(place_dir(placement, "pg_outbox_sentinel_")),
      master_name_(master_name),
      port_(placement.port ? placement.port : free_port()),
      detached_(placement.detached) {
    for (const auto& line : extra)
        if (line.rfind("requirepass ", 0) == 0) password_ = line.substr(12);
    std::ofstream conf(dir_ + "/sentinel.conf");
    conf << "port " << port_ << "\nbind 127.0.0.1\ndaemonize no\ndir " << dir_ << "\n"
         << "sentinel monitor " << master_name << " 127.0.0.1 " << master_port << ' ' << quorum << '\n'
         << "sentinel down-after-milliseconds " << master_name << ' ' << down_after.count() << '\n'
         << "sentinel failover-timeout " << master_name << ' ' << failover_timeout.count() << '\n'
         << "sentinel parallel-syncs " << master_name << " 1\n";
    for (const auto& line : extra) conf << line << '\n';
    conf.close();
    start();
}

SentinelServer::~SentinelServer() {
    if (detached_) return;
    stop();
    std::error_code ec;
    fs::remove_all(dir_, ec);
}

void SentinelServer::start() {
    pid_ = spawn({"redis-server", dir_ + "/sentinel.conf", "--sentinel"}, dir_ + "/sentinel.log", detached_);
    if (detached_) write_pid_file(dir_ + "/sentinel.pid", pid_);
    const bool up = eventually(
        [this] {
            try {
                return master_port() > 0;
            } catch (const std::exception&) {
                return false;
            }
        },
        std::chrono::seconds(20), std::chrono::milliseconds(20));
    if (!up) {
        const std::string text = log();
        stop_spawned(pid_, SIGKILL, detached_);
        pid_ = -1;
        throw std::runtime_error("redis-server --sentinel did not start: " + text);
    }
}

void SentinelServer::stop() {
    stop_spawned(pid_, SIGTERM, detached_);
    pid_ = -1;
}

RedisConnection SentinelServer::connect() const {
    return RedisConnection(RedisAddress::parse(address()), password_, 0, std::chrono::seconds(5));
}

int SentinelServer::master_port() const {
    try {
        auto c = connect();
        auto r = c.command_raw({"SENTINEL", "get-master-addr-by-name", master_name_});
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) return -1;
        return std::stoi(std::string(reply_text(r->element[1])));
    } catch (const std::exception&) {
        return -1;
    }
}

std::string SentinelServer::log() const { return read_file(dir_ + "/sentinel.log"); }

// ---- Processes

Process::Process(const std::vector<std::string>& args, const std::string& log_path)
    : pid_(spawn(args, log_path, false)), log_path_(log_path) {}

Process::~Process() {
    if (running()) {
        ::kill(pid_, SIGKILL);
        wait();
    }
}

void Process::signal(int sig) { ::kill(pid_, sig); }

bool Process::running() {
    if (status_ != -1) return false;
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == 0) return true;
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
}

int Process::wait(std::chrono::milliseconds timeout) {
    eventually([this] { return !running(); }, timeout, std::chrono::milliseconds(20));
    return status_;
}

std::string Process::log() const { return read_file(log_path_); }

// ---- Reading back

std::vector<Entry> read_stream(RedisConnection& redis, const std::string& key) {
    std::vector<Entry> out;
    std::string start = "-";
    while (true) {
        auto r = redis.command_raw({"XRANGE", key, start, "+", "COUNT", "10000"});
        if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) break;
        for (size_t i = 0; i < r->elements; ++i) {
            const redisReply* e = r->element[i];
            Entry entry;
            entry.id = std::string(reply_text(e->element[0]));
            const redisReply* f = e->element[1];
            for (size_t j = 0; j + 1 < f->elements; j += 2)
                entry.fields[std::string(reply_text(f->element[j]))] = std::string(reply_text(f->element[j + 1]));
            out.push_back(std::move(entry));
        }
        start = "(" + out.back().id;
    }
    return out;
}

std::vector<std::string> query_column(PgConnection& pg, const std::string& sql, const std::vector<Param>& params) {
    auto r = pg.exec(sql, params);
    std::vector<std::string> out;
    for (int i = 0; i < r.rows(); ++i) out.emplace_back(r.is_null(i, 0) ? "" : std::string(r.get(i, 0)));
    return out;
}

}  // namespace pg_outbox::testing

// ---- Redis Cluster

namespace pg_outbox::testing {

void RedisServer::signal(int sig) {
    if (pid_ <= 0) return;
    if (sig == SIGKILL) {
        kill();
        return;
    }
    ::kill(pid_, sig);
}

std::string RedisServer::log() const { return read_file(dir_ + "/redis.log"); }

RedisClusterServers::RedisClusterServers(int masters, int replicas, std::chrono::milliseconds node_timeout,
                                         const std::vector<std::string>& extra, const Placement& placement) {
    const int n = masters * (1 + replicas);
    for (int i = 0; i < n; ++i) {
        Placement node;
        if (!placement.dir.empty()) node.dir = placement.dir + "/node" + std::to_string(i + 1);
        node.detached = placement.detached;
        // The cluster bus listens on a port of its own: port + 10000 may
        // be taken, or above 65535. A port found free is not reserved: a
        // server of another test running beside this one may bind it
        // first, and the node then exits at once. Such a node is started
        // again on other ports, a few times.
        for (int attempt = 1;; ++attempt) {
            std::vector<std::string> args{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                          "--cluster-node-timeout", std::to_string(node_timeout.count()),
                                          "--cluster-port", std::to_string(free_port()),
                                          "--repl-diskless-sync-delay", "0"};
            args.insert(args.end(), extra.begin(), extra.end());
            try {
                nodes_.push_back(std::make_unique<RedisServer>(false, std::move(args), node));
                break;
            } catch (const std::runtime_error& e) {
                if (attempt == 5 || std::string_view(e.what()).find("Address already in use") == std::string_view::npos)
                    throw;
                if (!node.dir.empty()) {
                    std::error_code ec;
                    fs::remove(node.dir + "/nodes.conf", ec);
                }
            }
        }
    }
    std::vector<std::string> args{"--cluster", "create"};
    for (auto& node : nodes_) args.push_back(node->address());
    args.insert(args.end(), {"--cluster-replicas", std::to_string(replicas), "--cluster-yes"});
    std::string log;
    if (redis_cli(args, &log) != 0) throw std::runtime_error("redis-cli --cluster create failed: " + log);
    if (!wait_ok(std::chrono::seconds(60))) throw std::runtime_error("the cluster did not reach cluster_state:ok");
    if (!wait_synced()) throw std::runtime_error("the cluster's replicas did not sync");
}

bool RedisClusterServers::wait_synced(std::chrono::milliseconds timeout) {
    return eventually(
        [this] {
            try {
                for (auto& node : nodes_) {
                    if (!node->running()) continue;
                    auto c = node->connect();
                    const std::string info(reply_text(c.command({"INFO", "replication"}).get()));
                    if (info.find("role:slave") != std::string::npos &&
                        info.find("master_link_status:up") == std::string::npos)
                        return false;
                }
                return true;
            } catch (const std::exception&) {
                return false;
            }
        },
        timeout, std::chrono::milliseconds(100));
}

std::string RedisClusterServers::url() const {
    std::string out = "redis+cluster://";
    for (std::size_t i = 0; i < nodes_.size(); ++i) out += (i ? "," : "") + nodes_[i]->address();
    return out;
}

std::string RedisClusterServers::id(std::size_t i) {
    auto c = nodes_[i]->connect();
    return std::string(reply_text(c.command({"CLUSTER", "MYID"}).get()));
}

int RedisClusterServers::redis_cli(const std::vector<std::string>& args, std::string* log) {
    const auto out = make_temp_dir("pg_outbox_cli_");
    std::string command = "redis-cli";
    for (const auto& a : args) command += " '" + a + "'";
    command += " >" + out + "/out 2>&1 </dev/null";
    const int rc = std::system(command.c_str());
    if (log) {
        std::ifstream in(out + "/out");
        std::stringstream ss;
        ss << in.rdbuf();
        *log += ss.str();
    }
    std::error_code ec;
    fs::remove_all(out, ec);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

int RedisClusterServers::reshard(std::size_t from, std::size_t to, int slots, std::string* log) {
    return redis_cli({"--cluster", "reshard", nodes_[to]->address(), "--cluster-from", id(from), "--cluster-to",
                      id(to), "--cluster-slots", std::to_string(slots), "--cluster-yes"},
                     log);
}

std::string RedisClusterServers::slot_map(std::size_t i) {
    auto c = nodes_[i]->connect();
    auto r = c.command({"CLUSTER", "SLOTS"});
    std::vector<std::string> ranges;
    for (std::size_t k = 0; k < r->elements; ++k) {
        const redisReply* range = r->element[k];
        ranges.push_back(std::to_string(range->element[0]->integer) + "-" +
                         std::to_string(range->element[1]->integer) + ":" +
                         std::to_string(range->element[2]->element[1]->integer));
    }
    std::sort(ranges.begin(), ranges.end());
    std::string out;
    for (const auto& x : ranges) out += x + " ";
    return out;
}

bool RedisClusterServers::ok() {
    try {
        std::optional<std::string> map;
        for (std::size_t i = 0; i < nodes_.size(); ++i) {
            if (!nodes_[i]->running()) continue;
            auto c = nodes_[i]->connect();
            if (std::string(reply_text(c.command({"CLUSTER", "INFO"}).get())).find("cluster_state:ok") ==
                std::string::npos)
                return false;
            const auto m = slot_map(i);
            if (map && *map != m) return false;
            map = m;
        }
        if (!map) return false;
        // Every slot served by a running node: right after a master
        // dies its peers still say ok until they agree it failed.
        for (std::size_t i = 0; i < nodes_.size(); ++i)
            if (!nodes_[i]->running() && map->find(":" + std::to_string(nodes_[i]->port()) + " ") != std::string::npos)
                return false;
        return true;
    } catch (const std::exception&) {
        return false;
    }
}

bool RedisClusterServers::wait_ok(std::chrono::milliseconds timeout) {
    return eventually([this] { return ok(); }, timeout, std::chrono::milliseconds(100));
}

std::size_t RedisClusterServers::master_of(int slot) {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
        if (!nodes_[i]->running()) continue;
        auto c = nodes_[i]->connect();
        auto r = c.command({"CLUSTER", "SLOTS"});
        for (std::size_t k = 0; k < r->elements; ++k) {
            const redisReply* range = r->element[k];
            if (range->element[0]->integer <= slot && slot <= range->element[1]->integer) {
                const auto port = range->element[2]->element[1]->integer;
                for (std::size_t j = 0; j < nodes_.size(); ++j)
                    if (nodes_[j]->port() == port) return j;
            }
        }
    }
    throw std::runtime_error("no master serves slot " + std::to_string(slot));
}

std::size_t RedisClusterServers::replica_of(std::size_t master) {
    const auto master_id = id(master);
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
        if (i == master || !nodes_[i]->running()) continue;
        auto c = nodes_[i]->connect();
        const std::string info(reply_text(c.command({"CLUSTER", "NODES"}).get()));
        // The line of "myself": "<id> <addr> myself,slave <master id> ..."
        std::istringstream lines(info);
        for (std::string line; std::getline(lines, line);) {
            if (line.find("myself") == std::string::npos) continue;
            if (line.find("slave " + master_id) != std::string::npos) return i;
        }
    }
    throw std::runtime_error("master has no replica");
}

std::vector<Entry> RedisClusterServers::read_stream(const std::string& key) {
    const auto slot = key_slot(key);
    auto c = nodes_[master_of(slot)]->connect();
    return testing::read_stream(c, key);
}

}  // namespace pg_outbox::testing

namespace pg_outbox::testing {

TcpProxy::TcpProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int yes = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 64) != 0)
        throw std::runtime_error("TcpProxy: cannot listen");
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
}

TcpProxy::~TcpProxy() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
}

void TcpProxy::reset() {
    reset_ = true;
    while (reset_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void TcpProxy::run() {
    // Each pair: the client's socket and the server's.
    std::vector<std::pair<int, int>> pairs;
    auto close_pair = [](std::pair<int, int>& p, bool rst) {
        for (int fd : {p.first, p.second}) {
            if (rst) {
                linger l{1, 0};  // close with a reset
                ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
            }
            ::close(fd);
        }
    };
    while (!stop_) {
        if (reset_) {
            for (auto& p : pairs) close_pair(p, true);
            pairs.clear();
            reset_ = false;
        }
        const bool cut = blackholed_;
        std::vector<pollfd> fds;
        if (!cut) {
            fds.push_back({listen_fd_, POLLIN, 0});
            for (const auto& p : pairs) {
                fds.push_back({p.first, POLLIN, 0});
                fds.push_back({p.second, POLLIN, 0});
            }
        }
        if (::poll(fds.data(), fds.size(), 20) <= 0 || cut) {
            if (cut) std::this_thread::sleep_for(std::chrono::milliseconds(20));
            continue;
        }
        if (fds[0].revents & POLLIN) {
            const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (client >= 0) {
                const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                sockaddr_in a{};
                a.sin_family = AF_INET;
                a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                a.sin_port = htons(static_cast<uint16_t>(target_port_));
                if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
                    pairs.emplace_back(client, server);
                } else {
                    ::close(server);
                    ::close(client);
                }
            }
        }
        std::vector<std::size_t> closed;
        for (std::size_t i = 0; i < pairs.size(); ++i) {
            for (int side = 0; side < 2; ++side) {
                const auto& f = fds[1 + 2 * i + side];
                if (!(f.revents & (POLLIN | POLLHUP | POLLERR))) continue;
                const int from = side == 0 ? pairs[i].first : pairs[i].second;
                const int to = side == 0 ? pairs[i].second : pairs[i].first;
                char buf[65536];
                const ssize_t n = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                    closed.push_back(i);
                    break;
                }
                for (ssize_t sent = 0; n > 0 && sent < n;) {
                    const ssize_t m = ::send(to, buf + sent, n - sent, MSG_NOSIGNAL);
                    if (m <= 0) break;
                    sent += m;
                }
            }
        }
        for (auto it = closed.rbegin(); it != closed.rend(); ++it) {
            close_pair(pairs[*it], false);
            pairs.erase(pairs.begin() + static_cast<std::ptrdiff_t>(*it));
        }
    }
    for (auto& p : pairs) close_pair(p, false);
}

}  // namespace pg_outbox::testing
