#include "pg_outbox/service.hpp"

#include <spdlog/spdlog.h>

#include <thread>

#include "pg_outbox/errors.hpp"

namespace pg_outbox {

Service::Service(const Config& config, Metrics& metrics, const std::atomic<bool>& stop, std::string application_name)
    : config_(config),
      metrics_(metrics),
      stop_(stop),
      application_name_(std::move(application_name)),
      backoff_(config.retry_min, config.retry_max) {}

void Service::pause(std::chrono::milliseconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    while (!stop_ && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::min(d, std::chrono::milliseconds(50)));
}

void Service::connect() {
    if (!pg_) {
        pg_.emplace(config_.pg_conninfo, application_name_);
        metrics_.pg_connected = true;
        spdlog::info("connected to PostgreSQL (backend pid {})", pg_->backend_pid());
        on_pg_connected();
    }
    if (!redis_) {
        redis_.emplace(config_.redis, config_.redis_password, config_.redis_db, config_.redis_timeout);
        metrics_.redis_connected = true;
        spdlog::info("connected to Redis at {}", config_.redis.to_string());
        on_redis_connected();
    }
}

int Service::run() {
    while (!stop_) {
        try {
            connect();
            metrics_.heartbeat();
            turn();
            backoff_.reset();
        } catch (const PgError& e) {
            metrics_.count_error("pg");
            if (!e.retryable()) {
                spdlog::critical("PostgreSQL: {} (SQLSTATE {})", e.what(), e.sqlstate());
                return 1;
            }
            spdlog::warn("PostgreSQL: {}; retrying", e.what());
            pg_.reset();
            metrics_.pg_connected = false;
            on_pg_lost();
            pause(backoff_.next());
        } catch (const RedisError& e) {
            metrics_.count_error(e.kind() == RedisError::Kind::io ? "redis_io" : "redis_" + e.code());
            spdlog::warn("Redis: {}; retrying, nothing is skipped", e.what());
            if (e.kind() == RedisError::Kind::io) {
                redis_.reset();
                metrics_.redis_connected = false;
            }
            on_redis_fault();
            pause(backoff_.next());
        }
    }
    on_stop();
    spdlog::info("stopped");
    return 0;
}

}  // namespace pg_outbox
