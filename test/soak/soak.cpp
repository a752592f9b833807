// pg_outbox_soak: a fault-injecting workload, then a history checker.
//
// 16 writers emit numbered events on random keys (with aborted
// transactions, rolled-back savepoints, long transactions, two-phase
// commits and bulk emits), two relays publish one group, two consume
// workers apply the streams through the inbox into a projection. Faults
// come at random moments (faults.cpp; network.cpp in network mode). Then
// everything is brought back, drained, and the history (what committed,
// what is in the streams, what was applied, what was dead-lettered) goes
// to pg_outbox_check. test/soak/soak.sh builds and runs it; the SOAK_*
// variables it reads are described there.
//
// Everything runs on the test kit's throwaway servers on loopback (in
// network mode on addresses inside the test's own namespaces), stopped by
// PID; every program is run from an argv, never through a shell.
#include "soak.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>

#include "pg_outbox/redis_cluster.hpp"

#ifndef PG_OUTBOX_RELAY_PATH
#error "PG_OUTBOX_RELAY_PATH: the relay's program, defined by CMake"
#endif

namespace pg_outbox::soak {

namespace fs = std::filesystem;

std::atomic<bool> g_interrupted{false};

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

bool wait_for(double seconds, const std::function<bool()>& condition) {
    for (int i = 0; i < static_cast<int>(seconds * 10); ++i) {
        if (condition()) return true;
        nap(0.1);
    }
    return false;
}

double epoch_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string epoch_text(double t) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9f", t);
    return buf;
}

namespace {

void say(const std::string& line) { std::cout << "==> " << line << std::endl; }

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
}

std::size_t count_matching(const std::vector<std::string>& paths, const std::regex& re) {
    std::size_t n = 0;
    for (const auto& p : paths)
        for (const auto& line : lines_of(read_file(p)))
            if (std::regex_search(line, re)) ++n;
    return n;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
    return out;
}

// The directory of this program: the checker and the network report are
// built beside it.
std::string own_dir() {
    std::error_code ec;
    const auto exe = fs::read_symlink("/proc/self/exe", ec);
    return ec ? std::string(".") : exe.parent_path().string();
}

// The writers' scripts, as pgbench reads them, and their weights.
const char* const kEmit =
    "SELECT outbox_emit('t' || (:k % 3), 'k' || :k, jsonb_build_object('n', nextval('soak_n')))";

std::map<std::string, std::string> writer_scripts() {
    const std::string k = "\\set k random(1, 100000)\n";
    const std::string g = "\\set g random(1, 1000000000)\n";
    const std::string e = std::string(kEmit) + ";\n";
    return {
        {"normal", k + "BEGIN;\n" + e + e + "COMMIT;\n"},
        {"abort", k + "BEGIN;\n" + e + "ROLLBACK;\n"},
        {"savepoint", k + "BEGIN;\n" + e + "SAVEPOINT s;\n" + e + "ROLLBACK TO SAVEPOINT s;\n" + e + "COMMIT;\n"},
        {"long", k + "BEGIN;\n" + e + "SELECT pg_sleep(1 + random() * 2);\n" + e + "COMMIT;\n"},
        {"twopc", k + g + "BEGIN;\n" + e + "PREPARE TRANSACTION 'soak-:g';\nCOMMIT PREPARED 'soak-:g';\n"},
        {"twopc_abort", k + g + "BEGIN;\n" + e + "PREPARE TRANSACTION 'soak-:g';\nROLLBACK PREPARED 'soak-:g';\n"},
        {"bulk", k + "SELECT count(*) FROM outbox_emit_many('t' || (:k % 3), NULL, (SELECT "
                     "array_agg(jsonb_build_object('n', nextval('soak_n'))) FROM generate_series(1, 20)));\n"},
        // Ten hot keys, hot0 to hot9: a key the "key fail" fault picks
        // receives events while it fails.
        {"hot", "\\set h random(0, 9)\nBEGIN;\nSELECT outbox_emit('t' || (:h % 3), 'hot' || :h, "
                "jsonb_build_object('n', nextval('soak_n')));\nCOMMIT;\n"},
    };
}

}  // namespace

Soak::Soak(Options options) : opt(std::move(options)), rng(opt.seed) {
    work = testing::make_temp_dir("pg_outbox_soak.");
    pg_port = testing::free_port();
    redis_port = testing::free_port();
    while (redis_port == pg_port) redis_port = testing::free_port();
    faults_log_.open(work + "/faults.log");
    shell_log_.open(work + "/shell.log");
}

