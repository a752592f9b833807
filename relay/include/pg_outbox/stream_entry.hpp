// A stream entry as consume mode receives it, shared by the StreamReader
// (which reads it from Redis) and the InboxSession (which applies it).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pg_outbox/position.hpp"

namespace pg_outbox {

// One stream entry as delivered to this worker: its fields exactly as
// received (any bytes, in order, duplicate names kept).
struct StreamEntry {
    std::string stream;
    std::string id;
    std::vector<std::pair<std::string, std::string>> fields;
    long long deliveries = 1;

    // The value of the first field called "name"; nullptr when absent.
    const std::string* field(std::string_view name) const;
    // How many fields are called "name".
    std::size_t count(std::string_view name) const;
    // The bytes of all names and values.
    std::size_t bytes() const;
};

// What an entry's "prev" field says: the id of the entry appended to the
// stream just before it. Absent in entries of earlier relays and of
// other writers (nothing to check); malformed when the field appears more
// than once (22023), is not a stream id "<ms>-<seq>" of two decimal
// numbers below 2^64 (22P02: empty, too long, NUL or other bytes), or is
// not below the entry's own id (22023).
struct EntryPrev {
    enum class Kind { absent, valid, malformed };
    Kind kind = Kind::absent;
    Position prev{};         // when valid
    std::string fault;       // when malformed: why
    std::string sqlstate;    // when malformed
};
EntryPrev entry_prev(const StreamEntry& entry);

}  // namespace pg_outbox
