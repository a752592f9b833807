#include "pg_outbox/errors.hpp"

#include "pg_outbox/redis_error.hpp"
#include "pg_outbox/sqlstates.hpp"

namespace pg_outbox {

bool is_transient_sqlstate(std::string_view s) noexcept {
    if (s.size() != 5) return false;
    if (s.substr(0, 2) == "08") return true;  // connection exceptions
    return s == "40001"                      // serialization failure
           || s == "40P01"                   // deadlock detected
           || s == "57P01"                   // admin shutdown
           || s == "57P02"                   // crash shutdown
           || s == "57P03"                   // cannot connect now
           || s == "53300";                  // too many connections
}

Fault classify_sqlstate(std::string_view s) noexcept {
    if (is_transient_sqlstate(s)) return Fault::transient;
    if (s.size() != 5) return Fault::entry;
    const auto cls = s.substr(0, 2);
    if (cls == "42" || cls == "28" || s == "3D000" || s == "3F000") return Fault::configuration;
    // The consumer's parked entries are at its park_limit: the same for
    // every entry until a key is redriven or skipped, or the limit raised.
    if (s == sqlstate::kParkLimitReached) return Fault::configuration;
    // The transaction's or the session's state, which the handler's
    // statements (or a function or procedure it calls) misuse, the same
    // for every entry: invalid transaction initiation, state (25006 too:
    // a read-only transaction, connected to a standby) and termination,
    // savepoints, prepared statements, and a feature not supported
    // (0A000: EXECUTE of transaction control or COPY from the client in
    // PL/pgSQL).
    if (cls == "0B" || cls == "25" || cls == "2D" || cls == "3B" || s == "26000" || s == "0A000")
        return Fault::configuration;
    return Fault::entry;
}

const char* to_string(Fault fault) noexcept {
    switch (fault) {
        case Fault::entry: return "entry";
        case Fault::configuration: return "configuration";
        case Fault::transient: return "transient";
    }
    return "entry";
}

bool PgError::retryable() const noexcept {
    return connection_lost_ || is_transient_sqlstate(sqlstate_);
}

RedisError::RedisError(Kind kind, const std::string& message)
    : std::runtime_error(message), kind_(kind), code_(kind == Kind::io ? "io" : reply_error_code(message)) {}

}  // namespace pg_outbox
