// A PostgreSQL connection (libpq) with owned handles.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <libpq-fe.h>

namespace pg_outbox {

// The default bound of every wait on PostgreSQL, when main has set none:
// two thirds of the default --lease.
inline constexpr std::chrono::milliseconds kDefaultPgTimeout{10000};

// Sets the bound of every wait on PostgreSQL (--pg-timeout) for the
// connections made after the call: the connection as a whole, each write,
// and each statement's result. A wait past it closes the connection
// (PgError 08006, retried); libpq's connect_timeout, tcp_user_timeout and
// keepalives, and the server's tcp_user_timeout, keepalives and
// client_connection_check_interval, are derived from it.
void set_pg_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds pg_timeout();

// Checks a connection string or URI (--pg) before anything connects: its
// syntax (PQconninfoParse), and the option values that libpq checks only
// when it connects (sslmode, target_session_attrs, ports, ...), the PG*
// environment included. Throws ConfigError naming the option; the message
// never holds a password, not even part of one.
void check_conninfo(const std::string& conninfo);

// The connection string for logs: its options as keyword=value, each
// password masked. Empty conninfo: libpq's PG* environment.
std::string describe_conninfo(const std::string& conninfo);

// True when libpq's message of a failed connection reports a setting that
// cannot work (an invalid option value, an unknown service), not a
// network or server condition that may pass.
bool is_settings_failure(std::string_view libpq_message);

struct PGresultDeleter {
    void operator()(PGresult* r) const noexcept { PQclear(r); }
};
struct PGconnDeleter {
    void operator()(PGconn* c) const noexcept { PQfinish(c); }
};

// A query result; move-only.
class PgResult {
public:
    explicit PgResult(PGresult* r) : result_(r) {}

    int rows() const { return PQntuples(result_.get()); }
    bool is_null(int row, int col) const { return PQgetisnull(result_.get(), row, col) != 0; }
    std::string_view get(int row, int col) const {
        return {PQgetvalue(result_.get(), row, col), static_cast<std::size_t>(PQgetlength(result_.get(), row, col))};
    }
    std::optional<std::string_view> get_optional(int row, int col) const {
        if (is_null(row, col)) return std::nullopt;
        return get(row, col);
    }
    const PGresult* raw() const { return result_.get(); }

private:
    std::unique_ptr<PGresult, PGresultDeleter> result_;
};

using Param = std::optional<std::string>;

class PgConnection {
public:
    // Connects; conninfo may be a connection string or URI, empty for the
    // libpq environment. Throws PgError. Every wait of the connection,
    // this one included, is bounded by pg_timeout() and cut short by the
    // stop request (io_wait.hpp): a wait that runs out closes the
    // connection and throws PgError 08006.
    explicit PgConnection(const std::string& conninfo, const std::string& application_name);

    PgConnection(PgConnection&&) noexcept = default;
    PgConnection& operator=(PgConnection&&) noexcept = default;

    // Runs one statement with text parameters (never interpolated).
    // Unnamed statements: no cached generic plan can form.
    PgResult exec(const std::string& sql, const std::vector<Param>& params = {});
    // The same with a format per parameter: 1 (binary) sends the value's
    // bytes as they are, whatever they hold (NUL bytes included), in the
    // type's binary representation; 0 is text. Give binary parameters a
    // type in the SQL ($3::bytea[]).
    PgResult exec(const std::string& sql, const std::vector<Param>& params, const std::vector<int>& formats);

    // Prepares a named statement on this connection, for calls of the
    // extension's functions that a relay makes many times a second: such a
    // call plans nothing that depends on the data (the functions plan
    // their own queries), so parsing and planning it again each time is
    // pure cost. Not for queries over tables.
    // With types, the parameters get those types (OIDs) instead of the ones
    // inferred from the statement.
    void prepare(const std::string& name, const std::string& sql, const std::vector<Oid>& types = {});
    // Runs a statement prepare() made, with a format per parameter as
    // exec() takes them.
    PgResult exec_prepared(const std::string& name, const std::vector<Param>& params,
                           const std::vector<int>& formats);

    // The same in two steps, so that the caller can work while the server
    // runs the statements: send() queues a statement (libpq pipeline mode,
    // each statement its own transaction), receive() returns the results
    // in order, one per send(). exec() waits for nothing queued, so every
    // send() must be received first.
    void send(const std::string& sql, const std::vector<Param>& params = {});
    // The same for a statement prepare() made; with binary_result, its
    // values come in their types' binary representation (a bytea's bytes
    // as they are).
    void send_prepared(const std::string& name, const std::vector<Param>& params = {}, bool binary_result = false);
    PgResult receive();
    int queued() const { return queued_; }

    // LISTEN on a channel.
    void listen(const std::string& channel);

    // Waits up to "timeout" for notifications; returns how many arrived
    // (0 on timeout), all of them consumed.
    int wait_for_notification(std::chrono::milliseconds timeout);

    // Pins the session settings that decide how values are written as
    // text (client_encoding UTF8, DateStyle ISO, TimeZone UTC,
    // IntervalStyle postgres, extra_float_digits 3, bytea_output hex), so
    // that nothing the relay reads depends on the server's, database's or
    // role's settings. With keep_handler_settings, client_encoding only.
    void pin_settings(bool keep_handler_settings = false);

    bool ok() const { return PQstatus(conn_.get()) == CONNECTION_OK; }
    // True when the server is a standby (pg_is_in_recovery()).
    bool in_recovery();
    int backend_pid() const { return PQbackendPID(conn_.get()); }

private:
    // Throws PgError about "statement"; a prepared statement's name is
    // short enough to be part of the message too (what()), SQL text is not.
    [[noreturn]] void throw_error(const PGresult* r, const std::string& what, const std::string& statement = {},
                                  bool prepared = false) const;
    // Waits for the socket (POLLIN, POLLOUT) until the deadline; past it,
    // or once the stop request's grace is over, shuts the connection down
    // and throws PgError 08006 about the statement.
    void await(short events, std::chrono::steady_clock::time_point deadline, const std::string& statement,
               bool prepared);
    // Sends what libpq holds, within the deadline.
    void flush(std::chrono::steady_clock::time_point deadline, const std::string& statement, bool prepared);
    // PQgetResult() without blocking past the deadline.
    PGresult* next_result(std::chrono::steady_clock::time_point deadline, const std::string& statement,
                          bool prepared);
    // The last result of a statement sent outside pipeline mode.
    PgResult last_result(const std::string& statement, bool prepared);
    // The same, throwing PgError unless the statement succeeded.
    PgResult checked_result(const std::string& statement, bool prepared);
    // Queues a statement, unnamed (sql) or prepared (name), and its sync point.
    void queue(const char* name, const char* sql, const std::vector<Param>& params, bool binary_result = false);

    std::chrono::milliseconds timeout_;
    std::unique_ptr<PGconn, PGconnDeleter> conn_;
    int queued_ = 0;
    // The statements queued, in order: a name, or the SQL text.
    std::deque<std::pair<std::string, bool>> sent_;
};

}  // namespace pg_outbox
