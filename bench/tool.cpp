// pg_outbox_bench: the benchmark (run) and its baselines and probes.
//
//   run           the benchmark on throwaway servers: the workloads of
//                 bench/workloads/ (--only names some), each figure beside a
//                 baseline measured in the same run; the table goes to
//                 bench/results/ (bench/README.md). The subcommands below
//                 are the baselines it runs as child processes.
//   xadd-ceiling  the same entries as the relay publishes (prev included), loaded into memory
//                 first, then appended with pipelined XADD: the ceiling
//   naive-relay   the status-column outbox relay: SELECT ... FOR UPDATE SKIP
//                 LOCKED, pipelined XADD, UPDATE status, COMMIT
//   latency       reads a stream as entries arrive and reports how long after
//                 the emitting commit (payload field "t", epoch seconds) each
//                 one appeared; --samples FILE also writes every latency (ms),
//                 sorted, one a line, for the latency chart
//   read-ack      a bare consumer: XREADGROUP and XACK until the stream is
//                 read, the ceiling of a consumer
//   pgq-relay     a PgQ consumer publishing to Redis: next_batch,
//                 get_batch_events, pipelined XADD, finish_batch, COMMIT
//   wait-entries  waits until the streams matching a pattern hold a number
//                 of entries, polling over one connection per node (a
//                 redis-cli per poll would cost the machine more CPU than it
//                 measures); --redis once per master of a Redis Cluster
//   hand-consume  a consumer written by hand without pg_outbox, the
//                 baseline of `pg_outbox_relay consume`: XREADGROUP a
//                 batch, one transaction (the event ids into a dedupe table
//                 with ON CONFLICT DO NOTHING, then the handler, prepared,
//                 for each new one, pipelined), COMMIT, XACK; --bare drops
//                 the transaction: the XREADGROUP + XACK loop alone, the
//                 Redis-side ceiling; --set-sql runs one set-based
//                 statement a batch instead of the dedupe insert and the
//                 handler. --workers N threads share the streams
//                 out (stream i to worker i mod N); --seconds follows the
//                 streams for that long instead of stopping when they are
//                 read
//   wait-rows     waits until a query's count reaches a number, polling
//                 over one connection (every 200 ms: the query costs the
//                 server what it measures)
//
// Each prints "RESULT <name> <value>" lines.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_set>
#include <vector>

#include "pg_outbox/event.hpp"
#include "pg_outbox/pg.hpp"
#include "pg_outbox/redis.hpp"
#include "bench.hpp"

using namespace pg_outbox;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

RedisConnection redis_connect(const std::string& address) {
    return RedisConnection(RedisAddress::parse(address), "", 0, std::chrono::seconds(30));
}

// Reads every reply of a pipelined batch; counts error replies.
std::size_t drain_replies(RedisConnection& redis, std::size_t n) {
    std::size_t errors = 0;
    for (std::size_t i = 0; i < n; ++i)
        if (redis.get_reply_raw()->type == REDIS_REPLY_ERROR) ++errors;
    return errors;
}

int xadd_ceiling(const std::string& pg_conninfo, const std::string& redis_address, int batch, EntryFormat format) {
    // The entries of the format, as the relay of group g of database
    // "drain" or "formats" writes them (the source's length is what counts).
    EntryFields fields(format, "/pg_outbox/formats/formats");
    PgConnection pg(pg_conninfo, "pg_outbox_bench");
    auto r = pg.exec(
        "SELECT txid::text || '-' || seq, event_id, topic, key, payload, headers, created_at"
        "  FROM outbox.event ORDER BY txid, seq");
    std::vector<Event> events;
    events.reserve(r.rows());
    for (int i = 0; i < r.rows(); ++i) {
        Event e{std::string(r.get(i, 0)), std::string(r.get(i, 1)), std::string(r.get(i, 2)), std::nullopt,
                std::string(r.get(i, 4)), std::nullopt, std::string(r.get(i, 6))};
        if (auto k = r.get_optional(i, 3)) e.key = std::string(*k);
        if (auto h = r.get_optional(i, 5)) e.headers = std::string(*h);
        e.parsed = Position::parse(e.position).value_or(Position{});
        events.push_back(std::move(e));
    }
    auto redis = redis_connect(redis_address);
    const auto t0 = Clock::now();
    std::size_t errors = 0;
    std::vector<std::string> keys;
    std::vector<std::string> prevs;
    std::map<std::string, std::string> last;  // stream -> its last id: each entry's "prev", as the relay writes it
    for (std::size_t done = 0; done < events.size(); done += batch) {
        const auto n = std::min<std::size_t>(batch, events.size() - done);
        keys.clear();
        keys.reserve(n);
        prevs.clear();
        prevs.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
            const Event& e = events[done + i];
            keys.push_back("outbox:" + e.topic);
            auto [it, added] = last.try_emplace(keys.back(), "0-0");
            prevs.push_back(it->second);
            it->second = e.position;
            std::vector<std::string_view> argv{"XADD", keys.back(), e.position};
            fields.clear();
            append_entry_fields(argv, e, fields);
            argv.insert(argv.end(), {"prev", prevs.back()});
            redis.append(argv);
        }
        errors += drain_replies(redis, n);
    }
    const double secs = seconds_since(t0);
    std::printf("RESULT events %zu\nRESULT seconds %.3f\nRESULT events_per_second %.0f\nRESULT errors %zu\n",
                events.size(), secs, events.size() / secs, errors);
    return 0;
}

