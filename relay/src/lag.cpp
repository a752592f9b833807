#include "pg_outbox/lag.hpp"

#include <spdlog/spdlog.h>

#include <exception>
#include <vector>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/log.hpp"

#include "pg_outbox/service.hpp"

namespace pg_outbox {

namespace {

// The backlog below the horizon, and what an open transaction holds back
// above it (xid8 order; null in commit order): how many events, and how
// long the oldest has waited, in seconds. Qualified and typed as every
// statement of the relay's (see group_session.cpp).
constexpr const char* kLagSql =
    "SELECT waiting, held_back, pg_catalog.date_part('epoch'::pg_catalog.text, oldest_held_back_age)"
    "  FROM @extschema@.outbox_group_stats($1::pg_catalog.text)";

constexpr const char* kLeaderSql =
    "SELECT s.leader_pid, pg_catalog.host(a.client_addr), a.client_port, a.application_name"
    "  FROM @extschema@.outbox_group_stats($1::pg_catalog.text) s"
    "  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) s.leader_pid";

}  // namespace

std::string describe_leader(PgConnection& pg, const Extension& extension, const std::string& group) {
    try {
        auto r = pg.exec(extension.sql(kLeaderSql), {group});
        if (r.rows() == 0 || r.is_null(0, 0)) return "no session now (the leader just left)";
        std::string out = "backend pid " + std::string(r.get(0, 0));
        std::vector<std::string> about;
        if (!r.is_null(0, 1))
            about.push_back("client " + std::string(r.get(0, 1)) +
                            (r.is_null(0, 2) ? std::string() : ":" + std::string(r.get(0, 2))));
        else if (!r.is_null(0, 2) && r.get(0, 2) == "-1")
            about.push_back("client on a Unix socket");
        else
            about.push_back("client address not visible to this role");
        if (!r.is_null(0, 3) && !r.get(0, 3).empty())
            about.push_back("application \"" + std::string(r.get(0, 3)) + "\"");
        out += " (";
        for (std::size_t i = 0; i < about.size(); ++i) out += (i ? ", " : "") + about[i];
        return out + ")";
    } catch (const PgError& e) {
        if (e.connection_lost()) throw;
        return "another session (could not tell which: " + std::string(e.what()) + ")";
    }
}

LagProbe::LagProbe(std::string conninfo, std::string group, std::chrono::milliseconds interval, Metrics& metrics)
    : conninfo_(std::move(conninfo)), group_(std::move(group)), interval_(interval), metrics_(metrics) {
    thread_ = std::thread([this, context = log_context()] {
        set_log_context(context);
        run();
    });
}

LagProbe::~LagProbe() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

void LagProbe::run() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
        lock.unlock();
        // A standby leaves the counting to the leader.
        if (metrics_.leader) measure();
        lock.lock();
        wake_.wait_for(lock, interval_, [this] { return stop_; });
    }
}

void LagProbe::measure() {
    try {
        if (!pg_ || !pg_->ok()) {
            pg_.emplace(conninfo_, "pg_outbox_relay lag " + group_);
            extension_ = use_extension(*pg_, SearchPath::pin);
        }
        auto r = pg_->exec(extension_.sql(kLagSql), {group_});
        if (r.rows() > 0 && !r.is_null(0, 0)) metrics_.lag_events = std::stoll(std::string(r.get(0, 0)));
        if (r.rows() > 0) {
            metrics_.held_back_events = r.is_null(0, 1) ? 0 : std::stoll(std::string(r.get(0, 1)));
            metrics_.held_back_seconds = r.is_null(0, 2) ? 0.0 : std::stod(std::string(r.get(0, 2)));
        }
        if (failing_) spdlog::info("measuring the backlog of group \"{}\" again", group_);
        failing_ = false;
    } catch (const std::exception& e) {
        // The publishing loop reports PostgreSQL's faults; this says once
        // why the metric stands still, and never stops the relay.
        if (!failing_) spdlog::warn("cannot measure the backlog of group \"{}\": {}", group_, e.what());
        failing_ = true;
        pg_.reset();
    }
}

}  // namespace pg_outbox