Soak::~Soak() {
    try {
        cleanup();
    } catch (const std::exception& e) {
        std::cerr << "soak: cleanup: " << e.what() << '\n';
    }
}

void Soak::note(const std::string& line) {
    faults_log_ << line << std::endl;
}

void Soak::remark(const std::string& line) { shell_log_ << line << std::endl; }

std::string Soak::conninfo(const std::string& db) const {
    return "host=" + pg_host + " port=" + std::to_string(pg_port) + " user=postgres dbname=" + db;
}

Rows Soak::query(const std::string& db, const std::string& sql, const std::vector<std::optional<std::string>>& params) {
    PgConnection conn(conninfo(db), "pg_outbox_soak");
    auto r = conn.exec(sql, params);
    Rows rows;
    const int cols = PQnfields(r.raw());
    for (int i = 0; i < r.rows(); ++i) {
        std::vector<std::string> row;
        for (int c = 0; c < cols; ++c) row.emplace_back(r.is_null(i, c) ? "" : std::string(r.get(i, c)));
        rows.push_back(std::move(row));
    }
    return rows;
}

std::string Soak::value(const std::string& db, const std::string& sql,
                        const std::vector<std::optional<std::string>>& params) {
    const auto rows = query(db, sql, params);
    return rows.empty() || rows[0].empty() ? std::string() : rows[0][0];
}

RedisConnection Soak::redis_for(const std::string& key) {
    if (cluster) return cluster->node(cluster->master_of(key_slot(key))).connect();
    return redis->connect();
}

RunResult Soak::run_program(const std::vector<std::string>& argv, std::chrono::seconds timeout,
                            const std::string& log) {
    const std::string out_path = work + "/.run" + std::to_string(run_counter_++);
    RunResult result;
    {
        Process p(argv, out_path);
        result.status = p.wait(timeout);
        // Past the timeout, the destructor kills it.
    }
    result.output = read_file(out_path);
    std::error_code ec;
    fs::remove(out_path, ec);
    if (!log.empty()) {
        std::ofstream out(log, std::ios::app);
        out << result.output;
    }
    return result;
}

// ---- relays and workers

void Soak::start(const std::string& name) {
    std::vector<std::string> argv;
    std::string pg = pg_host, url = redis_url;
    std::vector<std::string> opts;
    std::vector<std::string> retry{"--retry-max", "1s"};
    if (net) {
        const auto host = Network::host_of(name);
        argv = net->exec_prefix(host);
        pg = Network::db_addr(host, "pg");
        url = Network::db_addr(host, "redis") + ":" + std::to_string(redis_port);
        opts = {"--log-format", "json"};
        // Each published batch has a line (at debug level): when publishing
        // resumed. The relays' backoff is their default (derived from the
        // lease), which the bound on resuming after a heal assumes.
        if (name.rfind("relay", 0) == 0) {
            opts.insert(opts.end(), {"--log-level", "debug"});
            retry.clear();
        }
    }
    const std::string conn = "port=" + std::to_string(pg_port) + " user=postgres" +
                             (opt.pg_options.empty() ? "" : " " + opt.pg_options) + " host=" + pg;
    argv.push_back(PG_OUTBOX_RELAY_PATH);
    if (name.rfind("relay", 0) == 0) {
        std::string group = "soak";
        if (opt.mode == "sharded-cluster") {
            opts.insert(opts.end(), {"--stream", "soak:{{shard}}:{topic}"});
            group = "soak/" + name.substr(5, 1);
        }
        argv.insert(argv.end(), {"publish", "--pg", conn + " dbname=soak", "--redis", url, "--group", group});
        argv.insert(argv.end(), opts.begin(), opts.end());
        argv.insert(argv.end(), {"--poll-interval", std::to_string(poll_ms) + "ms"});
        argv.insert(argv.end(), retry.begin(), retry.end());
        argv.insert(argv.end(), {"--stats-interval", "1s", "--maintain-interval", "3s", "--lease",
                                 std::to_string(lease_ms) + "ms"});
    } else {
        argv.insert(argv.end(), {"consume", "--pg", conn + " dbname=sink", "--redis", url, "--consumer", "projection",
                                 "--worker", name});
        argv.insert(argv.end(), opts.begin(), opts.end());
        if (opt.mode == "sharded-cluster") {
            for (const char* t : {"t0", "t1", "t2"})
                argv.insert(argv.end(), {"--stream", "soak:{" + name.substr(6, 1) + "}:" + t});
        } else {
            for (const auto& s : streams) argv.insert(argv.end(), {"--stream", s});
        }
        // With park-key, an entry dead-letters after 3 deliveries (its key
        // then waits for the redrive at the end); otherwise failures are
        // only faults of the servers, retried until they go through.
        argv.insert(argv.end(), {"--handler", "SELECT soak_apply($2, $3, $5)", "--block", "200ms", "--min-idle", "2s",
                                 "--claim-interval", "500ms", "--retry-max", "1s"});
        if (opt.park)
            argv.insert(argv.end(), {"--on-failure", "park-key", "--max-deliveries", "3"});
        else
            argv.insert(argv.end(), {"--on-failure", "skip", "--max-deliveries", "1000000"});
    }
    procs[name] = std::make_unique<Process>(argv, work + "/" + name + ".log");
}

