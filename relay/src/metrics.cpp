#include "pg_outbox/metrics.hpp"

#include <httplib.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/log.hpp"

namespace pg_outbox {

namespace {

std::int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

constexpr std::string_view kRedisCodes[] = {"BUSY",    "ERR",    "EXECABORT", "LOADING",  "MASTERDOWN", "MISCONF",
                                            "NOGROUP", "NOPERM", "NOSCRIPT",  "READONLY", "OOM",        "WRONGTYPE"};

std::vector<std::string> kinds_of(std::initializer_list<std::string> own) {
    std::vector<std::string> kinds(own);
    kinds.push_back("redis_io");
    for (const auto code : kRedisCodes) kinds.push_back("redis_" + std::string(code));
    kinds.push_back("redis_other");
    return kinds;
}

}  // namespace

const std::vector<std::string>& error_kinds(std::string_view mode) {
    static const auto publish = kinds_of({"pg", "maintenance", "event_too_large"});
    static const auto consume = kinds_of({"pg", "pg_configuration", "pg_transient", "park_limit"});
    return mode == "consume" ? consume : publish;
}

std::string redis_error_kind(std::string_view code) {
    if (code == "io") return "redis_io";
    for (const auto known : kRedisCodes)
        if (code == known) return "redis_" + std::string(code);
    return "redis_other";
}

Metrics::Metrics(std::string mode, std::string group, std::chrono::milliseconds stuck_after, std::string consumer)
    : mode_(std::move(mode)), group_(std::move(group)), stuck_after_(stuck_after) {
    labels_ = "mode=\"" + prometheus_label_value(mode_) + "\"";
    if (mode_ == "consume") labels_ += ",consumer=\"" + prometheus_label_value(consumer) + "\"";
    labels_ += ",group=\"" + prometheus_label_value(group_) + "\"";
    for (const auto& kind : error_kinds(mode_)) errors_[kind] = 0;
}

std::string process_metrics() {
    std::ostringstream out;
    out.precision(15);
    auto metric = [&](const char* name, const char* type, const char* help, auto value) {
        out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
            << name << ' ' << value << '\n';
    };
    const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
    std::ifstream stat_file("/proc/self/stat");
    const std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
    // The fields after the command name, which is in parentheses and may
    // hold anything: field n of proc(5) is fields[n - 3].
    std::vector<std::string> fields;
    if (const auto close = stat.rfind(')'); close != std::string::npos) {
        std::istringstream rest(stat.substr(close + 1));
        for (std::string f; rest >> f;) fields.push_back(f);
    }
    auto field = [&](std::size_t n) { return std::stod(fields.at(n - 3)); };
    if (fields.size() >= 22 && ticks > 0) {
        metric("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
               (field(14) + field(15)) / ticks);
        metric("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", field(23));
        metric("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
               field(24) * static_cast<double>(::sysconf(_SC_PAGESIZE)));
        std::ifstream proc_stat("/proc/stat");
        for (std::string line; std::getline(proc_stat, line);) {
            if (line.rfind("btime ", 0) != 0) continue;
            metric("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
                   std::stod(line.substr(6)) + field(22) / ticks);
            break;
        }
    }
    std::error_code ec;
    std::size_t fds = 0;
    for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) ++fds;
    // The iterator's own descriptor is counted too, as client libraries
    // count theirs.
    if (!ec) metric("process_open_fds", "gauge", "Number of open file descriptors.", fds);
    if (struct rlimit limit; ::getrlimit(RLIMIT_NOFILE, &limit) == 0)
        metric("process_max_fds", "gauge", "Maximum number of open file descriptors.",
               limit.rlim_cur == RLIM_INFINITY ? -1.0 : static_cast<double>(limit.rlim_cur));
    return out.str();
}

