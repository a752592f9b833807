// Counters and gauges of the relay, rendered in the Prometheus text format,
// and the HTTP endpoint that serves them with a health check.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "pg_outbox/config.hpp"

namespace httplib {
class Server;
}

namespace pg_outbox {

class MetricFamilies;

class Metrics {
public:
    // Every series is labelled mode and group: in publish mode the
    // group is the outbox group; in consume mode the Redis consumer group,
    // and consumer labels the inbox identity (consumer="...").
    // stuck_after: how long a leader may have events waiting without
    // publishing any before health fails (0: never).
    explicit Metrics(std::string mode, std::string group,
                     std::chrono::milliseconds stuck_after = std::chrono::milliseconds(0), std::string consumer = {});

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
    // -1: not counted yet (the series is left out, as it is on a standby).
    std::atomic<std::int64_t> lag_events{-1};
    // What an open transaction holds back above the horizon (xid8 order):
    // committed events no relay may publish yet, and how long the oldest
    // has waited. Measured with lag_events (-1: not yet).
    std::atomic<std::int64_t> held_back_events{-1};
    std::atomic<double> held_back_seconds{0};
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
    std::atomic<std::uint64_t> batches_isolated{0};
    std::atomic<double> pending_oldest_idle_seconds{0};
    // Parked keys (--on-failure park-key, and the parks any worker of the
    // consumer made): the keys of the streams this worker reads that are
    // parked, in any state, at the last poll (0 before the first); the
    // entries this worker parked (stored, acknowledged, not applied); the
    // parked entries its drains applied.
    std::atomic<std::int64_t> keys_parked{0};
    std::atomic<std::uint64_t> entries_parked{0};
    std::atomic<std::uint64_t> entries_redriven{0};
    // consume --pool: streams this worker holds, and the streams it took,
    // let go of for a worker that joined, and lost (its lease ran out or
    // another worker holds it).
    std::atomic<bool> pool{false};
    std::atomic<std::int64_t> pool_streams_owned{0};
    std::atomic<std::uint64_t> pool_taken{0};
    std::atomic<std::uint64_t> pool_released{0};
    std::atomic<std::uint64_t> pool_lost{0};

    // both
    std::atomic<bool> pg_connected{false};
    std::atomic<bool> redis_connected{false};
    // The PostgreSQL server is a standby: the relay waits for a primary.
    std::atomic<bool> pg_in_recovery{false};

    // Gaps found in a stream (consume): entries missing before the group
    // read them. add_gap_stream() exposes a stream's series at 0.
    void add_gap_stream(const std::string& stream);
    void count_gap(const std::string& stream);

    // Counts an error by kind: one of error_kinds(mode) ("pg",
    // "redis_io", redis_error_kind(...), ...).
    void count_error(const std::string& kind);

    // The loop calls this each turn; health fails when it stops.
    void heartbeat();

    // The leadership's lease (publish mode): set_lease() once, then
    // lease_renewed() with the time a statement that renews it (the lead,
    // a fetch, an advance) was sent, once it succeeded: the server renewed
    // the lease after that instant, so that it runs out no earlier than
    // "sent" + lease. leads(): leader, and the lease still runs by this
    // relay's clock. A leader cut from PostgreSQL cannot know whether a
    // standby took over, but past its lease one may have: it no longer
    // says that it leads (/health, pg_outbox_relay_leader), whatever its
    // connection looks like.
    void set_lease(std::chrono::milliseconds lease) { lease_ms_ = lease.count(); }
    void lease_renewed(std::chrono::steady_clock::time_point sent);
    bool leads() const;
    // How long ago the lease was last renewed, in ms; -1 when never.
    std::int64_t lease_age_ms() const;

    // What the leader's publishing looks like, for the stall clock: the
    // feed ran dry (nothing waits); a batch was fetched (events wait from
    // now, unless they waited already); a batch was published (the clock
    // starts again). The clock stops while the relay does not lead. An
    // empty feed has no lag: lag_seconds goes to 0.
    void caught_up();
    void batch_waiting();
    void batch_published();
    // How long the leader has had events waiting without publishing any.
    std::chrono::milliseconds stalled() const;

    struct Health {
        bool ok;
        std::string text;  // "ok leader\n", or why not
    };
    Health health(std::chrono::seconds max_silence) const;

    // The pg_outbox version and engine (c or sql) of the database
    // connected to, for build_info.
    void set_extension(std::string version, std::string engine);

    // The group's next event is too large to publish (SQLSTATE OB004): the
    // leader holds there, health fails saying why and how to pass it, and
    // pg_outbox_relay_event_too_large is 1, until the group moves on (an
    // admin's outbox_skip()) or this relay stops leading.
    void set_event_too_large(std::string why);
    void clear_event_too_large();
    bool event_too_large() const { return event_too_large_.load(); }

    // The consumer's parked entries reached its park_limit (SQLSTATE
    // OB005): the worker holds its batch, health fails saying why, and
    // pg_outbox_relay_park_limit_reached is 1, until a held batch goes
    // through.
    void set_park_limit(std::string why);
    void clear_park_limit();
    bool park_limit_reached() const { return park_limit_reached_.load(); }