void Soak::signal(const std::string& name, int sig) {
    auto it = procs.find(name);
    if (it != procs.end() && it->second) it->second->signal(sig);
}

bool Soak::running(const std::string& name) {
    auto it = procs.find(name);
    return it != procs.end() && it->second && it->second->running();
}

void Soak::stop(const std::string& name) {
    auto it = procs.find(name);
    if (it == procs.end() || !it->second) return;
    auto& p = *it->second;
    if (!p.running()) return;
    p.signal(SIGCONT);
    p.signal(SIGTERM);
    if (p.wait(std::chrono::seconds(60)) == -1) {
        p.signal(SIGKILL);
        p.wait();
    }
}

std::string Soak::leading_relay(const std::vector<std::string>& candidates) {
    static const std::regex any("leading group|standing by|lost the leadership");
    for (const auto& n : candidates) {
        std::string last;
        for (const auto& line : lines_of(read_file(work + "/" + n + ".log")))
            if (std::regex_search(line, any)) last = line;
        if (last.find("leading group") != std::string::npos) return n;
    }
    return candidates.front();
}

// ---- the run

void Soak::setup_servers() {
    std::vector<std::string> settings{"max_prepared_transactions = 50", "max_connections = 100"};
    // The SQL engine runs without pg_outbox.so, as on a managed service.
    if (opt.ordering == "commit" && opt.engine == "c") settings.push_back("shared_preload_libraries = 'pg_outbox'");
    if (net) {
        // The soak reaches PostgreSQL at its Unix socket (the faults cut
        // only the relays' and workers' paths).
        net->results = work + "/network.tsv";
        std::ofstream(net->results).close();
        net->setup();
        const auto more = net->pg_settings();
        settings.insert(settings.end(), more.begin(), more.end());
        Network::InDb in_db(*net);
        pg = std::make_unique<PgServer>(settings, testing::Placement{work + "/pg", pg_port, false});
        redis = std::make_unique<RedisServer>(false, net->redis_args(),
                                              testing::Placement{work + "/redis", redis_port, false});
        pg_host = work + "/pg";
    } else {
        pg = std::make_unique<PgServer>(settings, testing::Placement{work + "/pg", pg_port, false});
        pg_host = "127.0.0.1";
    }
    if (opt.mode == "sharded-cluster") {
        // Each shard's streams under one hash tag: one slot, so a worker
        // reads its shard in one transaction on one master. The kit's
        // replicas sync at once (--repl-diskless-sync-delay 0).
        shards = 4;
        cluster = std::make_unique<RedisClusterServers>(3, 1, std::chrono::milliseconds(2000),
                                                        std::vector<std::string>{},
                                                        testing::Placement{work + "/cluster", 0, false});
        redis_url = cluster->url();
        for (int s = 0; s < shards; ++s) {
            for (const char* t : {"t0", "t1", "t2"}) streams.push_back("soak:{" + std::to_string(s) + "}:" + t);
            workers.push_back("worker" + std::to_string(s));
        }
        relays = {"relay0a", "relay0b", "relay1a", "relay1b", "relay2a", "relay3a"};
    } else {
        if (!net) {
            // Appended and fsynced every second: a kill loses at most the
            // last second of writes, as a crash would.
            redis = std::make_unique<RedisServer>(true, std::vector<std::string>{"--appendfsync", "everysec"},
                                                  testing::Placement{work + "/redis", redis_port, false});
            redis_url = redis->address();
        }
        streams = {"outbox:t0", "outbox:t1", "outbox:t2"};
        relays = {"relay1", "relay2"};
        workers = {"worker1", "worker2"};
    }
}