int naive_relay(const std::string& pg_conninfo, const std::string& redis_address, int batch) {
    EntryFields fields;  // the default format
    PgConnection pg(pg_conninfo, "pg_outbox_bench");
    auto redis = redis_connect(redis_address);
    const std::string limit = std::to_string(batch);
    std::size_t total = 0;
    const auto t0 = Clock::now();
    while (true) {
        pg.exec("BEGIN");
        auto r = pg.exec(
            "SELECT id, event_id, topic, key, payload, headers, created_at FROM naive_outbox"
            " WHERE status = 'new' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
            {limit});
        if (r.rows() == 0) {
            pg.exec("COMMIT");
            break;
        }
        std::vector<std::string> keys;
        keys.reserve(r.rows());
        std::string ids = "{";
        for (int i = 0; i < r.rows(); ++i) {
            Event e{std::string(r.get(i, 0)), std::string(r.get(i, 1)), std::string(r.get(i, 2)), std::nullopt,
                    std::string(r.get(i, 4)), std::nullopt, std::string(r.get(i, 6))};
            if (auto k = r.get_optional(i, 3)) e.key = std::string(*k);
            keys.push_back("outbox:" + e.topic);
            std::vector<std::string_view> argv{"XADD", keys.back(), "*"};
            fields.clear();
            append_entry_fields(argv, e, fields);
            redis.append(argv);
            ids += (i ? "," : "") + e.position;
        }
        ids += "}";
        drain_replies(redis, r.rows());
        pg.exec("UPDATE naive_outbox SET status = 'sent', updated_at = now() WHERE id = ANY ($1::bigint[])", {ids});
        pg.exec("COMMIT");
        total += r.rows();
    }
    const double secs = seconds_since(t0);
    std::printf("RESULT events %zu\nRESULT seconds %.3f\nRESULT events_per_second %.0f\n", total, secs,
                total / secs);
    return 0;
}

int latency(const std::string& redis_address, const std::string& stream, std::size_t count, int timeout_s,
            const std::string& samples) {
    auto redis = redis_connect(redis_address);
    std::vector<double> ms;
    ms.reserve(count);
    std::string last = "$";
    const auto t0 = Clock::now();
    while (ms.size() < count && seconds_since(t0) < timeout_s) {
        auto r = redis.command_raw({"XREAD", "COUNT", "1000", "BLOCK", "1000", "STREAMS", stream, last});
        const double now =
            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        if (r->type != REDIS_REPLY_ARRAY) continue;
        const redisReply* entries = r->element[0]->element[1];
        for (size_t i = 0; i < entries->elements; ++i) {
            const redisReply* e = entries->element[i];
            last = std::string(reply_text(e->element[0]));
            const redisReply* f = e->element[1];
            for (size_t j = 0; j + 1 < f->elements; j += 2) {
                if (reply_text(f->element[j]) != "payload") continue;
                const auto payload = nlohmann::json::parse(reply_text(f->element[j + 1]));
                ms.push_back((now - payload.at("t").get<double>()) * 1000.0);
            }
        }
    }
    if (ms.empty()) {
        std::printf("RESULT count 0\n");
        return 1;
    }
    std::sort(ms.begin(), ms.end());
    if (!samples.empty()) {
        std::FILE* f = std::fopen(samples.c_str(), "w");
        if (f == nullptr) {
            std::perror(samples.c_str());
            return 1;
        }
        for (double v : ms) std::fprintf(f, "%.3f\n", v);
        std::fclose(f);
    }
    auto pct = [&](double p) { return ms[std::min(ms.size() - 1, static_cast<std::size_t>(p * ms.size()))]; };
    std::printf("RESULT count %zu\nRESULT p50_ms %.2f\nRESULT p99_ms %.2f\nRESULT p999_ms %.2f\nRESULT max_ms %.2f\n",
                ms.size(), pct(0.50), pct(0.99), pct(0.999), ms.back());
    return 0;
}

