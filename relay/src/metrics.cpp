#include "pg_outbox/metrics.hpp"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <sstream>

#include "pg_outbox/errors.hpp"

namespace pg_outbox {

namespace {

std::int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

void Metrics::count_error(const std::string& kind) {
    std::lock_guard lock(errors_mutex_);
    ++errors_[kind];
}

void Metrics::heartbeat() { last_heartbeat_ms_.store(now_ms()); }

bool Metrics::healthy(std::chrono::seconds max_silence) const {
    const auto last = last_heartbeat_ms_.load();
    return last != 0 && now_ms() - last <= std::chrono::duration_cast<std::chrono::milliseconds>(max_silence).count() &&
           pg_connected.load() && redis_connected.load();
}

std::string Metrics::render() const {
    std::ostringstream out;
    const std::string labels = "mode=\"" + mode_ + "\",group=\"" + group_ + "\"";
    auto metric = [&](const char* name, const char* type, const char* help, auto value) {
        out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
            << name << '{' << labels << "} " << value << '\n';
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
        metric("pg_outbox_relay_pending_oldest_idle_seconds", "gauge",
               "Idle time of the oldest pending entry of the consumer group.", pending_oldest_idle_seconds.load());
        metric("pg_outbox_relay_pg_rtt_seconds", "gauge", "Duration of the last apply transaction.",
               pg_rtt_seconds.load());
        metric("pg_outbox_relay_pg_connected", "gauge", "1 while connected to PostgreSQL.", pg_connected.load() ? 1 : 0);
        metric("pg_outbox_relay_redis_connected", "gauge", "1 while connected to Redis.",
               redis_connected.load() ? 1 : 0);
        render_errors(out, labels);
        return out.str();
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
    out << "# HELP pg_outbox_relay_redis_batches_total Batches written to Redis, by path: transaction (streams "
           "checked under WATCH, plain XADD in MULTI/EXEC) or script (the append script, which tells entries "
           "already present from missing ones).\n"
           "# TYPE pg_outbox_relay_redis_batches_total counter\n"
        << "pg_outbox_relay_redis_batches_total{" << labels << ",path=\"transaction\"} " << transaction_batches.load()
        << '\n'
        << "pg_outbox_relay_redis_batches_total{" << labels << ",path=\"script\"} " << script_batches.load() << '\n';
    metric("pg_outbox_relay_lag_events", "gauge", "Events waiting below the horizon (-1 when unknown).",
           lag_events.load());
    metric("pg_outbox_relay_lag_seconds", "gauge", "Age of the oldest event of the last batch at publication.",
           lag_seconds.load());
    metric("pg_outbox_relay_pg_rtt_seconds", "gauge", "Duration of the last feed fetch.", pg_rtt_seconds.load());
    metric("pg_outbox_relay_redis_rtt_seconds", "gauge", "Duration of the last pipelined batch.",
           redis_rtt_seconds.load());
    metric("pg_outbox_relay_leader", "gauge", "1 while this relay leads its group.", leader.load() ? 1 : 0);
    metric("pg_outbox_relay_pg_connected", "gauge", "1 while connected to PostgreSQL.", pg_connected.load() ? 1 : 0);
    metric("pg_outbox_relay_redis_connected", "gauge", "1 while connected to Redis.", redis_connected.load() ? 1 : 0);
    render_errors(out, labels);
    return out.str();
}

void Metrics::render_errors(std::ostream& out, const std::string& labels) const {
    std::lock_guard lock(errors_mutex_);
    out << "# HELP pg_outbox_relay_errors_total Errors by kind.\n# TYPE pg_outbox_relay_errors_total counter\n";
    for (const auto& [kind, n] : errors_)
        out << "pg_outbox_relay_errors_total{" << labels << ",kind=\"" << kind << "\"} " << n << '\n';
}

MetricsServer::MetricsServer(const std::string& address, const Metrics& metrics)
    : server_(std::make_unique<httplib::Server>()) {
    const auto colon = address.rfind(':');
    if (colon == std::string::npos) throw ConfigError("--metrics-address: expected host:port, got \"" + address + "\"");
    std::string host = address.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    int port = 0;
    try {
        port = std::stoi(address.substr(colon + 1));
    } catch (const std::exception&) {
        throw ConfigError("--metrics-address: invalid port in \"" + address + "\"");
    }
    server_->Get("/metrics", [&metrics](const httplib::Request&, httplib::Response& res) {
        res.set_content(metrics.render(), "text/plain; version=0.0.4");
    });
    server_->Get("/health", [&metrics](const httplib::Request&, httplib::Response& res) {
        const bool ok = metrics.healthy(std::chrono::seconds(60));
        res.status = ok ? 200 : 503;
        const char* role = metrics.mode() == "consume" ? "ok\n" : metrics.leader.load() ? "ok leader\n" : "ok standby\n";
        res.set_content(ok ? role : "unhealthy\n", "text/plain");
    });
    if (!server_->bind_to_port(host.c_str(), port))
        throw ConfigError("--metrics-address: could not listen on " + address);
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    spdlog::info("metrics on http://{}/metrics, health on /health", address);
}

MetricsServer::~MetricsServer() {
    server_->stop();
    if (thread_.joinable()) thread_.join();
}

}  // namespace pg_outbox