void Soak::setup_databases() {
    query("postgres", "CREATE DATABASE soak");
    query("postgres", "CREATE DATABASE sink");
    const std::string extension = opt.engine == "sql" ? "pg_outbox_sql" : "pg_outbox";
    query("soak", "CREATE EXTENSION " + extension);
    const auto engine = value("soak", "SELECT engine FROM outbox.engine()");
    if (engine != opt.engine)
        throw std::runtime_error("SOAK_ENGINE=" + opt.engine + " installed engine \"" + engine + "\"");
    query("soak", "CREATE SEQUENCE soak_n");
    query("soak", "SELECT outbox_group_create('soak', start_at => 'beginning', ordering => $1, shards => $2::int)",
          {opt.ordering, std::to_string(shards)});
    query("sink", "CREATE EXTENSION " + extension);
    // No unique constraint: a duplicate apply would show as two rows.
    // seq: the order of the applies (one worker applies each key's events).
    query("sink",
          "CREATE TABLE projection (event_id uuid NOT NULL, n bigint, applied_at timestamptz NOT NULL DEFAULT "
          "clock_timestamp(), seq bigserial)");
    // The "key fail" fault's keys: the handler raises for one until its
    // time is up.
    query("sink", "CREATE TABLE soak_failing (key text PRIMARY KEY, until timestamptz NOT NULL)");
    query("sink",
          "CREATE FUNCTION soak_apply(key text, payload jsonb, event_id uuid) RETURNS void LANGUAGE plpgsql AS $$\n"
          "BEGIN\n"
          "  IF EXISTS (SELECT FROM soak_failing f WHERE f.key = soak_apply.key AND f.until > clock_timestamp()) THEN\n"
          "    RAISE EXCEPTION 'soak: key % fails for now', key;\n"
          "  END IF;\n"
          "  INSERT INTO projection (event_id, n) VALUES (event_id, (payload->>'n')::bigint);\n"
          "END $$");
    query("sink", "SELECT inbox_consumer_create('projection', current_user::regrole)");
}

void Soak::write_scripts() {
    const std::string dir = work + "/writers";
    fs::create_directories(dir);
    for (const auto& [name, text] : writer_scripts()) std::ofstream(dir + "/" + name + ".sql") << text;
    // An emitting transaction cannot be prepared while a commit-ordered
    // group exists: in commit order, those weights go to plain transactions.
    std::vector<std::pair<std::string, int>> weights =
        opt.ordering == "commit"
            ? std::vector<std::pair<std::string, int>>{{"normal", 74}, {"abort", 10}, {"savepoint", 10}, {"long", 1},
                                                       {"bulk", 5}}
            : std::vector<std::pair<std::string, int>>{{"normal", 68}, {"abort", 10}, {"savepoint", 10}, {"long", 1},
                                                       {"twopc", 4}, {"twopc_abort", 2}, {"bulk", 5}};
    if (opt.park) weights.emplace_back("hot", 10);
    for (const auto& [name, weight] : weights) mix_.insert(mix_.end(), {"-f", dir + "/" + name + ".sql@" + std::to_string(weight)});
}