int pgq_relay(const std::string& pg_conninfo, const std::string& redis_address, const std::string& consumer) {
    EntryFields fields;  // the default format
    PgConnection pg(pg_conninfo, "pg_outbox_bench");
    auto redis = redis_connect(redis_address);
    std::size_t total = 0;
    const auto t0 = Clock::now();
    while (true) {
        pg.exec("BEGIN");
        auto b = pg.exec("SELECT pgq.next_batch('bench', $1)", {consumer});
        if (b.is_null(0, 0)) {
            pg.exec("COMMIT");
            break;
        }
        const std::string batch(b.get(0, 0));
        auto r = pg.exec("SELECT ev_id, ev_type, ev_data, ev_time FROM pgq.get_batch_events($1)", {batch});
        std::vector<std::string> keys;
        keys.reserve(r.rows());
        for (int i = 0; i < r.rows(); ++i) {
            Event e{std::string(r.get(i, 0)), std::string(r.get(i, 0)), "topic", std::string(r.get(i, 1)),
                    std::string(r.get(i, 2)), std::nullopt, std::string(r.get(i, 3))};
            keys.push_back("outbox:pgq");
            std::vector<std::string_view> argv{"XADD", keys.back(), "*"};
            fields.clear();
            append_entry_fields(argv, e, fields);
            redis.append(argv);
        }
        drain_replies(redis, r.rows());
        pg.exec("SELECT pgq.finish_batch($1)", {batch});
        pg.exec("COMMIT");
        total += r.rows();
    }
    const double secs = seconds_since(t0);
    std::printf("RESULT events %zu\nRESULT seconds %.3f\nRESULT events_per_second %.0f\n", total, secs, total / secs);
    return 0;
}

int read_ack(const std::string& redis_address, const std::string& stream, int batch) {
    auto redis = redis_connect(redis_address);
    const std::string group = "bench-read-ack";
    redis.command_raw({"XGROUP", "DESTROY", stream, group});
    redis.command_raw({"XGROUP", "CREATE", stream, group, "0"});
    const auto count = std::to_string(batch);
    std::size_t total = 0;
    const auto t0 = Clock::now();
    while (true) {
        auto r = redis.command_raw({"XREADGROUP", "GROUP", group, "w", "COUNT", count, "STREAMS", stream, ">"});
        if (r->type != REDIS_REPLY_ARRAY || r->element[0]->element[1]->elements == 0) break;
        const redisReply* entries = r->element[0]->element[1];
        std::vector<std::string_view> argv{"XACK", stream, group};
        for (size_t i = 0; i < entries->elements; ++i) argv.push_back(reply_text(entries->element[i]->element[0]));
        redis.command_raw(argv);
        total += entries->elements;
    }
    const double secs = seconds_since(t0);
    redis.command_raw({"XGROUP", "DESTROY", stream, group});
    std::printf("RESULT events %zu\nRESULT seconds %.3f\nRESULT events_per_second %.0f\n", total, secs, total / secs);
    return 0;
}

