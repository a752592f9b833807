// Exceptions of the relay and how they are classified: retried with
// backoff and reconnect, or fatal.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <string_view>

namespace pg_outbox {

// A setting that cannot work; the relay exits at once naming it.
class ConfigError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// An error from PostgreSQL, with its SQLSTATE ("" when the connection
// failed before a server answered) and, like libpqxx's sql_error, the
// statement that failed.
class PgError : public std::runtime_error {
public:
    PgError(const std::string& message, std::string sqlstate, bool connection_lost, std::string statement = {})
        : std::runtime_error(message),
          sqlstate_(std::move(sqlstate)),
          statement_(std::move(statement)),
          connection_lost_(connection_lost) {}

    const std::string& sqlstate() const noexcept { return sqlstate_; }
    // The name of the prepared statement, or the SQL text run by exec();
    // "" when the error came from no statement (connecting, waiting).
    const std::string& statement() const noexcept { return statement_; }
    bool connection_lost() const noexcept { return connection_lost_; }
    // True when trying again later may succeed: the connection broke, or
    // the server reported a transient condition.
    bool retryable() const noexcept;

private:
    std::string sqlstate_;
    std::string statement_;
    bool connection_lost_;
};

// True for the SQLSTATEs that libpqxx and the relay treat as transient:
// class 08 (connection), 40001, 40P01, 57P01, 57P02, 57P03, 53300.
bool is_transient_sqlstate(std::string_view sqlstate) noexcept;

// Whose fault an error of one stream entry's apply is, in consume mode.
enum class Fault {
    // The entry's: its content or the handler's verdict on it. Counted as
    // a delivery; dead-lettered after --max-deliveries.
    entry,
    // The setting's (handler, privileges, consumer name, schema): no entry
    // could apply. Nothing is dead-lettered or acknowledged; the worker
    // backs off and retries the same entries.
    configuration,
    // Of the moment (is_transient_sqlstate): retried the same way, without
    // counting a delivery.
    transient,
};

// Classifies a SQLSTATE: transient as is_transient_sqlstate(); class 42
// (syntax error or access rule violation: 42601, 42501, 42883, 42P01, ...),
// class 28 (invalid authorization), 3D000, 3F000 (unknown database or
// schema), and the transaction's or session's state that a handler
// misuses (class 0B, class 25 with 25001 and 25006, read-only: connected
// to a standby; class 2D, class 3B, 26000, and 0A000, which PL/pgSQL
// raises for transaction control in EXECUTE) are configuration;
// everything else is the entry's. A 54000 from a consumer
// name over the limit is caught at start-up; later it is the entry's (a
// value too large).
Fault classify_sqlstate(std::string_view sqlstate) noexcept;
const char* to_string(Fault fault) noexcept;

// An error from Redis: the connection broke (io) or a command was refused
// (reply: OOM, READONLY, WRONGTYPE, LOADING, ...).
class RedisError : public std::runtime_error {
public:
    enum class Kind { io, reply };

    // The code is "io" for the kind io, else the first word of the
    // message (reply_error_code(): "OOM", "READONLY", "other").
    RedisError(Kind kind, const std::string& message);

    Kind kind() const noexcept { return kind_; }
    // The code of a reply error ("OOM", "READONLY"; "other" when the
    // reply had none), "io" for a broken connection: for metrics. A typed
    // error (redis_error.hpp) has the code of Redis's reply, whatever
    // context its message starts with.
    const std::string& code() const noexcept { return code_; }

protected:
    RedisError(Kind kind, const std::string& message, std::string code)
        : std::runtime_error(message), kind_(kind), code_(std::move(code)) {}

private:
    Kind kind_;
    std::string code_;
};

// Redis refused the connection's set-up: AUTH (a wrong user or password),
// a password missing (NOAUTH), or SELECT (a database it does not have).
// At the first connection, a setting that cannot work.
class RedisSetupError : public RedisError {
public:
    RedisSetupError(std::string setting, const std::string& message)
        : RedisError(Kind::reply, message), setting_(std::move(setting)) {}

    // The flag to blame: "--redis-password" or "--redis-db".
    const std::string& setting() const noexcept { return setting_; }

private:
    std::string setting_;
};

}  // namespace pg_outbox
