// pg_outbox_bench: baselines and probes for bench/run.sh.
//
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
//
// Each prints "RESULT <name> <value>" lines.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>
#include <vector>

#include "pg_outbox/event.hpp"
#include "pg_outbox/pg.hpp"
#include "pg_outbox/redis.hpp"

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

int xadd_ceiling(const std::string& pg_conninfo, const std::string& redis_address, int batch) {
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
            append_entry_fields(argv, e);
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
            append_entry_fields(argv, e);
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
            append_entry_fields(argv, e);
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
    CLI11_PARSE(app, argc, argv);
    if (ceiling->parsed()) return xadd_ceiling(pg, redis, batch);
    if (naive->parsed()) return naive_relay(pg, redis, batch);
    if (ra->parsed()) return read_ack(redis, stream, batch);
    if (pq->parsed()) return pgq_relay(pg, redis, consumer);
    if (we->parsed()) return wait_entries(nodes.empty() ? std::vector<std::string>{redis} : nodes, pattern, count,
                                          timeout_s);
    return latency(redis, stream, count, timeout_s, samples);
}