// The writers: 16 clients, short pgbench runs in a loop (a PostgreSQL
// restart ends a run; the next one starts). They stop after SOAK_SECONDS,
// or in network mode when the faults end (the last fault's heal is
// measured on events written after it).
void Soak::writers() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(opt.seconds);
    std::vector<std::string> argv{testing::pg_bin() + "/pgbench", "-n", "-h", pg_host, "-p", std::to_string(pg_port),
                                  "-U", "postgres", "-c", "16", "-j", "2", "-T", "5", "-R", "300"};
    argv.insert(argv.end(), mix_.begin(), mix_.end());
    argv.push_back("soak");
    while (!writers_stop_ && (net || std::chrono::steady_clock::now() < until)) {
        Process p(argv, work + "/writers.log");
        int status = -1;
        while (status == -1 && !writers_stop_) status = p.wait(std::chrono::seconds(1));
        if (status == -1) {
            p.signal(SIGTERM);
            p.wait(std::chrono::seconds(10));
        }
        if (status != 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
}

// The faults, one every 1 to 4 seconds, in a random order.
void Soak::faults() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(opt.seconds - 3);
    nap(2);
    if (cluster && !wait_for(30, [this] { return cluster_settled(); }))
        remark("  the replicas did not sync within 30 s");
    // With parking, the first fault fails a key, so that every run parks
    // one; the schedule draws more.
    if (opt.park) {
        key_fault();
        nap(1 + draw(4));
    }
    while (std::chrono::steady_clock::now() < until) {
        try {
            if (cluster)
                cluster_fault();
            else
                fault();
        } catch (const Interrupted&) {
            throw;
        } catch (const std::exception& e) {
            remark("  the fault failed: " + std::string(e.what()));
        }
        nap(1 + draw(4));
    }
}

void Soak::drain() {
    // Bring everything back and let it drain.
    if (redis && redis->running()) redis->signal(SIGCONT);
    for (const auto& list : {relays, workers}) {
        for (const auto& name : list) {
            signal(name, SIGCONT);
            if (!running(name)) start(name);
        }
    }
    // A PostgreSQL restart between a writer's PREPARE TRANSACTION and its
    // COMMIT PREPARED leaves the transaction in doubt, holding the xid8
    // horizon until someone decides. As the transaction manager would
    // after a crash, commit them: their events must then be published like
    // any other.
    // The writers name them soak-N; a name is written into the statement
    // (COMMIT PREPARED takes no parameter) only when it is one of those.
    static const std::regex ours("soak-[0-9]+");
    for (const auto& row : query("soak", "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'soak-%'")) {
        if (!std::regex_match(row[0], ours)) continue;
        std::cout << "committing in-doubt prepared transaction " << row[0] << std::endl;
        query("soak", "COMMIT PREPARED '" + row[0] + "'");
    }
    query("soak", "SELECT count(*) FROM outbox_maintain()");
    if (opt.park) {
        // The handler is fixed; every key the faults left parked goes on:
        // a dead one is redriven (its dead letter first, then its parked
        // entries, by the worker that reads its stream), a retrying one
        // applies its head at its next delivery and drains by itself.
        query("sink", "DELETE FROM soak_failing");
        const bool clear = wait_for(180, [this] {
            try {
                query("sink",
                      "SELECT count(*) FROM inbox_parked_keys('projection') p, "
                      "LATERAL inbox_redrive('projection', p.key, p.stream) r WHERE p.state = 'dead'");
                return value("sink", "SELECT count(*) FROM inbox_parked_keys('projection')") == "0";
            } catch (const Interrupted&) {
                throw;
            } catch (const std::exception&) {
                return false;
            }
        });
        if (!clear) remark("  parked keys were left after 180 s of redrives");
    }
    auto settled = [this] {
        try {
            const auto applied = std::stoll(value("sink", "SELECT count(DISTINCT event_id) FROM projection"));
            long long pending = 0;
            for (const auto& s : streams) {
                try {
                    auto c = redis_for(s);
                    auto r = c.command_raw({"XPENDING", s, "projection"});
                    if (r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_INTEGER)
                        pending += r->element[0]->integer;
                } catch (const std::exception&) {
                }
            }
            return pending == 0 &&
                   value("soak", "SELECT coalesce(sum(waiting), 0) FROM outbox_group_stats()") == "0" && applied > 0 &&
                   value("sink",
                         "SELECT count(*) FROM projection WHERE applied_at > clock_timestamp() - interval '2 seconds'") ==
                       "0";
        } catch (const Interrupted&) {
            throw;
        } catch (const std::exception&) {
            return false;
        }
    };
    for (int i = 0; i < 120 && !settled(); ++i) nap(1);
}

namespace {

void write_tsv(const std::string& path, const Rows& rows) {
    std::ofstream out(path);
    for (const auto& row : rows) out << join(row, "\t") << '\n';
}

std::size_t line_count(const std::string& path) { return lines_of(read_file(path)).size(); }

}  // namespace

