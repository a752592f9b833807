// An event of the feed and how it becomes a stream entry.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/json_text.hpp"
#include "pg_outbox/position.hpp"

namespace pg_outbox {

struct Event {
    std::string position;  // "<txid>-<seq>"
    std::string event_id;
    std::string topic;
    std::optional<std::string> key;
    std::string payload;
    std::optional<std::string> headers;
    std::string created_at;
    // The position parsed, once, when the batch arrives: what the relay
    // compares with stream ids. The text above is what Redis is sent.
    Position parsed{};
};

// A batch as outbox_fetch_packed() packs it (extension/pack.c): "OBP1",
// the event count (uint32), the first event's age in microseconds (int64,
// -1 when empty), then per event seven fields (position, event_id, topic,
// key, payload, headers, created_at), each an int32 length (-1: NULL) and
// its bytes; integers in network byte order.
struct PackedBatch {
    std::vector<Event> events;
    std::optional<double> first_age_seconds;  // none when empty
};

// Unpacks a batch; throws std::invalid_argument naming what is wrong when
// the bytes are not a whole batch in that format (truncated, trailing
// bytes, a NULL where the field cannot be one, a malformed position).
PackedBatch unpack_batch(std::string_view bytes);
// The same into "out", reusing its events: a string whose capacity holds
// the new field takes it without allocating, so that a relay recycling
// the batch it wrote unpacks the next one in the memory of the last.
void unpack_batch(std::string_view bytes, PackedBatch& out);

// True when Redis refused an XADD because the stream already holds an
// entry with an equal or greater id: with explicit ids, the entry was
// published before.
bool is_already_published_error(std::string_view reply_error);

// Why a --ce-source template cannot be a CloudEvents source (empty, over
// 1024 bytes, a control character, a space or a byte outside ASCII, a
// placeholder other than {database} and {group}); nullopt when it can.
std::optional<std::string> ce_source_fault(std::string_view tmpl);
// The template with "{database}" and "{group}" replaced by the names,
// percent-encoded (RFC 3986: the unreserved characters A-Z a-z 0-9 - . _ ~
// kept, every other byte %XX).
std::string expand_ce_source(std::string_view tmpl, std::string_view database, std::string_view group);

// The trace context an event's headers hold: the values of their
// top-level "traceparent" and "tracestate" string members when valid
// (trace_context.hpp), tracestate only beside a valid traceparent; empty
// views when none. The headers are read only when they contain
// "traceparent". The views point into the headers, or into "decoded"
// when the JSON string had escapes.
struct TraceContext {
    std::string_view traceparent;
    std::string_view tracestate;
};
TraceContext trace_context_of(std::string_view headers, std::vector<JsonMember>& scratch, std::string& decoded);

// The fields of events' stream entries in one format (--format), and the
// memory they are made in: what the format computes (a sequence, a
// decoded trace context, headers without their trace context, a
// structured event) goes into buffers kept from one batch to the next,
// so that a relay in steady state formats entries without allocating.
//
// default:    event_id, topic, [key], payload, [headers], [traceparent],
//             [tracestate], position, created_at
// cloudevents (binary content mode): ce_specversion (1.0), ce_id, ce_source,
//             ce_type (the topic), [ce_time] (created_at), [ce_subject],
//             [ce_partitionkey] (the key, both), ce_sequence (the position as
//             %020llu-%020llu), [ce_traceparent], [ce_tracestate],
//             [ce_pgoutboxheaders] (the headers without their trace
//             context, when anything is left), content-type
//             (application/json), data (the payload)
// cloudevents-structured: content-type (application/cloudevents+json),
//             event (one JSON object with the same attributes, the headers
//             as a string "pgoutboxheaders", datacontenttype and the
//             payload as "data")
//
// Brackets mark fields absent when the event has no such value. The
// entry's last field, "prev" (kPrevField), is not the event's: it is
// added by xadd_argv() and by the append script.
class EntryFields {
public:
    // The default format; a CloudEvents format needs its source.
    EntryFields() = default;
    EntryFields(EntryFormat format, std::string source);

    EntryFormat format() const { return format_; }
    // The source attribute of the CloudEvents formats (expand_ce_source()).
    void set_source(std::string source);

    // Appends the fields of an event's entry, names and values in turn.
    // The views point into "event" or into this object's buffers, valid
    // until clear().
    void append(std::vector<std::string_view>& out, const Event& event);
    // Forgets what the views of earlier append() calls point to; the
    // buffers are kept for the next entries.
    void clear() { used_ = 0; }

