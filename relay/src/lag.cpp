#include "pg_outbox/lag.hpp"

#include <spdlog/spdlog.h>

#include <exception>

#include "pg_outbox/service.hpp"

namespace pg_outbox {

namespace {

constexpr const char* kLagSql = "SELECT waiting FROM outbox_group_stats($1)";

}  // namespace

LagProbe::LagProbe(std::string conninfo, std::string group, std::chrono::milliseconds interval, Metrics& metrics)
    : conninfo_(std::move(conninfo)), group_(std::move(group)), interval_(interval), metrics_(metrics) {
    thread_ = std::thread([this] { run(); });
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
            use_extension(*pg_);
        }
        auto r = pg_->exec(kLagSql, {group_});
        if (r.rows() > 0 && !r.is_null(0, 0)) metrics_.lag_events = std::stoll(std::string(r.get(0, 0)));
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