int Soak::history_and_check() {
    const std::string h = work + "/history";
    fs::create_directories(h);
    // Each committed event with its position in the group's order (in
    // sharded-cluster mode also its shard's stream and its key).
    const std::string route =
        cluster ? ", 'soak:{' || outbox.shard_of(e.topic, e.key, " + std::to_string(shards) +
                      ") || '}:' || e.topic, coalesce(e.key, '')"
                : "";
    if (opt.ordering == "commit") {
        write_tsv(h + "/committed.tsv",
                  query("soak", "SELECT e.event_id, e.topic, m.ticket || '-' || e.seq, extract(epoch FROM e.created_at)" +
                                    route + " FROM outbox.event e JOIN outbox.commit_log m ON m.txid = e.txid"));
        const auto unmarked = value("soak",
                                    "SELECT count(*) FROM outbox.event e WHERE NOT EXISTS (SELECT 1 FROM "
                                    "outbox.commit_log m WHERE m.txid = e.txid)");
        if (unmarked != "0") {
            std::cerr << "soak: " << unmarked << " committed events have no commit marker\n";
            std::cout << "soak: 0 passed, 1 failed" << std::endl;
            return 1;
        }
    } else {
        write_tsv(h + "/committed.tsv",
                  query("soak", "SELECT e.event_id, e.topic, e.txid || '-' || e.seq, extract(epoch FROM e.created_at)" +
                                    route + " FROM outbox.event e"));
    }
    {
        std::ofstream out(h + "/streams.tsv");
        for (const auto& s : streams) {
            std::vector<testing::Entry> entries;
            if (cluster) {
                entries = cluster->read_stream(s);
            } else {
                auto c = redis->connect();
                entries = testing::read_stream(c, s);
            }
            for (const auto& e : entries) {
                if (!e.fields.count("prev")) continue;
                auto field = [&](const char* f) {
                    auto it = e.fields.find(f);
                    return it == e.fields.end() ? std::string() : it->second;
                };
                out << s << '\t' << e.id << '\t' << field("event_id") << '\t' << field("position") << '\n';
            }
        }
    }
    write_tsv(h + "/applied.tsv", query("sink", "SELECT event_id, extract(epoch FROM applied_at), seq FROM projection"));
    write_tsv(h + "/dead_letters.tsv",
              query("sink",
                    "SELECT stream, entry_id, coalesce(event_id::text, ''), CASE WHEN skipped_at IS NULL THEN '' "
                    "ELSE 'skipped' END FROM outbox.dead_letters"));
    // Entries still parked (none, once the redrive at the end is done).
    write_tsv(h + "/parked.tsv", query("sink",
                                       "SELECT stream, entry_id, coalesce(convert_from(event_id, 'UTF8'), '') "
                                       "FROM outbox.parked_entries"));
    // With park-key, every key the handler failed for is applied in the
    // end: no key left parked, no dead letter of the handler's not
    // redriven.
    std::string unfinished;
    if (opt.park) {
        const auto keys = value("sink", "SELECT count(*) FROM inbox_parked_keys('projection')");
        const auto letters = value("sink",
                                   "SELECT count(*) FROM outbox.dead_letters WHERE sqlstate = 'P0001' "
                                   "AND replayed_at IS NULL AND skipped_at IS NULL");
        std::vector<std::string> worker_logs;
        for (const auto& w : workers) worker_logs.push_back(work + "/" + w + ".log");
        say("parked keys: " + std::to_string(count_matching(worker_logs, std::regex("its key .* is parked behind it"))) +
            " failed deliveries that parked their key, " +
            std::to_string(count_matching(worker_logs, std::regex(" un-parked, [0-9]+ entries redriven"))) +
            " keys drained and un-parked, " +
            value("sink", "SELECT count(DISTINCT (stream, key)) FROM outbox.dead_letters WHERE sqlstate = 'P0001'") +
            " dead-lettered by the handler and redriven; left parked: " + keys +
            ", handler dead letters not redriven: " + letters);
        if (keys != "0" || letters != "0") unfinished = "parked keys or handler dead letters were left after the redrive";
    }

    const std::string dir = own_dir();
    if (net) {
        // The documented bounds on a wait (docs/concepts.md, "Bounds on waits"): a
        // relay's --pg-timeout and --redis-timeout default to two thirds
        // of the lease, between 2 s and 10 s; consume mode's to 10 s. A
        // relay notices a cut in the first wait that begins after it, at
        // most a poll later: its bound is the timeout and one poll.
        const int relay_bound = std::clamp(lease_ms * 2 / 3, 2000, 10000);
        say("network faults, each cut and heal (pg_outbox_soak_network):");
        const auto report = run_program({dir + "/pg_outbox_soak_network", net->results, std::to_string(lease_ms),
                                         std::to_string(poll_ms), std::to_string(relay_bound + poll_ms), "10000"},
                                        std::chrono::seconds(120));
        for (const auto& line : lines_of(report.output)) std::cout << "  " << line << '\n';
        std::cout.flush();
    }
    if (cluster) {
        std::vector<std::string> relay_logs, worker_logs;
        for (const auto& r : relays) relay_logs.push_back(work + "/" + r + ".log");
        for (const auto& w : workers) worker_logs.push_back(work + "/" + w + ".log");
        say("streams found behind by the relays: " +
            std::to_string(count_matching(relay_logs, std::regex("is behind|lost entries"))) +
            ", gaps found by the workers: " + std::to_string(count_matching(worker_logs, std::regex(": gap \\("))));
    }
    say("history: " + std::to_string(line_count(h + "/committed.tsv")) + " committed, " +
        std::to_string(line_count(h + "/streams.tsv")) + " stream entries, " +
        std::to_string(line_count(h + "/applied.tsv")) + " applies, " +
        std::to_string(line_count(h + "/dead_letters.tsv")) + " dead letters");
    const auto check = run_program({dir + "/pg_outbox_check", h}, std::chrono::seconds(600));
    std::cout << check.output << std::flush;
    if (!unfinished.empty()) std::cout << "soak: " << unfinished << '\n';
    if (check.ok() && unfinished.empty()) {
        std::cout << "soak: 1 passed, 0 failed" << std::endl;
        return 0;
    }
    std::cout << "soak: history and logs kept in " << work << '\n' << "soak: 0 passed, 1 failed" << std::endl;
    return 1;
}

