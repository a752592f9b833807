#include "pg_outbox/errors.hpp"

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

bool PgError::retryable() const noexcept {
    return connection_lost_ || is_transient_sqlstate(sqlstate_);
}

std::string RedisError::code() const {
    if (kind_ == Kind::io) return "io";
    std::string_view m = what();
    auto end = m.find(' ');
    std::string_view word = m.substr(0, end);
    for (char c : word)
        if (c < 'A' || c > 'Z') return "other";
    return word.empty() ? "other" : std::string(word);
}

}  // namespace pg_outbox
