// What both relay modes share: the connections, the retry loop with
// backoff, and the classification of faults.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "pg_outbox/backoff.hpp"
#include "pg_outbox/config.hpp"
#include "pg_outbox/extension.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/pg.hpp"
#include "pg_outbox/redis_target.hpp"

namespace pg_outbox {

class Service {
public:
    virtual ~Service() = default;

    // Runs turn() until asked to stop (returns 0) or a fatal error (returns
    // 1). Lost connections and transient errors are retried with backoff;
    // the connections are made again before the next turn. A PostgreSQL
    // server in recovery (a hot standby) is left, and connected to again
    // after a backoff, until the connection leads to a primary: nothing is
    // published or applied from a standby. Throws ConfigError when the
    // first connection shows a setting that cannot work (an option libpq
    // refuses; Redis refusing AUTH or SELECT, or wanting a password).
    int run();
    // Why run() returned 1, as it logged it.
    const std::string& fatal_error() const { return fatal_error_; }

protected:
    Service(const Config& config, Metrics& metrics, const std::atomic<bool>& stop, std::string application_name);

    // One unit of work: a batch, or a wait when there is none.
    virtual void turn() = 0;
    // True when the session runs the user's SQL (a consume handler), which
    // may depend on the role's DateStyle, TimeZone, search_path, ...: those
    // stay, and only client_encoding is pinned (see
    // PgConnection::pin_settings and SearchPath::keep).
    virtual bool keeps_handler_settings() const { return false; }
    // Called after a new connection to PostgreSQL or Redis.
    virtual void on_pg_connected() {}
    virtual void on_redis_connected() {}
    // Called when a connection is dropped after a fault.
    virtual void on_pg_lost() {}
    virtual void on_redis_fault() {}
    // Called once when the loop ends without a fatal error.
    virtual void on_stop() {}

    // Sleeps, unless asked to stop.
    void pause(std::chrono::milliseconds d);
    // Closes the PostgreSQL connection (on_pg_lost() is called): the next
    // turn starts on a new session.
    void drop_pg() {
        pg_.reset();
        metrics_.pg_connected = false;
        on_pg_lost();
    }
    // After a Redis fault (from on_redis_fault): the target drops what is
    // in an unknown state (a cluster's node connections and slot map, made
    // and read again at next use); a target of no more use (a connection
    // found through Sentinel whose server a failover demoted: it answers
    // READONLY) is dropped, so that the next turn asks Sentinel again and
    // reconnects to the new master.
    void reset_redis_after_fault() {
        if (redis_ && redis_->fault()) {
            redis_.reset();
            metrics_.redis_connected = false;
        }
    }

    const Config& config_;
    Metrics& metrics_;
    const std::atomic<bool>& stop_;
    std::optional<PgConnection> pg_;
    // One server, the master Sentinel names, or a cluster: callers name
    // each command's key and never ask which (redis_target.hpp).
    std::unique_ptr<RedisTarget> redis_;
    // pg_outbox in pg_'s database, found at each connection.
    Extension extension_;

private:
    void connect();

    std::string application_name_;
    std::string fatal_error_;
    Backoff backoff_;
    // Whether each server was reached once: a setting refused after that
    // (a password rotated, a database dropped) is retried, not fatal.
    bool pg_reached_ = false;
    bool redis_reached_ = false;
};

}  // namespace pg_outbox
