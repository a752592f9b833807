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
#include <thread>

namespace httplib {
class Server;
}

namespace pg_outbox {

class Metrics {
public:
    explicit Metrics(std::string mode, std::string group) : mode_(std::move(mode)), group_(std::move(group)) {}

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

    // Counts an error by kind ("pg", "redis_io", "redis_OOM", ...).
    void count_error(const std::string& kind);

    // The loop calls this each turn; health fails when it stops.
    void heartbeat();
    bool healthy(std::chrono::seconds max_silence) const;

    std::string render() const;
    const std::string& mode() const { return mode_; }

private:
    void render_errors(std::ostream& out, const std::string& labels) const;

    std::string mode_;
    std::string group_;
    mutable std::mutex errors_mutex_;
    std::map<std::string, std::uint64_t> errors_;
    std::atomic<std::int64_t> last_heartbeat_ms_{0};
};

// Serves GET /metrics and GET /health on "host:port" in its own thread.
class MetricsServer {
public:
    MetricsServer(const std::string& address, const Metrics& metrics);
    ~MetricsServer();
    MetricsServer(const MetricsServer&) = delete;
    MetricsServer& operator=(const MetricsServer&) = delete;

private:
    std::unique_ptr<httplib::Server> server_;
    std::thread thread_;
};

}  // namespace pg_outbox