int wait_entries(const std::vector<std::string>& nodes, const std::string& pattern, std::size_t count,
                 int timeout_s) {
    std::vector<RedisConnection> redis;
    for (const auto& node : nodes) redis.push_back(redis_connect(node));
    const auto t0 = Clock::now();
    std::size_t total = 0;
    while (seconds_since(t0) < timeout_s) {
        total = 0;
        for (auto& node : redis) {
            auto keys = node.command_raw({"KEYS", pattern});
            if (keys->type != REDIS_REPLY_ARRAY || keys->elements == 0) continue;
            for (std::size_t i = 0; i < keys->elements; ++i) node.append({"XLEN", reply_text(keys->element[i])});
            for (std::size_t i = 0; i < keys->elements; ++i) {
                auto n = node.get_reply_raw();
                if (n->type == REDIS_REPLY_INTEGER) total += static_cast<std::size_t>(n->integer);
            }
        }
        if (total >= count) {
            std::printf("RESULT entries %zu\nRESULT seconds %.3f\n", total, seconds_since(t0));
            return 0;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::fprintf(stderr, "wait-entries: %zu of %zu entries after %d s\n", total, count, timeout_s);
    return 1;
}

// The hand-written consumer, on libpq and hiredis as its author would use
// them: one session per worker, the handler and the dedupe insert prepared
// once, the statements of a transaction pipelined (two round trips a
// batch: the dedupe insert, whose result says which entries are new, then
// the handler for each new one and COMMIT).
class PgSession {
public:
    explicit PgSession(const std::string& conninfo) : conn_(PQconnectdb(conninfo.c_str())) {
        if (PQstatus(conn_) != CONNECTION_OK) fail("connection");
    }
    ~PgSession() { PQfinish(conn_); }
    PgSession(const PgSession&) = delete;
    PgSession& operator=(const PgSession&) = delete;

    void prepare(const char* name, const std::string& sql, std::vector<Oid> types) {
        PGresult* r = PQprepare(conn_, name, sql.c_str(), static_cast<int>(types.size()), types.data());
        const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok) fail(name);
    }
    void enter_pipeline() {
        if (PQenterPipelineMode(conn_) != 1) fail("pipeline mode");
    }
    void send(const char* sql) {
        if (PQsendQueryParams(conn_, sql, 0, nullptr, nullptr, nullptr, nullptr, 0) != 1) fail(sql);
    }
    void send_prepared(const char* name, const std::vector<const char*>& values) {
        if (PQsendQueryPrepared(conn_, name, static_cast<int>(values.size()), values.data(), nullptr, nullptr, 0) != 1)
            fail(name);
    }
    // Ends the pipeline's part and reads its results, up to the sync: each
    // statement's result is given to `each` (with its index) and must be
    // a success.
    template <typename F>
    void sync(F&& each) {
        if (PQpipelineSync(conn_) != 1) fail("sync");
        int index = 0, nulls = 0;
        while (true) {
            PGresult* r = PQgetResult(conn_);
            if (r == nullptr) {
                // one NULL ends each statement's results; two in a row:
                // the pipeline holds nothing more, its sync lost
                if (++nulls > 1) fail("pipeline ended before its sync");
                continue;
            }
            nulls = 0;
            const auto status = PQresultStatus(r);
            if (status == PGRES_PIPELINE_SYNC) {
                PQclear(r);
                return;
            }
            if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
                const std::string why = PQresultErrorMessage(r);
                PQclear(r);
                throw std::runtime_error("statement " + std::to_string(index) + ": " + why);
            }
            each(index++, r);
            PQclear(r);
        }
    }

private:
    [[noreturn]] void fail(const std::string& what) {
        throw std::runtime_error(what + ": " + PQerrorMessage(conn_));
    }
    PGconn* conn_;
};

struct HandConfig {
    std::string pg, redis, group, handler;
    // set-based instead: one statement a batch, with $1 the event ids
    // (uuid[]), $2 the topics, $3 the keys (text[]), $4 the payloads and
    // $5 the headers (jsonb[]), in the stream's order, that inserts the ids
    // into the dedupe table and applies the new ones itself
    std::string set_sql;
    std::vector<std::string> streams;
    int batch = 100, workers = 1;
    double seconds = 0;  // 0: until every stream is read
    bool bare = false;
};

struct HandTally {
    std::size_t read = 0, applied = 0;
};

// An array literal of the values (NULL for a null pointer), each quoted.
void append_array(std::string& out, const std::vector<const char*>& values) {
    out = "{";
    for (const char* v : values) {
        if (out.size() > 1) out += ',';
        if (v == nullptr) {
            out += "NULL";
            continue;
        }
        out += '"';
        for (const char* c = v; *c != '\0'; ++c) {
            if (*c == '"' || *c == '\\') out += '\\';
            out += *c;
        }
        out += '"';
    }
    out += '}';
}

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

