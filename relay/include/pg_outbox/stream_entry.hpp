// A stream entry as consume mode receives it, shared by the StreamReader
// (which reads it from Redis) and the InboxSession (which applies it).
#pragma once

#include <cstddef>
#include <optional>
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
    // Why the entry, written as a CloudEvent, cannot be read as one (its
    // fields then stay as received), and the SQLSTATE: it is malformed,
    // dead-lettered like any entry the consumer cannot read.
    std::optional<std::pair<std::string, std::string>> format_fault;

    // The value of the first field called "name"; nullptr when absent.
    const std::string* field(std::string_view name) const;
    // How many fields are called "name".
    std::size_t count(std::string_view name) const;
    // The bytes of all names and values.
    std::size_t bytes() const;
};

// Reads an entry in whichever format it was written (the relay's
// --format, or another writer's), entry by entry, into the fields the
// consumer applies: event_id, topic, key, payload and headers.
//
// - A "ce_specversion" field: a CloudEvent in binary content mode.
// - An "event" field beside "content-type" application/cloudevents+json:
//   a CloudEvent in structured content mode.
// - Anything else: the default format, whose fields are used as they
//   are; only when the headers lack a traceparent and the entry has a
//   valid "traceparent" field (another writer's way of carrying it) is it
//   added to the headers, with a valid "tracestate" field.
//
// A CloudEvent's fields become event_id (id), topic (type), key
// (partitionkey, else subject), payload (data, its JSON text as it is)
// and headers (the pgoutboxheaders object with the valid traceparent and
// tracestate added), then "prev", then the entry's other fields but data
// and event (attributes the consumer does not apply, kept for a dead
// letter). A malformed CloudEvent (specversion not 1.0; no id, type or
// data; data_base64 or a data content type other than JSON; an event or
// pgoutboxheaders that is not a JSON object; an attribute twice or of the
// wrong type) keeps its fields and gets a format_fault.
void read_entry_format(StreamEntry& entry);

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