int Soak::run() {
    if (opt.mode == "network") {
        net = std::make_unique<Network>(*this);
        const auto why = net->unavailable();
        if (!why.empty()) {
            std::cout << "soak: skipped: SOAK_MODE=network cannot make its network namespaces, veth pairs and "
                         "iptables rules here: "
                      << why << std::endl;
            net.reset();
            passed_ = true;
            return 77;
        }
        // The lease is 3 s: the relays' waits are two thirds of it, with a
        // floor of 2 s (docs/concepts.md, "Bounds on waits"), so that a shorter
        // lease would put the floor, not the lease, in the bound on resuming.
        lease_ms = 3000;
    }
    say("soak: " + std::to_string(opt.seconds) + "s, " + opt.engine + " engine, " + opt.ordering + " order, " + opt.mode +
        (opt.park ? ", park-key" : "") + ", fault schedule seed " + std::to_string(opt.seed) + ", work in " + work);
    setup_servers();
    setup_databases();
    // In sharded-cluster mode relayNx publishes shard N, workerN reads
    // shard N's streams. In network mode each runs on its host (relay1,
    // relay2, or consumer for the workers), reaches PostgreSQL and Redis
    // at the db ends of that host's links, and logs JSON (whose times the
    // report reads).
    for (const auto& list : {relays, workers})
        for (const auto& name : list) start(name);
    write_scripts();
    writers_ = std::thread([this] { writers(); });

    // The fault loop runs in this thread (it restarts processes), the
    // writers in theirs.
    try {
        if (net)
            net->faults();
        else
            faults();
    } catch (const Interrupted&) {
        throw;
    } catch (const std::exception& e) {
        remark(std::string("the faults ended early: ") + e.what());
    }
    if (net) writers_stop_ = true;
    writers_.join();
    faults_log_.flush();
    {
        // "N (what xC, ...)", the most frequent first.
        const auto lines = lines_of(read_file(work + "/faults.log"));
        std::map<std::string, int> counts;
        for (const auto& l : lines) ++counts[l];
        std::vector<std::pair<int, std::string>> sorted;
        for (const auto& [l, c] : counts) sorted.emplace_back(c, l);
        std::sort(sorted.rbegin(), sorted.rend());
        std::vector<std::string> parts;
        for (const auto& [c, l] : sorted) parts.push_back(l + " x" + std::to_string(c));
        say("faults injected: " + std::to_string(lines.size()) + " (" + join(parts, ", ") + ")");
    }
    drain();
    const int status = history_and_check();
    passed_ = status == 0;
    return status;
}

