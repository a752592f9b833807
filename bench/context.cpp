// The benchmark's context (bench.hpp): the servers, the programs it runs,
// the CPU sampler, the statistics and the report. The run's shape is the
// one bench/run.sh had: one PostgreSQL and one Redis for every workload,
// each workload adding rows to one markdown table, written to
// bench/results/<time>.md with the charts beside it.
#include "bench.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;

namespace pg_outbox::bench {

std::atomic<bool> g_interrupted{false};

const char* const kPayload =
    R"({"order_id": 1234567, "customer": "customer-000000001", "amount": 12345, "currency": "EUR", )"
    R"("status": "confirmed", "note": "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod"})";

void nap(double seconds) {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
    while (std::chrono::steady_clock::now() < until) {
        if (g_interrupted) throw Interrupted();
        const std::chrono::steady_clock::duration left = until - std::chrono::steady_clock::now();
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(left, std::chrono::milliseconds(50)));
    }
    if (g_interrupted) throw Interrupted();
}

double epoch_now() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

namespace {

std::string printf_g(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string chomp(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
}

// Whether a program of that name is on PATH.
bool on_path(const std::string& name) {
    const char* path = std::getenv("PATH");
    std::istringstream in(path ? path : "");
    std::string dir;
    while (std::getline(in, dir, ':'))
        if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return true;
    return false;
}

}  // namespace

std::string stats(std::vector<double> values) {
    if (values.empty()) return "";
    std::sort(values.begin(), values.end());
    const std::size_t n = values.size();
    const double median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
    return printf_g(median) + " (" + printf_g(values.front()) + "–" + printf_g(values.back()) + ")";
}

std::string fixed(double value, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, value);
    return buf;
}

double rounded(double value, int digits) { return std::stod(fixed(value, digits)); }

std::string result(const std::string& output, const std::string& name) {
    const std::string prefix = "RESULT " + name + " ";
    std::istringstream in(output);
    std::string line, found;
    while (std::getline(in, line))
        if (line.rfind(prefix, 0) == 0) found = line.substr(prefix.size());
    return found;
}

std::string knob(const std::string& name, const std::string& fallback) {
    const char* v = std::getenv(("BENCH_" + name).c_str());
    return v && *v ? v : fallback;
}

int knob_int(const std::string& name, int fallback) {
    const std::string v = knob(name, "");
    if (v.empty()) return fallback;
    try {
        std::size_t used = 0;
        const int n = std::stoi(v, &used);
        if (used == v.size()) return n;
    } catch (const std::exception&) {
    }
    throw BenchError("BENCH_" + name + " is \"" + v + "\", not a whole number");
}

std::vector<std::string> words(const std::string& text) {
    std::istringstream in(text);
    std::vector<std::string> out;
    std::string w;
    while (in >> w) out.push_back(w);
    return out;
}

// ---- the context

Context::Context(std::string relay_path, std::string self_path, std::string rows_dir)
    : rounds(knob_int("ROUNDS", 3)),
      events(knob_int("EVENTS", 1000000)),
      relay(std::move(relay_path)),
      self(std::move(self_path)),
      rows_dir_(std::move(rows_dir)) {
    if (!rows_dir_.empty()) fs::create_directories(rows_dir_);
    work = testing::make_temp_dir("pg_outbox_bench.");
    fs::permissions(work, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);
    const int pg_port = testing::free_port();
    const int redis_port = testing::free_port();
    say("starting PostgreSQL on 127.0.0.1:" + std::to_string(pg_port) + " and Redis on 127.0.0.1:" +
        std::to_string(redis_port));
    // Production's durability: fsync and synchronous_commit stay on.
    pg = start_pg("pg", {}, pg_port);
    redis = std::make_unique<testing::RedisServer>(false, std::vector<std::string>{},
                                                   testing::Placement{work + "/redis", redis_port, false});
}

Context::~Context() {
    // The servers first (by PID, in their destructors), then the directory.
    redis.reset();
    pg.reset();
    std::error_code ec;
    fs::remove_all(work, ec);
}

std::unique_ptr<testing::PgServer> Context::start_pg(const std::string& name, const std::vector<std::string>& more,
                                                     int port) {
    std::vector<std::string> settings{"shared_buffers = '1GB'", "max_wal_size = '8GB'", "checkpoint_timeout = '30min'",
                                      "max_connections = 50", "shared_preload_libraries = 'pg_outbox'"};
    settings.insert(settings.end(), more.begin(), more.end());
    return std::make_unique<testing::PgServer>(settings, testing::Placement{work + "/" + name, port, false});
}