    // A run that ended in a fatal error, in a relay that starts it again
    // (one of several groups of a process): health fails, saying why,
    // until clear_failed().
    void set_failed(std::string why);
    void clear_failed();

    std::string render() const;
    const std::string& mode() const { return mode_; }
    // The group label's value.
    const std::string& group() const { return group_; }

private:
    friend std::string render_metrics(const std::vector<const Metrics*>& all);
    // Adds this relay's samples to their families: the mode's series, then
    // the errors by kind.
    void collect(MetricFamilies& out) const;
    void collect_errors(MetricFamilies& out) const;

    std::string mode_;
    std::string group_;
    std::string labels_;  // mode, consumer (consume mode), group
    mutable std::mutex errors_mutex_;
    std::map<std::string, std::uint64_t> errors_;
    std::map<std::string, std::uint64_t> gaps_;  // under errors_mutex_
    std::string last_error_;
    std::string extension_version_;  // under errors_mutex_
    std::string engine_;             // under errors_mutex_
    std::string failed_;             // under errors_mutex_; empty: not failed
    std::string too_large_;          // under errors_mutex_: why, while event_too_large_
    std::atomic<bool> event_too_large_{false};
    std::string park_limit_;  // under errors_mutex_: why, while park_limit_reached_
    std::atomic<bool> park_limit_reached_{false};
    std::atomic<std::int64_t> last_heartbeat_ms_{0};
    const std::chrono::milliseconds stuck_after_;
    std::atomic<std::int64_t> waiting_since_ms_{0};  // 0: nothing waits
    std::atomic<std::int64_t> lease_ms_{0};          // 0: no lease (consume mode)
    std::atomic<std::int64_t> lease_renewed_ms_{0};  // steady clock; 0: never
};

// The error kinds a mode ("publish", "consume") counts, each exposed at 0
// from the start so that rate() sees the first error.
const std::vector<std::string>& error_kinds(std::string_view mode);

// The kind a Redis error counts as, from RedisError::code(): "redis_io",
// "redis_" and the code for the codes Redis is known to answer with
// (OOM, READONLY, WRONGTYPE, ...), "redis_other" for the rest, so that
// the kinds stay a fixed set.
std::string redis_error_kind(std::string_view code);

// The process metrics Prometheus client libraries expose, in the text
// format: process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds,
// process_start_time_seconds (from /proc/self and getrlimit; a value it
// cannot read is left out).
std::string process_metrics();

// A label value in the Prometheus text format: backslash, double quote
// and newline escaped.
std::string prometheus_label_value(std::string_view value);

// The metrics of several relays of one process in one text (publish mode,
// a thread per group): each family once (HELP, TYPE), with a series per
// relay labelled by its group; build_info and the process metrics once.
// With one relay, the same as its render().
std::string render_metrics(const std::vector<const Metrics*>& all);

// The Metrics of every group a process publishes, for its endpoint: each
// added when its group's thread starts, and kept as long as the set.
class MetricsSet {
public:
    Metrics& add(const std::string& group, std::chrono::milliseconds stuck_after);
    std::string render() const;
    // With one group, its health; with several, ok only when every group
    // is, and a line per group, "<group>: <its health>". None yet:
    // "starting".
    Metrics::Health health(std::chrono::seconds max_silence) const;

private:
    mutable std::mutex mutex_;
    std::vector<std::unique_ptr<Metrics>> all_;
};

// Serves GET /metrics and GET /health in its own thread. An address
// without a host listens on every interface, IPv4 and IPv6 ([::] with
// IPv4-mapped addresses; 0.0.0.0 where IPv6 is off). Throws ConfigError
// when it cannot listen.
// The metrics endpoint. It takes at most kMaxConnections descriptors
// (kWorkers connections served at once, the rest queued; beyond that the
// connections wait in the kernel's listen queue, unaccepted), and a
// connection that sends no request is closed after kIdleTimeout: a flood
// of idle connections neither blinds /health for long nor takes the
// descriptors that the data connections need.
class MetricsServer {
public:
    static constexpr std::size_t kWorkers = 8;
    static constexpr std::size_t kMaxConnections = 32;
    static constexpr std::chrono::seconds kIdleTimeout{1};

    MetricsServer(const ListenAddress& address, const Metrics& metrics);
    MetricsServer(const ListenAddress& address, const MetricsSet& metrics);
    // Where it listens, e.g. "127.0.0.1:9100" or "[::]:9100".
    const std::string& address() const { return bound_; }
    ~MetricsServer();
    MetricsServer(const MetricsServer&) = delete;
    MetricsServer& operator=(const MetricsServer&) = delete;

private:
    MetricsServer(const ListenAddress& address, std::function<std::string()> render,
                  std::function<Metrics::Health()> health);

    std::unique_ptr<httplib::Server> server_;
    std::string bound_;
    std::thread thread_;
};

}  // namespace pg_outbox