std::string prometheus_label_value(std::string_view value) {
    std::string out;
    out.reserve(value.size());
    for (char c : value) {
        if (c == '\\') out += "\\\\";
        else if (c == '"') out += "\\\"";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

void Metrics::count_error(const std::string& kind) {
    std::lock_guard lock(errors_mutex_);
    ++errors_[kind];
    last_error_ = kind;
}

void Metrics::caught_up() {
    waiting_since_ms_ = 0;
    lag_seconds = 0;
}

void Metrics::set_extension(std::string version, std::string engine) {
    std::lock_guard lock(errors_mutex_);
    extension_version_ = std::move(version);
    engine_ = std::move(engine);
}

void Metrics::add_gap_stream(const std::string& stream) {
    std::lock_guard lock(errors_mutex_);
    gaps_.try_emplace(stream, 0);
}

void Metrics::count_gap(const std::string& stream) {
    std::lock_guard lock(errors_mutex_);
    gaps_[stream]++;
}

void Metrics::set_failed(std::string why) {
    std::lock_guard lock(errors_mutex_);
    failed_ = std::move(why);
}

void Metrics::clear_failed() {
    std::lock_guard lock(errors_mutex_);
    failed_.clear();
}

void Metrics::set_event_too_large(std::string why) {
    std::lock_guard lock(errors_mutex_);
    too_large_ = std::move(why);
    event_too_large_ = true;
}

void Metrics::clear_event_too_large() {
    std::lock_guard lock(errors_mutex_);
    too_large_.clear();
    event_too_large_ = false;
}

void Metrics::set_park_limit(std::string why) {
    std::lock_guard lock(errors_mutex_);
    park_limit_ = std::move(why);
    park_limit_reached_ = true;
}

void Metrics::clear_park_limit() {
    std::lock_guard lock(errors_mutex_);
    park_limit_.clear();
    park_limit_reached_ = false;
}

void Metrics::heartbeat() { last_heartbeat_ms_.store(now_ms()); }

void Metrics::lease_renewed(std::chrono::steady_clock::time_point sent) {
    lease_renewed_ms_.store(
        std::chrono::duration_cast<std::chrono::milliseconds>(sent.time_since_epoch()).count());
}

std::int64_t Metrics::lease_age_ms() const {
    const auto renewed = lease_renewed_ms_.load();
    return renewed == 0 ? -1 : now_ms() - renewed;
}

bool Metrics::leads() const {
    if (!leader.load()) return false;
    const auto lease = lease_ms_.load();
    const auto age = lease_age_ms();
    return lease == 0 || (age >= 0 && age < lease);
}

void Metrics::batch_waiting() {
    std::int64_t none = 0;
    waiting_since_ms_.compare_exchange_strong(none, now_ms());
}

void Metrics::batch_published() { waiting_since_ms_ = now_ms(); }

std::chrono::milliseconds Metrics::stalled() const {
    const auto since = waiting_since_ms_.load();
    if (!leader.load() || since == 0) return std::chrono::milliseconds(0);
    return std::chrono::milliseconds(now_ms() - since);
}

Metrics::Health Metrics::health(std::chrono::seconds max_silence) const {
    {
        std::lock_guard lock(errors_mutex_);
        if (!failed_.empty()) return {false, "failed: " + escape_control(failed_) + "\n"};
    }
    const auto last = last_heartbeat_ms_.load();
    if (last == 0) return {false, "starting\n"};
    const auto silent = now_ms() - last;
    if (silent > std::chrono::duration_cast<std::chrono::milliseconds>(max_silence).count())
        return {false, "unhealthy: the relay's loop has not turned for " + std::to_string(silent / 1000) + "s\n"};
    // Before the connections: the held batch is retried on new sessions,
    // so the connection comes and goes, and the limit is what to fix.
    if (park_limit_reached_.load()) {
        std::lock_guard lock(errors_mutex_);
        return {false, "unhealthy: " + escape_control(park_limit_) + "\n"};
    }
    if (pg_in_recovery.load())
        return {false, "unhealthy: PostgreSQL is a standby (in recovery); waiting for a primary\n"};
    if (!pg_connected.load()) return {false, "unhealthy: not connected to PostgreSQL\n"};
    if (!redis_connected.load()) return {false, "unhealthy: not connected to Redis\n"};
    if (mode_ == "consume") return {true, "ok\n"};
    if (!leader.load()) return {true, "ok standby\n"};
    if (!leads()) {
        const auto age = lease_age_ms();
        return {false, "unhealthy: not leading: the lease was last renewed " +
                           (age < 0 ? std::string("never") : std::to_string(age / 1000) + "s ago") + ", beyond --lease (" +
                           std::to_string(lease_ms_.load()) +
                           " ms); another relay may lead the group (PostgreSQL does not answer)\n"};
    }
    if (event_too_large_.load()) {
        std::lock_guard lock(errors_mutex_);
        return {false, "unhealthy: " + escape_control(too_large_) + "\n"};
    }
    if (redis_oom.load())
        return {false, "unhealthy: Redis refuses writes: OOM (its used memory is above maxmemory); the backlog "
                       "waits in PostgreSQL until Redis has room\n"};
    if (const auto stall = stalled(); stuck_after_.count() > 0 && stall > stuck_after_) {
        std::string last_error;
        {
            std::lock_guard lock(errors_mutex_);
            last_error = last_error_;
        }
        return {false, "stuck: events have waited " + std::to_string(stall.count() / 1000) +
                           "s without a batch published (--stuck-after " + std::to_string(stuck_after_.count()) +
                           "ms)" + (last_error.empty() ? "" : "; last error: " + last_error) + "\n"};
    }
    return {true, "ok leader\n"};
}

// The samples of each metric family, in the order the families were first
// named, for a text that holds every family once (HELP and TYPE, then its
// samples), as the Prometheus text format wants.
class MetricFamilies {
public:
    // Names a family (its samples may follow, or none).
    void family(const char* name, const char* type, const char* help) { at(name, type, help); }
    // One sample: name{labels} value.
    template <typename T>
    void sample(const char* name, const char* type, const char* help, const std::string& labels, T value) {
        std::ostringstream line;
        line << name << '{' << labels << "} " << value << '\n';
        at(name, type, help).samples += line.str();
    }
    void write(std::ostream& out) const {
        for (const auto& f : families_)
            out << "# HELP " << f.name << ' ' << f.help << "\n# TYPE " << f.name << ' ' << f.type << '\n'
                << f.samples;
    }

private:
    struct Family {
        std::string name, type, help, samples;
    };
    Family& at(const char* name, const char* type, const char* help) {
        for (auto& f : families_)
            if (f.name == name) return f;
        families_.push_back({name, type, help, {}});
        return families_.back();
    }
    std::vector<Family> families_;
};

void Metrics::collect(MetricFamilies& out) const {
    const std::string& labels = labels_;
    auto metric = [&](const char* name, const char* type, const char* help, auto value) {
        out.sample(name, type, help, labels, value);
    };
    if (mode_ == "consume") {
        metric("pg_outbox_relay_events_applied_total", "counter", "Events applied: inbox row and handler committed.",
               events_applied.load());
        metric("pg_outbox_relay_events_duplicate_total", "counter",
               "Redeliveries the inbox recognised; acknowledged without running the handler.",
               events_duplicate.load());
        metric("pg_outbox_relay_events_conflict_total", "counter",
               "Entries whose event id was applied before with another payload (dead-lettered).",
               events_conflict.load());
        metric("pg_outbox_relay_events_failed_total", "counter", "Entry deliveries whose handler or apply failed.",
               events_failed.load());
        metric("pg_outbox_relay_dead_letters_total", "counter", "Entries dead-lettered and acknowledged.",
               dead_letters.load());
        metric("pg_outbox_relay_entries_reclaimed_total", "counter",
               "Pending entries of idle workers claimed with XAUTOCLAIM.", entries_reclaimed.load());
        metric("pg_outbox_relay_entries_malformed_total", "counter",
               "Entries that could not be read (bad bytes, missing or repeated fields, too large): dead-lettered "
               "with their raw fields and acknowledged.",
               entries_malformed.load());
        metric("pg_outbox_relay_batches_isolated_total", "counter",
               "Batches that failed as one transaction (a handler or a conversion raised) and were applied "
               "again with each entry in a subtransaction of its own.",
               batches_isolated.load());
        metric("pg_outbox_relay_keys_parked", "gauge",
               "Keys of the streams this worker reads that are parked (retrying, dead or draining) at the last "
               "poll of inbox_parked_keys().",
               keys_parked.load());
        metric("pg_outbox_relay_entries_parked_total", "counter",
               "Entries parked behind an earlier failed entry of their key: stored in the consumer's database "
               "and acknowledged, not applied.",
               entries_parked.load());
        metric("pg_outbox_relay_entries_redriven_total", "counter",
               "Parked entries (and head dead letters) applied by this worker's drains, in their key's order.",
               entries_redriven.load());
        metric("pg_outbox_relay_park_limit_reached", "gauge",
               "1 while the consumer's parked entries are at its park_limit (SQLSTATE OB005): the worker holds "
               "its batch, nothing is acknowledged, and /health fails.",
               park_limit_reached_.load() ? 1 : 0);
        {
            constexpr const char* kGaps = "pg_outbox_relay_gaps_total";
            constexpr const char* kGapsHelp =
                "Gaps found in a stream: entries missing (deleted, trimmed, lost) before the consumer group read "
                "them, each dead-lettered as a range of ids.";
            out.family(kGaps, "counter", kGapsHelp);
            std::lock_guard lock(errors_mutex_);
            for (const auto& [stream, n] : gaps_)
                out.sample(kGaps, "counter", kGapsHelp,
                           labels + ",stream=\"" + prometheus_label_value(stream) + "\"", n);
        }
        if (pool) {
            metric("pg_outbox_relay_pool_streams_owned", "gauge",
                   "Streams this worker holds in the consumer group's pool (--pool).", pool_streams_owned.load());
            constexpr const char* kHandovers = "pg_outbox_relay_pool_handovers_total";
            constexpr const char* kHandoversHelp =
                "Streams this worker took (after their previous owner died, left or let go), released (at exit, or "
                "for a worker that joined) or lost (its lease ran out or another worker holds it).";
            for (const auto& [event, n] : {std::pair{"taken", pool_taken.load()},
                                           std::pair{"released", pool_released.load()},
                                           std::pair{"lost", pool_lost.load()}})
                out.sample(kHandovers, "counter", kHandoversHelp, labels + ",event=\"" + event + "\"", n);
        }
        metric("pg_outbox_relay_pending_oldest_idle_seconds", "gauge",
               "Idle time of the oldest pending entry of the consumer group.", pending_oldest_idle_seconds.load());
        metric("pg_outbox_relay_pg_rtt_seconds", "gauge", "Duration of the last apply transaction.",
               pg_rtt_seconds.load());
        metric("pg_outbox_relay_pg_connected", "gauge", "1 while connected to PostgreSQL.", pg_connected.load() ? 1 : 0);
        metric("pg_outbox_relay_redis_connected", "gauge", "1 while connected to Redis.",
               redis_connected.load() ? 1 : 0);
        metric("pg_outbox_relay_pg_in_recovery", "gauge",
               "1 while the PostgreSQL server is a standby and the relay waits for a primary.",
               pg_in_recovery.load() ? 1 : 0);
        return;
    }
    metric("pg_outbox_relay_events_published_total", "counter", "Events appended to Redis Streams.",
           events_published.load());
    metric("pg_outbox_relay_events_already_published_total", "counter",
           "Events Redis refused as already present (replays after a crash or takeover).",
           events_already_published.load());
    metric("pg_outbox_relay_batches_published_total", "counter", "Batches published and acknowledged.",
           batches_published.load());
    metric("pg_outbox_relay_rewinds_total", "counter", "Rewinds after Redis was found behind the cursor.",
           streams_rewound.load());
    metric("pg_outbox_relay_cursor_moves_total", "counter",
           "Times the group's cursor was found moved by outbox_rewind() while this relay led it.",
           rewinds_noticed.load());
    {
        constexpr const char* kBatches = "pg_outbox_relay_redis_batches_total";
        constexpr const char* kBatchesHelp =
            "Batches written to Redis, by path: transaction (streams checked under WATCH, plain XADD in "
            "MULTI/EXEC) or script (the append script, which tells entries already present from missing ones).";
        out.sample(kBatches, "counter", kBatchesHelp, labels + ",path=\"transaction\"", transaction_batches.load());
        out.sample(kBatches, "counter", kBatchesHelp, labels + ",path=\"script\"", script_batches.load());
    }
    // Counted by the leader only: a standby (or a leader before its first
    // count) leaves the series out, so that a sum over relays is the
    // group's backlog.
    if (const auto lag = lag_events.load(); leader.load() && lag >= 0)
        metric("pg_outbox_relay_lag_events", "gauge", "Events waiting below the horizon, counted by the leader.",
               lag);
    // An open transaction holds the horizon (xid8 order): the group
    // publishes nothing newer, and lag_events and lag_seconds may be 0.
    if (const auto held = held_back_events.load(); leader.load() && held >= 0) {
        metric("pg_outbox_relay_held_back_events", "gauge",
               "Committed events an open transaction holds back above the horizon (xid8 order), counted by the "
               "leader.",
               held);
        metric("pg_outbox_relay_held_back_seconds", "gauge",
               "How long the oldest event held back by an open transaction has waited (xid8 order); 0 when none.",
               held_back_seconds.load());
    }
    metric("pg_outbox_relay_lag_seconds", "gauge",
           "Age of the oldest event of the last batch at publication; 0 when the feed is empty.", lag_seconds.load());
    metric("pg_outbox_relay_pg_rtt_seconds", "gauge", "Duration of the last feed fetch.", pg_rtt_seconds.load());
    metric("pg_outbox_relay_redis_rtt_seconds", "gauge", "Duration of the last pipelined batch.",
           redis_rtt_seconds.load());
    metric("pg_outbox_relay_leader", "gauge", "1 while this relay leads its group.", leads() ? 1 : 0);
    metric("pg_outbox_relay_redis_oom", "gauge",
           "1 while Redis refuses even a single entry for want of memory (OOM): the backlog waits in PostgreSQL.",
           redis_oom.load() ? 1 : 0);
    metric("pg_outbox_relay_event_too_large", "gauge",
           "1 while the group's next event is too large to publish (SQLSTATE OB004): it waits for outbox_skip().",
           event_too_large_.load() ? 1 : 0);
    metric("pg_outbox_relay_stalled_seconds", "gauge",
           "How long the leader has had events waiting without publishing a batch (0 when it keeps up).",
           static_cast<double>(stalled().count()) / 1000);
    metric("pg_outbox_relay_pg_in_recovery", "gauge",
           "1 while the PostgreSQL server is a standby and the relay waits for a primary.",
           pg_in_recovery.load() ? 1 : 0);
    metric("pg_outbox_relay_pg_connected", "gauge", "1 while connected to PostgreSQL.", pg_connected.load() ? 1 : 0);
    metric("pg_outbox_relay_redis_connected", "gauge", "1 while connected to Redis.", redis_connected.load() ? 1 : 0);
}

void Metrics::collect_errors(MetricFamilies& out) const {
    std::lock_guard lock(errors_mutex_);
    for (const auto& [kind, n] : errors_)
        out.sample("pg_outbox_relay_errors_total", "counter", "Errors by kind.",
                   labels_ + ",kind=\"" + prometheus_label_value(kind) + "\"", n);
}

std::string Metrics::render() const { return render_metrics({this}); }

std::string render_metrics(const std::vector<const Metrics*>& all) {
    MetricFamilies families;
    for (const auto* m : all) m->collect(families);
    // The build_info of the process: the extension version and engine the
    // first relay to connect read (every relay of a process reads one
    // database).
    std::string extension_version, engine;
    for (const auto* m : all) {
        std::lock_guard lock(m->errors_mutex_);
        if (!m->extension_version_.empty()) {
            extension_version = m->extension_version_;
            engine = m->engine_;
            break;
        }
    }
    families.sample("pg_outbox_relay_build_info", "gauge",
                    "The relay's version, and the pg_outbox version and engine (c or sql) of the database it "
                    "connected to (empty before the first connection).",
                    "version=\"" PG_OUTBOX_VERSION "\",extension_version=\"" +
                        prometheus_label_value(extension_version) + "\",engine=\"" + prometheus_label_value(engine) +
                        "\"",
                    1);
    for (const auto* m : all) m->collect_errors(families);
    std::ostringstream out;
    families.write(out);
    return out.str() + process_metrics();
}

Metrics& MetricsSet::add(const std::string& group, std::chrono::milliseconds stuck_after) {
    std::lock_guard lock(mutex_);
    all_.push_back(std::make_unique<Metrics>("publish", group, stuck_after));
    return *all_.back();
}

std::string MetricsSet::render() const {
    std::lock_guard lock(mutex_);
    std::vector<const Metrics*> all;
    for (const auto& m : all_) all.push_back(m.get());
    return render_metrics(all);
}

Metrics::Health MetricsSet::health(std::chrono::seconds max_silence) const {
    std::lock_guard lock(mutex_);
    if (all_.empty()) return {false, "starting\n"};
    if (all_.size() == 1) return all_.front()->health(max_silence);
    Metrics::Health out{true, {}};
    for (const auto& m : all_) {
        const auto h = m->health(max_silence);
        out.ok = out.ok && h.ok;
        out.text += escape_control(m->group()) + ": " + h.text;
    }
    return out;
}

namespace {

// httplib's thread pool with a bound: at most "capacity" connections held
// (served or queued). enqueue() is called by the thread that accepts, with
// a connection accepted: while the pool is full it waits, and accepts
// nothing more meanwhile; the connections beyond wait in the kernel's
// listen queue and take no descriptor of the relay.
class BoundedPool : public httplib::TaskQueue {
public:
    BoundedPool(std::size_t workers, std::size_t capacity) : capacity_(capacity) {
        for (std::size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
    }

    void enqueue(std::function<void()> fn) override {
        std::unique_lock lock(mutex_);
        room_.wait(lock, [this] { return held_ < capacity_; });
        ++held_;
        jobs_.push_back(std::move(fn));
        ready_.notify_one();
    }

    void shutdown() override {
        {
            std::lock_guard lock(mutex_);
            shutdown_ = true;
        }
        ready_.notify_all();
        for (auto& t : threads_) t.join();
    }

private:
    void work() {
        while (true) {
            std::function<void()> fn;
            {
                std::unique_lock lock(mutex_);
                ready_.wait(lock, [this] { return shutdown_ || !jobs_.empty(); });
                if (jobs_.empty()) return;
                fn = std::move(jobs_.front());
                jobs_.pop_front();
            }
            fn();
            {
                std::lock_guard lock(mutex_);
                --held_;
            }
            room_.notify_one();
        }
    }

    const std::size_t capacity_;
    std::size_t held_ = 0;
    bool shutdown_ = false;
    std::deque<std::function<void()>> jobs_;
    std::mutex mutex_;
    std::condition_variable ready_;
    std::condition_variable room_;
    std::vector<std::thread> threads_;
};

}  // namespace

MetricsServer::MetricsServer(const ListenAddress& address, const Metrics& metrics)
    : MetricsServer(
          address, [&metrics] { return metrics.render(); },
          [&metrics] { return metrics.health(std::chrono::seconds(60)); }) {}

MetricsServer::MetricsServer(const ListenAddress& address, const MetricsSet& metrics)
    : MetricsServer(
          address, [&metrics] { return metrics.render(); },
          [&metrics] { return metrics.health(std::chrono::seconds(60)); }) {}

MetricsServer::MetricsServer(const ListenAddress& address, std::function<std::string()> render,
                             std::function<Metrics::Health()> health)
    : server_(std::make_unique<httplib::Server>()) {
    // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a
    // second relay given the same port would share it instead of failing.
    // IPv6 sockets take IPv4-mapped addresses too, so that [::] is every
    // interface of both families.
    server_->set_socket_options([](socket_t sock) {
        int yes = 1, no = 0;
        ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
        ::setsockopt(sock, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof no);
    });
    // A scrape is a request on a connection: a connection idle for
    // kIdleTimeout (before its first request or between two), or slower
    // than that to send a request or take a response, is closed.
    server_->new_task_queue = [] { return new BoundedPool(kWorkers, kMaxConnections); };
    server_->set_keep_alive_timeout(kIdleTimeout.count());
    server_->set_keep_alive_max_count(10);
    server_->set_read_timeout(kIdleTimeout.count(), 0);
    server_->set_write_timeout(kIdleTimeout.count(), 0);
    server_->Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
        res.set_content(render(), "text/plain; version=0.0.4");
    });
    server_->Get("/health", [health](const httplib::Request&, httplib::Response& res) {
        const auto health_now = health();
        res.status = health_now.ok ? 200 : 503;
        res.set_content(health_now.text, "text/plain");
    });
    auto bind = [this, &address](const std::string& host) {
        errno = 0;
        if (!server_->bind_to_port(host.c_str(), address.port)) return false;
        bound_ = (host.find(':') == std::string::npos ? host : "[" + host + "]") + ":" + std::to_string(address.port);
        return true;
    };
    const bool bound = address.host.empty() ? bind("::") || bind("0.0.0.0") : bind(address.host);
    if (!bound) {
        const int error = errno;
        throw ConfigError("--metrics-address: could not listen on " + address.to_string() +
                          (error ? std::string(" (") + std::strerror(error) + ")" : std::string()));
    }
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    spdlog::info("metrics on http://{}/metrics, health on /health{}", bound_,
                 address.host.empty() ? " (every interface)" : "");
}

MetricsServer::~MetricsServer() {
    server_->stop();
    if (thread_.joinable()) thread_.join();
}

}  // namespace pg_outbox
