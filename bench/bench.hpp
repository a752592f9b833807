// pg_outbox_bench run: the benchmark as a program on the test kit. The
// Context holds the throwaway servers with the benchmark's settings (fsync
// and synchronous_commit on, as a production server), the knobs read from
// BENCH_* variables, and the helpers every workload uses: psql and pgbench
// run as argv (never a shell string), the relay and the baselines as child
// processes stopped by PID, the /proc CPU sampler and the statistics.
// Each workload is its own unit (bench/workloads/<name>.cpp) that adds its
// rows to the table; workloads.cpp lists them in the table's order.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "pg_outbox/testkit/servers.hpp"

namespace pg_outbox::bench {

// Thrown out of a wait once SIGINT or SIGTERM came: the run stops, cleans
// up (servers and children, by PID) and exits with 130.
struct Interrupted : std::runtime_error {
    Interrupted() : std::runtime_error("interrupted") {}
};
extern std::atomic<bool> g_interrupted;

// Sleeps, unless interrupted (then throws Interrupted).
void nap(double seconds);
// Seconds since the epoch, with a fraction.
double epoch_now();
// The cores this process may run on (nproc).
int cores();

// What a program said and how it ended.
struct RunResult {
    int status = -1;  // the exit code, 128 + a signal, -1 after the timeout
    std::string output;
    bool ok() const { return status == 0; }
};

// Thrown when a program the benchmark depends on fails.
struct BenchError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Median, minimum and maximum of a figure over the rounds, as the table
// prints it: "median (min–max)", each with six significant digits.
std::string stats(std::vector<double> values);
// A number as printf's "%.<digits>f".
std::string fixed(double value, int digits);
// The same, read back: a figure as the table's files held it.
double rounded(double value, int digits);

// The values a line "RESULT <name> <value>" of a program's output gives.
std::string result(const std::string& output, const std::string& name);

// The knobs: BENCH_<name>, else the default.
std::string knob(const std::string& name, const std::string& fallback);
int knob_int(const std::string& name, int fallback);
std::vector<std::string> words(const std::string& text);

class Context {
public:
    // rows_dir: where each workload's rows also go, one file per workload
    // (<rows_dir>/<name>.md), for bench/run.sh; may be empty.
    Context(std::string relay, std::string self, std::string rows_dir);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    // ---- the knobs shared by the workloads
    int rounds;
    int events;

    // ---- the servers
    std::string work;  // the run's directory, removed at the end
    std::unique_ptr<testing::PgServer> pg;
    std::unique_ptr<testing::RedisServer> redis;
    std::string redis_address() const { return redis->address(); }
    // Another PostgreSQL server with the benchmark's settings and more, in
    // <work>/<name>, stopped when the handle goes (port 0: a free one).
    std::unique_ptr<testing::PgServer> start_pg(const std::string& name, const std::vector<std::string>& more,
                                                int port = 0);
    std::string conninfo(const std::string& db) const;

    // ---- programs
    const std::string relay;  // pg_outbox_relay
    const std::string self;   // this program: the baselines are its subcommands
    // Runs a program (argv) to its end; output is its standard output and
    // error. Past the timeout it is killed.
    RunResult run(const std::vector<std::string>& argv, std::chrono::seconds timeout = std::chrono::hours(2));
    // The same, throwing BenchError unless it exits with 0.
    std::string must(const std::vector<std::string>& argv, std::chrono::seconds timeout = std::chrono::hours(2));
    // psql on database db, -X -q -v ON_ERROR_STOP=1, each statement its own
    // -c (and its own transaction); returns the output.
    // port: another server's (0: the main one).
    std::string psql(const std::string& db, const std::vector<std::string>& statements, int port = 0);
    // psql -At: the unaligned output, trailing newline removed.
    std::string value(const std::string& db, const std::string& sql, int port = 0);
    // A child process in the background, its output in <work>/<log>;
    // stopped (SIGTERM, SIGKILL after 60 s) when the handle goes.
    std::unique_ptr<testing::Process> spawn(const std::vector<std::string>& argv, const std::string& log);
    // Stops a child as bench/run.sh's stop_pid did: SIGCONT, SIGTERM, SIGKILL after 60 s.
    static void stop(std::unique_ptr<testing::Process>& process);
    // pgbench -n against database db with these options and scripts;
    // returns the tps pgbench reports.
    double pgbench(const std::string& db, const std::vector<std::string>& options, int port = 0);
    // Writes a file under work; returns its path.
    std::string write(const std::string& name, const std::string& text);

    // ---- the shared steps of the workloads
    void flush_redis();
    // Emits n events into database db: 10,000 per transaction, four
    // topics, a 16-character key and about 200 bytes of JSON each; with
    // headers, an SQL expression of the transaction c and the event i
    // within it (1 to 10,000) gives each event's headers.
    void load_events(const std::string& db, long long n, const std::string& headers = "");
    // Waits until the streams matching outbox:* hold n entries (at most 30 minutes).
    void wait_streams(long long n);
    // Creates database db with the extension.
    void create_database(const std::string& db);
    void drop_database(const std::string& db);
    // A quiet start for the next measurement: nothing left for autovacuum
    // to clean up behind the previous one, no checkpoint due.
    void settle(const std::string& db);
    // Rewinds every shard of group name of database db to the beginning,
    // with no stream published to.
    void rewind_shards(const std::string& db, const std::string& name);
    // Starts a relay per shard of group name (n shards) of database db into
    // the Redis at address, to streams outbox:{topic}:{shard}.
    std::vector<std::unique_ptr<testing::Process>> start_shard_relays(const std::string& db, const std::string& name,
                                                                      int n, const std::string& address,
                                                                      const std::string& relay_path = {});
    static void stop_all(std::vector<std::unique_ptr<testing::Process>>& processes);

    // ---- CPU time: the /proc sampler
    // CPU seconds (user and system) each process has used so far, by PID;
    // a process gone is missing.
    static std::map<pid_t, double> cpu_snapshot(const std::vector<pid_t>& pids);
    // CPU seconds used between two snapshots; a process missing from the
    // first started in between.
    static double cpu_between(const std::map<pid_t, double>& a, const std::map<pid_t, double>& b);
    // The PostgreSQL server's processes: the postmaster and its children.
    std::vector<pid_t> pg_processes() const;

    // ---- the table
    // Adds a row: "| cells |" (the cells already joined by " | ").
    void row(const std::string& cells);
    void begin_workload(const std::string& name);
    const std::string& table() const { return table_; }
    // Draws a chart with gnuplot (when installed) from a script whose
    // output is @OUTPUT@: <chart prefix>-<name>.png, beside the report.
    void chart(const std::string& name, const std::string& script);
    // Paths of the charts drawn, "name:path".
    std::vector<std::string> charts;
    std::string chart_prefix;

    // Announces a step, as scripts/lib.sh's say did.
    static void say(const std::string& line);

private:
    std::string rows_dir_;
    std::string table_;
    std::string workload_;
    int run_counter_ = 0;
};

// The payload of every workload: about 200 bytes of JSON.
extern const char* const kPayload;

struct Workload {
    const char* name;
    void (*run)(Context&);
};
// Every workload, in the table's order.
const std::vector<Workload>& workloads();

// The subcommand: runs the workloads named (all when empty) and writes the
// report to bench/results/<time>.md under results_dir. Returns the exit status.
// chart_prefix: where the charts go (<prefix>-<name>.png); by default
// beside the report.
int run_benchmark(const std::vector<std::string>& only, const std::string& relay, const std::string& results_dir,
                  const std::string& rows_dir, const std::string& chart_prefix);

}  // namespace pg_outbox::bench