    // The bytes of an event's stream entry: its id and its fields' names
    // and values, as append() gives them, and "prev" with a value counted
    // as long as the entry's id. Leaves the buffers as they were.
    std::size_t entry_bytes(const Event& event);

private:
    std::string& buffer();
    // The event's trace context (trace_context_of()), decoded into a
    // buffer only when its headers mention "traceparent".
    TraceContext trace_of(const Event& e);
    // The headers without their top-level traceparent and tracestate;
    // an empty view when nothing is left.
    std::string_view headers_without_trace(std::string_view headers);
    void append_plain(std::vector<std::string_view>& out, const Event& e);
    void append_binary(std::vector<std::string_view>& out, const Event& e);
    void append_structured(std::vector<std::string_view>& out, const Event& e);

    EntryFormat format_ = EntryFormat::plain;
    std::string source_;
    std::string source_json_;  // the source as a JSON string token
    std::deque<std::string> buffers_;  // a deque: views into them survive its growth
    std::size_t used_ = 0;
    std::vector<JsonMember> members_;  // scratch
};

// The fields of an event's entry in the default format (EntryFields).
void append_entry_fields(std::vector<std::string_view>& out, const Event& event, EntryFields& fields);

// The field that names an entry's predecessor: the id of the entry
// appended to the stream just before it ("0-0" for the first entry of a
// stream), as Redis knew it when it appended the entry
// (last-generated-id). A consumer that reads an entry whose prev lies
// beyond the last entry it was delivered knows entries are missing.
inline constexpr std::string_view kPrevField = "prev";

// The bytes of an event's stream entry (EntryFields::entry_bytes()).
std::size_t entry_bytes(const Event& event, EntryFields& fields);

// The argv of a plain XADD of an event with its position as id (explicit
// ids only), trimmed to about "maxlen" entries unless it is empty, its
// last field "prev" with the value given (the stream's last id when the
// entry is appended): the same entry as the append script writes.
// Replaces the content of argv; the views point into the arguments and
// into "fields" (until its clear()).
void xadd_argv(std::vector<std::string_view>& argv, std::string_view stream_key, const Event& event,
               std::string_view prev, std::string_view maxlen, EntryFields& fields);

// Lua script that appends a stream's share of a batch, in order.
//
// It stops at the first entry Redis refuses for any reason other than
// "already there": a later entry of the same stream can then never be
// written before an earlier one that failed, which with explicit ids would
// make the earlier one impossible to write (Redis refuses ids below the
// top). "Already there" is checked, not assumed: the entry with that id
// must be in the stream with the same event id, or have been trimmed;
// otherwise another writer put higher ids into the stream, and the script
// stops with "PGOUTBOX_FOREIGN <id>" rather than skip the event. Each
// entry it writes gets a last field "prev": the stream's last id just
// before it (last-generated-id, "0-0" for a new stream), read from Redis
// in the same script, so that a replay, a takeover by another relay or a
// republish after Redis lost entries names the entry really before it in
// the stream; the event id of an entry is found in any of the three
// formats (event_id, ce_id, or the "id" a structured event starts with),
// so that a replay in another format than the first write is still told
// apart from another writer's entry. And it writes nothing when the stream's last id is below the last
// position the relay knows it published there: Redis lost entries
// (FLUSHALL, a restart without the last writes, a failover), and writing
// newer entries first would make the lost ones impossible to republish.
//
// KEYS[1]: the stream. ARGV: maxlen (0: none), the expected last id ('':
// none), then per entry: id ("*" for an id Redis generates), the event
// id, number of field and value strings, the strings (without "prev"). Returns {written, already} or {written, already, error}; the
// error "PGOUTBOX_BEHIND <last id>" means nothing was written.
extern const char* const kAppendScript;

// The prefix of the script's error when the stream is behind.
inline constexpr std::string_view kBehindError = "PGOUTBOX_BEHIND ";

// The argv of an EVALSHA of kAppendScript for some events of one stream.
// The views point into the arguments and into "fields" (until its
// clear()).
std::vector<std::string_view> append_script_argv(const std::string& sha, const std::string& stream_key,
                                                 const std::vector<const Event*>& events, IdMode id_mode,
                                                 const std::string& maxlen_text, const std::string& expected_last,
                                                 std::vector<std::string>& counts, EntryFields& fields);

}  // namespace pg_outbox