// One worker: its streams, its sessions, until they are read (or for
// config.seconds).
HandTally hand_worker(const HandConfig& config, const std::vector<std::string>& streams, const std::string& name,
                      Clock::time_point t0) {
    HandTally tally;
    auto redis = redis_connect(config.redis);
    for (const auto& s : streams) redis.command_raw({"XGROUP", "CREATE", s, config.group, "0", "MKSTREAM"});
    std::unique_ptr<PgSession> pg;
    if (!config.bare) {
        pg = std::make_unique<PgSession>(config.pg);
        if (config.set_sql.empty()) {
            pg->prepare("dedupe",
                        "INSERT INTO bench_dedupe (event_id) SELECT unnest($1::uuid[]) ON CONFLICT DO NOTHING "
                        "RETURNING event_id",
                        {});
            // text, text, jsonb, jsonb, uuid: the parameters pg_outbox_relay
            // consume gives the handler
            pg->prepare("handler", config.handler, {25, 25, 3802, 3802, 2950});
        } else {  // uuid[], text[], text[], jsonb[], jsonb[]
            pg->prepare("set", config.set_sql, {2951, 1009, 1009, 3807, 3807});
        }
        pg->enter_pipeline();
    }
    const auto count = std::to_string(config.batch);
    const std::string block = "100";
    struct Entry {
        std::string_view stream, id;
        const char* fields[5] = {};  // event_id, topic, key, payload, headers: NUL-terminated by hiredis
    };
    std::vector<Entry> entries;
    std::unordered_set<std::string> fresh;
    std::string arrays[5];
    while (true) {
        if (config.seconds > 0 && seconds_since(t0) >= config.seconds) break;
        std::vector<std::string_view> argv{"XREADGROUP", "GROUP", config.group, name, "COUNT", count};
        if (config.seconds > 0) argv.insert(argv.end(), {"BLOCK", block});
        argv.push_back("STREAMS");
        for (const auto& s : streams) argv.push_back(s);
        for (std::size_t i = 0; i < streams.size(); ++i) argv.push_back(">");
        auto r = redis.command_raw(argv);
        if (r->type == REDIS_REPLY_ERROR) throw std::runtime_error("XREADGROUP: " + std::string(reply_text(r.get())));
        entries.clear();
        if (r->type == REDIS_REPLY_ARRAY) {
            for (std::size_t s = 0; s < r->elements; ++s) {
                const redisReply* stream = r->element[s];
                const redisReply* list = stream->element[1];
                for (std::size_t i = 0; i < list->elements; ++i) {
                    const redisReply* e = list->element[i];
                    Entry entry{reply_text(stream->element[0]), reply_text(e->element[0])};
                    const redisReply* f = e->element[1];
                    for (std::size_t j = 0; f->type == REDIS_REPLY_ARRAY && j + 1 < f->elements; j += 2) {
                        static constexpr std::string_view names[] = {"event_id", "topic", "key", "payload", "headers"};
                        for (int k = 0; k < 5; ++k)
                            if (reply_text(f->element[j]) == names[k]) entry.fields[k] = f->element[j + 1]->str;
                    }
                    entries.push_back(entry);
                }
            }
        }
        if (entries.empty()) {
            if (config.seconds > 0) continue;
            break;
        }
        tally.read += entries.size();
        if (pg && !config.set_sql.empty()) {
            // one round trip: BEGIN, the statement, COMMIT
            std::vector<const char*> column(entries.size());
            for (int k = 0; k < 5; ++k) {
                for (std::size_t i = 0; i < entries.size(); ++i) column[i] = entries[i].fields[k];
                append_array(arrays[k], column);
            }
            pg->send("BEGIN");
            // the columns in the statement's order: ids, topics, keys, payloads, headers
            pg->send_prepared("set", {arrays[0].c_str(), arrays[1].c_str(), arrays[2].c_str(), arrays[3].c_str(),
                                      arrays[4].c_str()});
            pg->send("COMMIT");
            pg->sync([&](int index, PGresult* res) {
                if (index == 1) tally.applied += std::strtoull(PQcmdTuples(res), nullptr, 10);
            });
        } else if (pg) {
            // BEGIN and the dedupe insert: which of the batch are new
            std::string array = "{";
            for (const auto& e : entries) {
                if (e.fields[0] == nullptr) throw std::runtime_error("an entry without event_id");
                if (array.size() > 1) array += ',';
                array += e.fields[0];
            }
            array += '}';
            pg->send("BEGIN");
            pg->send_prepared("dedupe", {array.c_str()});
            fresh.clear();
            pg->sync([&](int index, PGresult* res) {
                if (index != 1) return;
                for (int i = 0; i < PQntuples(res); ++i) fresh.insert(PQgetvalue(res, i, 0));
            });
            // the handler for each new one, in the stream's order, and COMMIT
            for (const auto& e : entries) {
                if (fresh.count(lower(e.fields[0])) == 0) continue;
                pg->send_prepared("handler", {e.fields[1], e.fields[2], e.fields[3], e.fields[4], e.fields[0]});
                ++tally.applied;
            }
            pg->send("COMMIT");
            pg->sync([](int, PGresult*) {});
        }
        // XACK, a command per stream, pipelined
        std::size_t acks = 0;
        for (const auto& s : streams) {
            std::vector<std::string_view> ack{"XACK", s, config.group};
            for (const auto& e : entries)
                if (e.stream == s) ack.push_back(e.id);
            if (ack.size() == 3) continue;
            redis.append(ack);
            ++acks;
        }
        if (drain_replies(redis, acks) != 0) throw std::runtime_error("XACK refused");
    }
    return tally;
}

