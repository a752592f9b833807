// Counters and gauges of the relay, rendered in the Prometheus text format,
// and the HTTP endpoint that serves them with a health check.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>

#include "pg_outbox/config.hpp"

namespace httplib {
class Server;
}

namespace pg_outbox {

class Metrics {
public:
    // stuck_after: how long a leader may have events waiting without
    // publishing any before health fails (0: never).
    explicit Metrics(std::string mode, std::string group,
                     std::chrono::milliseconds stuck_after = std::chrono::milliseconds(0))
        : mode_(std::move(mode)), group_(std::move(group)), stuck_after_(stuck_after) {}

    // publish
    std::atomic<std::uint64_t> events_published{0};
    std::atomic<std::uint64_t> events_already_published{0};
    std::atomic<std::uint64_t> batches_published{0};
    std::atomic<std::uint64_t> streams_rewound{0};
    std::atomic<std::uint64_t> rewinds_noticed{0};
    // Batches written by each path: a transaction of plain XADDs, or the
    // append script.
    std::atomic<std::uint64_t> transaction_batches{0};
    std::atomic<std::uint64_t> script_batches{0};
    std::atomic<std::int64_t> lag_events{-1};
    std::atomic<double> lag_seconds{0};
    std::atomic<double> pg_rtt_seconds{0};
    std::atomic<double> redis_rtt_seconds{0};
    std::atomic<bool> leader{false};
    // Redis refused even a single entry for want of memory (OOM); cleared
    // by the next write Redis takes, and when the relay stops leading.
    std::atomic<bool> redis_oom{false};

    // consume
    std::atomic<std::uint64_t> events_applied{0};
    std::atomic<std::uint64_t> events_duplicate{0};
    std::atomic<std::uint64_t> events_conflict{0};
    std::atomic<std::uint64_t> events_failed{0};
    std::atomic<std::uint64_t> dead_letters{0};
    std::atomic<std::uint64_t> entries_reclaimed{0};
    std::atomic<std::uint64_t> entries_malformed{0};
    std::atomic<double> pending_oldest_idle_seconds{0};

    // both
    std::atomic<bool> pg_connected{false};
    std::atomic<bool> redis_connected{false};
    // The PostgreSQL server is a standby: the relay waits for a primary.
    std::atomic<bool> pg_in_recovery{false};

    // Counts an error by kind ("pg", "redis_io", "redis_OOM", ...).
    void count_error(const std::string& kind);

    // The loop calls this each turn; health fails when it stops.
    void heartbeat();

    // What the leader's publishing looks like, for the stall clock: the
    // feed ran dry (nothing waits); a batch was fetched (events wait from
    // now, unless they waited already); a batch was published (the clock
    // starts again). The clock stops while the relay does not lead.
    void caught_up() { waiting_since_ms_ = 0; }
    void batch_waiting();
    void batch_published();
    // How long the leader has had events waiting without publishing any.
    std::chrono::milliseconds stalled() const;

    struct Health {
        bool ok;
        std::string text;  // "ok leader\n", or why not
    };
    Health health(std::chrono::seconds max_silence) const;

    std::string render() const;
    const std::string& mode() const { return mode_; }

private:
    void render_errors(std::ostream& out, const std::string& labels) const;

    std::string mode_;
    std::string group_;
    mutable std::mutex errors_mutex_;
    std::map<std::string, std::uint64_t> errors_;
    std::string last_error_;
    std::atomic<std::int64_t> last_heartbeat_ms_{0};
    const std::chrono::milliseconds stuck_after_;
    std::atomic<std::int64_t> waiting_since_ms_{0};  // 0: nothing waits
};

// A label value in the Prometheus text format: backslash, double quote
// and newline escaped.
std::string prometheus_label_value(std::string_view value);

// Serves GET /metrics and GET /health in its own thread. An address
// without a host listens on every interface, IPv4 and IPv6 ([::] with
// IPv4-mapped addresses; 0.0.0.0 where IPv6 is off). Throws ConfigError
// when it cannot listen.
class MetricsServer {
public:
    MetricsServer(const ListenAddress& address, const Metrics& metrics);
    // Where it listens, e.g. "127.0.0.1:9100" or "[::]:9100".
    const std::string& address() const { return bound_; }
    ~MetricsServer();
    MetricsServer(const MetricsServer&) = delete;
    MetricsServer& operator=(const MetricsServer&) = delete;

private:
    std::unique_ptr<httplib::Server> server_;
    std::string bound_;
    std::thread thread_;
};

}  // namespace pg_outbox