void Soak::cleanup() {
    writers_stop_ = true;
    if (writers_.joinable()) writers_.join();
    for (auto& [name, p] : procs) {
        if (!p) continue;
        stop(name);
        p.reset();
    }
    if (redis && redis->running()) redis->signal(SIGCONT);
    // The kit removes a server's directory with it: a run whose workspace
    // stays keeps the servers' logs in servers/.
    const bool keep = (!passed_ && !g_interrupted) || opt.keep;
    if (keep) {
        std::error_code ec;
        fs::create_directories(work + "/servers", ec);
        auto save = [&](const std::string& from, const std::string& to) {
            fs::copy_file(from, work + "/servers/" + to, fs::copy_options::overwrite_existing, ec);
        };
        if (pg) save(pg->dir() + "/server.log", "postgresql.log");
        if (redis) save(redis->dir() + "/redis.log", "redis.log");
        for (std::size_t i = 0; cluster && i < cluster->size(); ++i)
            save(cluster->node(i).dir() + "/redis.log", "node" + std::to_string(i + 1) + ".log");
    }
    cluster.reset();
    redis.reset();
    pg.reset();
    if (net) net->teardown();
    net.reset();
    // A failed run keeps its logs and history; so does one that ended on
    // an error (its last line says what). An interrupted one does not.
    if (!keep) {
        std::error_code ec;
        fs::remove_all(work, ec);
    }
}

}  // namespace pg_outbox::soak

namespace {

using pg_outbox::soak::Options;

[[noreturn]] void usage_error(const std::string& what) {
    std::cerr << what << '\n';
    std::exit(2);
}

std::string env(const char* name, const std::string& fallback = {}) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : fallback;
}

int env_int(const char* name, int fallback, int low, int high) {
    const auto text = env(name);
    if (text.empty()) return fallback;
    try {
        std::size_t used = 0;
        const long v = std::stol(text, &used);
        if (used == text.size() && v >= low && v <= high) return static_cast<int>(v);
    } catch (const std::exception&) {
    }
    usage_error(std::string(name) + " must be a whole number from " + std::to_string(low) + " to " +
                std::to_string(high) + ", not \"" + text + "\"");
}

void on_signal(int) { pg_outbox::soak::g_interrupted = true; }

}  // namespace

int main() {
    Options o;
    o.seconds = env_int("SOAK_SECONDS", 120, 5, 86400);
    o.seed = static_cast<unsigned>(env_int("SOAK_SEED", static_cast<int>(std::random_device{}() % 32768), 0, 2147483647));
    o.ordering = env("SOAK_ORDERING", "commit");
    if (o.ordering != "commit" && o.ordering != "xid8")
        usage_error("SOAK_ORDERING must be commit or xid8, not \"" + o.ordering + "\"");
    o.engine = env("SOAK_ENGINE", "c");
    if (o.engine != "c" && o.engine != "sql")
        usage_error("SOAK_ENGINE must be c or sql, not \"" + o.engine + "\"");
    o.mode = env("SOAK_MODE", "single");
    if (o.mode != "single" && o.mode != "sharded-cluster" && o.mode != "network")
        usage_error("SOAK_MODE must be single, sharded-cluster or network, not \"" + o.mode + "\"");
    o.fault_max = env_int("SOAK_FAULT_MAX", std::clamp(o.seconds / 6, 5, 120), 0, 1000000);
    o.fault_max = std::clamp(o.fault_max, 5, 120);
    o.pg_options = env("SOAK_PG_OPTIONS");
    const auto park = env("SOAK_PARK", "0");
    if (park != "0" && park != "1") usage_error("SOAK_PARK must be 0 or 1, not \"" + park + "\"");
    o.park = park == "1";
    o.keep = env("KEEP") == "1";

    struct sigaction sa {};
    sa.sa_handler = on_signal;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);

    try {
        pg_outbox::soak::Soak soak(o);
        return soak.run();
    } catch (const pg_outbox::soak::Interrupted&) {
        std::cerr << "soak: interrupted\n";
        return 130;
    } catch (const std::exception& e) {
        std::cerr << "soak: " << e.what() << '\n' << "soak: 0 passed, 1 failed\n";
        return 1;
    }
}