void Context::say(const std::string& line) { std::cout << "==> " << line << std::endl; }

std::string Context::conninfo(const std::string& db) const {
    return "host=127.0.0.1 port=" + std::to_string(pg->port()) + " user=postgres dbname=" + db;
}

RunResult Context::run(const std::vector<std::string>& argv, std::chrono::seconds timeout) {
    const std::string out_path = work + "/.run" + std::to_string(run_counter_++);
    RunResult r;
    {
        testing::Process p(argv, out_path);
        const auto until = std::chrono::steady_clock::now() + timeout;
        while (p.running()) {
            if (g_interrupted || std::chrono::steady_clock::now() >= until) {
                testing::stop_pid(p.pid(), SIGTERM, std::chrono::seconds(10));
                p.wait(std::chrono::seconds(1));
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        r.status = p.running() ? -1 : p.wait(std::chrono::milliseconds(0));
    }
    if (g_interrupted) throw Interrupted();
    r.output = read_file(out_path);
    std::error_code ec;
    fs::remove(out_path, ec);
    return r;
}

std::string Context::must(const std::vector<std::string>& argv, std::chrono::seconds timeout) {
    auto r = run(argv, timeout);
    // What it said goes on, as it did from the script.
    if (!r.ok()) {
        std::cerr << r.output;
        throw BenchError(argv.front() + " exited with " + std::to_string(r.status));
    }
    return r.output;
}

std::string Context::psql(const std::string& db, const std::vector<std::string>& statements, int port) {
    std::vector<std::string> argv{"psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
                                  "-p", std::to_string(port ? port : pg->port()), "-U", "postgres", "-d", db};
    for (const auto& s : statements) argv.insert(argv.end(), {"-c", s});
    return must(argv);
}

std::string Context::value(const std::string& db, const std::string& sql, int port) {
    return chomp(must({"psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
                       std::to_string(port ? port : pg->port()), "-U", "postgres", "-d", db, "-At", "-c", sql}));
}

std::unique_ptr<testing::Process> Context::spawn(const std::vector<std::string>& argv, const std::string& log) {
    return std::make_unique<testing::Process>(argv, work + "/" + log);
}

void Context::stop(std::unique_ptr<testing::Process>& process) {
    if (!process) return;
    if (process->running()) {
        process->signal(SIGCONT);
        testing::stop_pid(process->pid(), SIGTERM, std::chrono::seconds(60));
    }
    process->wait(std::chrono::seconds(1));
    process.reset();
}

double Context::pgbench(const std::string& db, const std::vector<std::string>& options, int port) {
    std::vector<std::string> argv{"pgbench", "-n", "-h", "127.0.0.1", "-p", std::to_string(port ? port : pg->port()), "-U",
                                  "postgres"};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back(db);
    const auto out = must(argv);
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("tps = ", 0) == 0) return std::stod(line.substr(6));
    throw BenchError("pgbench reported no tps:\n" + out);
}

std::string Context::write(const std::string& name, const std::string& text) {
    const std::string path = work + "/" + name;
    std::ofstream(path) << text;
    return path;
}

void Context::flush_redis() {
    auto c = redis->connect();
    c.command_raw({"FLUSHALL"});
}

void Context::load_events(const std::string& db, long long n, const std::string& headers) {
    const std::string N = std::to_string(n);
    // The event numbers of transaction c: i from 1 to at most 10,000.
    const std::string numbers = "FROM generate_series(1, least(10000, " + N + " - c * 10000)) i)";
    const std::string headers_array =
        headers.empty() ? std::string() : ",\n\t\t\t\t(SELECT array_agg(" + headers + ") " + numbers;
    psql(db, {R"(
	DO $$
	DECLARE c integer;
	BEGIN
		FOR c IN 0 .. ()" + N + R"( - 1) / 10000 LOOP
			PERFORM count(*) FROM outbox_emit_many('topic' || (c % 4),
				(SELECT array_agg(lpad((c * 10000 + i)::text, 16, '0')) )" + numbers + R"(,
				(SELECT array_agg(jsonb_build_object('order_id', c * 10000 + i, 'customer', 'customer-000000001',
					'amount', 12345, 'currency', 'EUR', 'status', 'confirmed',
					'note', 'lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor'))
				   )" + numbers + headers_array + R"();
			COMMIT;
		END LOOP;
	END
	$$;)"});
}

void Context::wait_streams(long long n) {
    must({self, "wait-entries", "--redis", redis_address(), "--count", std::to_string(n), "--timeout", "1800"});
}

void Context::create_database(const std::string& db) {
    psql("postgres", {"CREATE DATABASE " + db});
    psql(db, {"CREATE EXTENSION pg_outbox"});
}

void Context::drop_database(const std::string& db) { psql("postgres", {"DROP DATABASE " + db}); }

void Context::settle(const std::string& db) { psql(db, {"VACUUM", "CHECKPOINT"}); }

void Context::rewind_shards(const std::string& db, const std::string& name) {
    psql(db, {"SELECT outbox_rewind(name || CASE WHEN shards > 1 THEN '/' || shard ELSE '' END, 'beginning')\n"
              "\t\tFROM outbox.groups WHERE name = '" + name + "'; UPDATE outbox.groups SET streams = '{}'"});
}

std::vector<std::unique_ptr<testing::Process>> Context::start_shard_relays(const std::string& db,
                                                                           const std::string& name, int n,
                                                                           const std::string& address,
                                                                           const std::string& relay_path) {
    std::vector<std::unique_ptr<testing::Process>> out;
    for (int k = 0; k < n; ++k) {
        const std::string group = n > 1 ? name + "/" + std::to_string(k) : name;
        out.push_back(spawn({relay_path.empty() ? relay : relay_path, "publish", "--pg", conninfo(db), "--redis",
                             address, "--group", group, "--batch-size", "1000", "--stream", "outbox:{topic}:{shard}",
                             "--log-level", "warn"},
                            "relay_" + std::to_string(k) + ".log"));
    }
    return out;
}

void Context::stop_all(std::vector<std::unique_ptr<testing::Process>>& processes) {
    for (auto& p : processes) stop(p);
    processes.clear();
}

std::map<pid_t, double> Context::cpu_snapshot(const std::vector<pid_t>& pids) {
    static const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
    std::map<pid_t, double> out;
    for (pid_t p : pids) {
        const std::string stat = read_file("/proc/" + std::to_string(p) + "/stat");
        // The fields after the command name, which may hold spaces.
        const auto close = stat.rfind(") ");
        if (close == std::string::npos) continue;
        std::istringstream in(stat.substr(close + 2));
        std::string field;
        double utime = 0, stime = 0;
        for (int i = 1; i <= 13 && in >> field; ++i) {
            if (i == 12) utime = std::stod(field);
            if (i == 13) stime = std::stod(field);
        }
        out[p] = (utime + stime) / hz;
    }
    return out;
}

double Context::cpu_between(const std::map<pid_t, double>& a, const std::map<pid_t, double>& b) {
    double s = 0;
    for (const auto& [pid, t] : b) {
        const auto it = a.find(pid);
        s += t - (it == a.end() ? 0 : it->second);
    }
    return s;
}

std::vector<pid_t> Context::pg_processes() const {
    std::vector<pid_t> out{pg->pid()};
    for (const auto& e : fs::directory_iterator("/proc")) {
        const auto name = e.path().filename().string();
        if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
        const std::string stat = read_file(e.path().string() + "/stat");
        const auto close = stat.rfind(") ");
        if (close == std::string::npos) continue;
        std::istringstream in(stat.substr(close + 2));
        std::string state;
        pid_t ppid = 0;
        if (in >> state >> ppid && ppid == pg->pid()) out.push_back(static_cast<pid_t>(std::stol(name)));
    }
    return out;
}

void Context::chart(const std::string& name, const std::string& script) {
    if (chart_prefix.empty() || !on_path("gnuplot")) return;
    const std::string png = chart_prefix + "-" + name + ".png";
    std::string text = script;
    const auto at = text.find("@OUTPUT@");
    if (at != std::string::npos) text.replace(at, 8, png);
    must({"gnuplot", write(name + ".gp", text)});
    charts.push_back(name + ":" + png);
    if (!rows_dir_.empty()) std::ofstream(rows_dir_ + "/charts", std::ios::app) << name << ":" << png << "\n";
}

void Context::begin_workload(const std::string& name) { workload_ = name; }

void Context::row(const std::string& cells) {
    const std::string line = "| " + cells + " |\n";
    table_ += line;
    if (!rows_dir_.empty()) std::ofstream(rows_dir_ + "/" + workload_ + ".md", std::ios::app) << line;
}

// ---- the run

namespace {

void on_signal(int) { g_interrupted = true; }

}  // namespace

int cores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    return static_cast<int>(std::thread::hardware_concurrency());
}

namespace {

std::string first_line_field(const std::string& text, int index) {
    std::istringstream in(text.substr(0, text.find('\n')));
    std::string w;
    for (int i = 0; i <= index && in >> w; ++i) {
    }
    return w;
}

}  // namespace

int run_benchmark(const std::vector<std::string>& only, const std::string& relay, const std::string& results_dir,
                  const std::string& rows_dir, const std::string& chart_prefix) {
    for (const auto& name : only) {
        const auto& all = workloads();
        if (std::none_of(all.begin(), all.end(), [&](const Workload& w) { return name == w.name; })) {
            std::cerr << "pg_outbox_bench run: no workload \"" << name << "\"\n";
            return 2;
        }
    }
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    // A baseline's statement may run for minutes on a large backlog.
    const std::string self = fs::read_symlink("/proc/self/exe").string();
    std::string report;
    try {
        Context ctx(relay, self, rows_dir);
        const std::time_t t = std::time(nullptr);
        char stamp[32], when[32];
        std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H%M%SZ", std::gmtime(&t));
        std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
        ctx.chart_prefix = chart_prefix;
        if (ctx.chart_prefix.empty() && !results_dir.empty()) {
            fs::create_directories(results_dir);
            ctx.chart_prefix = fs::absolute(results_dir).string() + "/" + stamp;
        }
        for (const auto& w : workloads()) {
            if (!only.empty() && std::find(only.begin(), only.end(), w.name) == only.end()) continue;
            ctx.begin_workload(w.name);
            w.run(ctx);
        }
        long mem_kb = 0;
        {
            std::istringstream in(read_file("/proc/meminfo"));
            std::string key;
            while (in >> key)
                if (key == "MemTotal:") {
                    in >> mem_kb;
                    break;
                }
        }
        utsname u{};
        ::uname(&u);
        const std::string pg_version = first_line_field(ctx.must({testing::pg_bin() + "/postgres", "--version"}), 2);
        // The version of the Redis server the run used, as it reports it.
        std::string redis_version = "?";
        {
            auto c = ctx.redis->connect();
            auto info = c.command_raw({"INFO", "server"});
            const std::string text = info->str ? std::string(info->str, info->len) : "";
            const auto v = text.find("redis_version:");
            if (v != std::string::npos) redis_version = text.substr(v + 14, text.find_first_of("\r\n", v) - v - 14);
        }
        std::ostringstream out;
        out << "# pg_outbox benchmark, " << when << "\n\n";
        out << "Machine: " << cores() << " cores, " << fixed(static_cast<double>(mem_kb) / 1048576, 0) << " GiB, "
            << u.sysname << " " << u.release << ".\n";
        out << "PostgreSQL " << pg_version << " (shared_buffers 1GB, fsync and synchronous_commit on,\n";
        out << "pg_outbox in shared_preload_libraries: relays are notified when they wait, not on every commit),\n";
        out << "Redis " << redis_version << " (no persistence), both on this machine.\n";
        const bool scaling = only.empty() || std::find(only.begin(), only.end(), "scaling") != only.end();
        out << "Each figure: median (min–max) of " << ctx.rounds << " interleaved rounds"
            << (scaling ? " (" + knob("SCALING_ROUNDS", std::to_string(ctx.rounds)) + " for scaling)" : "")
            << "; ratios computed round by round.\n\n";
        out << "| measure | median (min–max) | target |\n|---|---|---|\n" << ctx.table();
        for (const auto& c : ctx.charts)
            out << "\n![" << c.substr(0, c.find(':')) << "](" << fs::path(c.substr(c.find(':') + 1)).filename().string()
                << ")\n";
        report = out.str();
        if (!results_dir.empty()) {
            fs::create_directories(results_dir);
            const std::string path = results_dir + "/" + stamp + ".md";
            std::ofstream(path) << report;
            std::cout << "\n" << report << "\nwritten to " << path;
            for (std::size_t i = 0; i < ctx.charts.size(); ++i)
                std::cout << (i ? " " : " and ") << ctx.charts[i].substr(ctx.charts[i].find(':') + 1);
            std::cout << "\n";
        }
    } catch (const Interrupted&) {
        std::cerr << "pg_outbox_bench run: interrupted\n";
        return 130;
    } catch (const std::exception& e) {
        std::cerr << "pg_outbox_bench run: " << e.what() << "\n";
        return 1;
    }
    return 0;
}

}  // namespace pg_outbox::bench