int hand_consume(const HandConfig& config) {
    const int n = std::max(1, std::min<int>(config.workers, static_cast<int>(config.streams.size())));
    std::vector<std::vector<std::string>> shares(n);
    for (std::size_t i = 0; i < config.streams.size(); ++i) shares[i % n].push_back(config.streams[i]);
    std::vector<HandTally> tallies(n);
    std::vector<std::string> errors(n);
    std::vector<std::thread> threads;
    const auto t0 = Clock::now();
    for (int w = 0; w < n; ++w)
        threads.emplace_back([&, w] {
            try {
                tallies[w] = hand_worker(config, shares[w], "w" + std::to_string(w), t0);
            } catch (const std::exception& e) {
                errors[w] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    const double secs = seconds_since(t0);
    HandTally total;
    for (const auto& t : tallies) {
        total.read += t.read;
        total.applied += t.applied;
    }
    std::printf("RESULT events %zu\nRESULT applied %zu\nRESULT seconds %.3f\nRESULT events_per_second %.0f\n",
                total.read, total.applied, secs, total.read / secs);
    int rc = 0;
    for (int w = 0; w < n; ++w)
        if (!errors[w].empty()) {
            std::fprintf(stderr, "hand-consume: worker %d: %s\n", w, errors[w].c_str());
            rc = 1;
        }
    return rc;
}

int wait_rows(const std::string& pg_conninfo, const std::string& sql, long long count, int timeout_s,
              int interval_ms) {
    PgConnection pg(pg_conninfo, "pg_outbox_bench");
    const auto t0 = Clock::now();
    long long n = 0;
    while (seconds_since(t0) < timeout_s) {
        n = std::stoll(std::string(pg.exec(sql).get(0, 0)));
        if (n >= count) {
            std::printf("RESULT rows %lld\nRESULT seconds %.3f\n", n, seconds_since(t0));
            return 0;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    }
    std::fprintf(stderr, "wait-rows: %lld of %lld rows after %d s\n", n, count, timeout_s);
    return 1;
}

}  // namespace

int main(int argc, char** argv) {
    // A baseline's statement may run for minutes on a large backlog: the
    // relay's bound on a wait (--pg-timeout) is not the benchmark's.
    pg_outbox::set_pg_timeout(std::chrono::hours(1));
    CLI::App app{"pg_outbox_bench: baselines and probes for bench/run.sh"};
    app.require_subcommand(1);
    std::string pg, redis = "127.0.0.1:6379", stream;
    int batch = 1000, timeout_s = 60;
    std::size_t count = 0;
    auto* ceiling = app.add_subcommand("xadd-ceiling", "pipelined XADD of the outbox's events, preloaded");
    auto* naive = app.add_subcommand("naive-relay", "the status-column outbox relay");
    auto* lat = app.add_subcommand("latency", "commit-to-stream latency of arriving entries");
    auto* ra = app.add_subcommand("read-ack", "a bare XREADGROUP and XACK loop over a stream");
    auto* pq = app.add_subcommand("pgq-relay", "a PgQ consumer publishing to Redis");
    auto* we = app.add_subcommand("wait-entries", "waits until streams hold a number of entries");
    std::string pattern = "outbox:*";
    std::string consumer;
    pq->add_option("--pg", pg)->required();
    pq->add_option("--consumer", consumer)->required();
    std::string ceiling_format = "default";
    ceiling->add_option("--format", ceiling_format, "the entries' format, as pg_outbox_relay publish --format")
        ->check(CLI::IsMember({"default", "cloudevents", "cloudevents-structured"}));
    for (auto* sub : {ceiling, naive}) {
        sub->add_option("--pg", pg)->required();
        sub->add_option("--batch", batch);
    }
    for (auto* sub : {ceiling, naive, lat, ra, pq}) sub->add_option("--redis", redis);
    std::vector<std::string> nodes;
    we->add_option("--redis", nodes, "a Redis address; each master's, for a Redis Cluster");
    we->add_option("--pattern", pattern);
    we->add_option("--count", count)->required();
    we->add_option("--timeout", timeout_s);
    ra->add_option("--stream", stream)->required();
    ra->add_option("--batch", batch);
    lat->add_option("--stream", stream)->required();
    lat->add_option("--count", count)->required();
    lat->add_option("--timeout", timeout_s);
    std::string samples;
    lat->add_option("--samples", samples, "writes every latency (ms), sorted, one a line");
    HandConfig hand;
    auto* hc = app.add_subcommand("hand-consume", "a consumer written by hand: the baseline of consume");
    hc->add_option("--pg", hand.pg);
    hc->add_option("--redis", hand.redis);
    hc->add_option("--group", hand.group)->required();
    hc->add_option("--stream", hand.streams)->required();
    hc->add_option("--handler", hand.handler);
    hc->add_option("--set-sql", hand.set_sql, "set-based: one statement a batch that dedupes and applies");
    hc->add_option("--batch", hand.batch)->check(CLI::Range(1, 100000));
    hc->add_option("--workers", hand.workers)->check(CLI::Range(1, 256));
    hc->add_option("--seconds", hand.seconds, "follow the streams for that long");
    hc->add_flag("--bare", hand.bare, "XREADGROUP and XACK only");
    auto* wr = app.add_subcommand("wait-rows", "waits until a query's count reaches a number");
    std::string sql;
    wr->add_option("--pg", pg)->required();
    wr->add_option("--sql", sql)->required();
    wr->add_option("--count", count)->required();
    wr->add_option("--timeout", timeout_s);
    int interval_ms = 200;
    wr->add_option("--interval", interval_ms, "milliseconds between polls: each poll costs the server its query")
        ->check(CLI::Range(1, 60000));
    auto* run = app.add_subcommand("run", "the benchmark: its workloads on throwaway servers");
    std::vector<std::string> only;
    std::string relay = PG_OUTBOX_RELAY_PATH, results = "bench/results", rows_dir;
    run->add_option("--only", only, "workloads to run (default: all), comma-separated")->delimiter(',');
    run->add_option("--relay", relay, "the pg_outbox_relay program");
    run->add_option("--results", results, "where the report goes (\"\": printed only)");
    run->add_option("--rows-dir", rows_dir, "also writes each workload's rows to DIR/<workload>.md");
    std::string chart_prefix;
    run->add_option("--chart-prefix", chart_prefix, "charts go to PREFIX-<name>.png (default: beside the report)");
    CLI11_PARSE(app, argc, argv);
    if (run->parsed()) return pg_outbox::bench::run_benchmark(only, relay, results, rows_dir, chart_prefix);
    if (hc->parsed()) {
        if (!hand.bare && (hand.pg.empty() || hand.handler.empty() == hand.set_sql.empty())) {
            std::fprintf(stderr, "hand-consume: --pg and one of --handler and --set-sql are needed unless --bare\n");
            return 2;
        }
        return hand_consume(hand);
    }
    if (wr->parsed()) return wait_rows(pg, sql, static_cast<long long>(count), timeout_s, interval_ms);
    if (ceiling->parsed())
        return xadd_ceiling(pg, redis, batch,
                            ceiling_format == "cloudevents"              ? EntryFormat::cloudevents
                            : ceiling_format == "cloudevents-structured" ? EntryFormat::cloudevents_structured
                                                                          : EntryFormat::plain);
    if (naive->parsed()) return naive_relay(pg, redis, batch);
    if (ra->parsed()) return read_ack(redis, stream, batch);
    if (pq->parsed()) return pgq_relay(pg, redis, consumer);
    if (we->parsed()) return wait_entries(nodes.empty() ? std::vector<std::string>{redis} : nodes, pattern, count,
                                          timeout_s);
    return latency(redis, stream, count, timeout_s, samples);
}
