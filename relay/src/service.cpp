#include "pg_outbox/service.hpp"

#include <spdlog/spdlog.h>

#include <thread>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/io_wait.hpp"
#include "pg_outbox/pg.hpp"

namespace pg_outbox {

Service::Service(const Config& config, Metrics& metrics, const std::atomic<bool>& stop, std::string application_name)
    : config_(config),
      metrics_(metrics),
      stop_(stop),
      application_name_(std::move(application_name)),
      backoff_(config.retry_min, config.retry_max) {
    // A publisher's leadership lasts --lease from its last renewal: past
    // that, /health no longer says it leads.
    if (config.mode == Config::Mode::publish) metrics_.set_lease(config.lease);
    spdlog::info("PostgreSQL: {}", describe_conninfo(config_.pg_conninfo));
}

void Service::pause(std::chrono::milliseconds d) { pause_unless_stopped(d, stop_); }

namespace {

// The PostgreSQL server is in recovery; the relay waits for a primary.
struct StandbyServer {};

}  // namespace

void Service::connect() {
    if (!pg_) {
        try {
            pg_.emplace(config_.pg_conninfo, application_name_);
        } catch (const PgError& e) {
            if (!pg_reached_ && is_settings_failure(e.what())) throw ConfigError(std::string("--pg: ") + e.what());
            throw;
        }
        pg_reached_ = true;
        // A standby would take the leadership and fetch, and fail only
        // at the first write (LISTEN, outbox_advance, the inbox); with
        // --no-listen it would publish a batch first.
        if (pg_->in_recovery()) {
            pg_.reset();
            throw StandbyServer{};
        }
        pg_->pin_settings(keeps_handler_settings());
        auto found = use_extension(*pg_, keeps_handler_settings() ? SearchPath::keep : SearchPath::pin);
        // Said once, and again only when a reconnect finds another
        // (a failover to a server that has another engine).
        if (found.engine != extension_.engine || found.version != extension_.version ||
            found.schema != extension_.schema)
            spdlog::info("pg_outbox {} on the {} engine{}, its API in schema {}", found.version, found.engine,
                         found.engine == "sql" ? " (SQL and PL/pgSQL only: the relay waits on LISTEN/NOTIFY)"
                                               : " (C: pg_outbox.so)",
                         found.schema);
        extension_ = std::move(found);
        metrics_.set_extension(extension_.version, extension_.engine);
        if (metrics_.pg_in_recovery.exchange(false))
            spdlog::info("PostgreSQL is a primary now (promoted, or the address leads to another server); resuming");
        metrics_.pg_connected = true;
        spdlog::info("connected to PostgreSQL (backend pid {})", pg_->backend_pid());
        on_pg_connected();
    }
    if (!redis_) {
        try {
            redis_ = RedisTarget::connect(config_.redis, config_.redis_password, config_.redis_db,
                                          config_.redis_timeout);
        } catch (const RedisSetupError& e) {
            if (redis_reached_) throw;
            // The password may come from the --redis URL.
            const bool in_url = e.setting() == "--redis-password" && !config_.redis.password.empty();
            throw ConfigError((in_url ? std::string("--redis (its password)") : e.setting()) + ": " + e.what());
        }
        redis_reached_ = true;
        metrics_.redis_connected = true;
        spdlog::info("connected to Redis at {}{}", config_.redis.to_string(),
                     config_.redis_db ? " database " + std::to_string(config_.redis_db) : std::string());
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
        } catch (const StandbyServer&) {
            metrics_.heartbeat();
            metrics_.pg_connected = false;
            if (!metrics_.pg_in_recovery.exchange(true))
                spdlog::warn("PostgreSQL is a standby (pg_is_in_recovery()): nothing is {} until it is promoted or "
                             "the connection leads to a primary; checking again every {} ms at most",
                             metrics_.mode() == "consume" ? "applied" : "published", config_.retry_max.count());
            pause(backoff_.next());
        } catch (const PgError& e) {
            metrics_.count_error("pg");
            if (!e.retryable()) {
                fatal_error_ = "PostgreSQL: " + std::string(e.what()) + " (SQLSTATE " + e.sqlstate() + ")";
                spdlog::critical("{}", fatal_error_);
                return 1;
            }
            spdlog::warn("PostgreSQL: {}; retrying", e.what());
            pg_.reset();
            metrics_.pg_connected = false;
            on_pg_lost();
            pause(backoff_.next());
        } catch (const RedisError& e) {
            metrics_.count_error(redis_error_kind(e.code()));
            spdlog::warn("Redis: {}; retrying, nothing is skipped", e.what());
            if (e.kind() == RedisError::Kind::io) {
                redis_.reset();
                metrics_.redis_connected = false;
            }
            on_redis_fault();
            pause(backoff_.next());
        }
    }
    // What the relay does on its way out (resign, leave the pool) is
    // bounded like every wait; on a link that takes nothing it gives up
    // with the stop request's grace, and the lease runs out instead.
    restart_stop_grace();
    try {
        on_stop();
    } catch (const PgError& e) {
        spdlog::warn("PostgreSQL, while stopping: {}", e.what());
    } catch (const RedisError& e) {
        spdlog::warn("Redis, while stopping: {}", e.what());
    }
    spdlog::info("stopped");
    return 0;
}

}  // namespace pg_outbox
