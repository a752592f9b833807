// An event of the feed and how it becomes a stream entry.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pg_outbox/config.hpp"
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

// The fields of an event's stream entry that come from the event:
// event_id, topic, key (absent when NULL), payload, headers (absent when
// NULL), position, created_at. The views point into "event". The entry's
// last field, "prev" (kPrevField), is not the event's: it is the stream's
// last id when the entry is appended, added by xadd_argv() and by the
// append script.
void append_entry_fields(std::vector<std::string_view>& out, const Event& event);

// The field that names an entry's predecessor: the id of the entry
// appended to the stream just before it ("0-0" for the first entry of a
// stream), as Redis knew it when it appended the entry
// (last-generated-id). A consumer that reads an entry whose prev lies
// beyond the last entry it was delivered knows entries are missing.
inline constexpr std::string_view kPrevField = "prev";

// The bytes of an event's stream entry: its id and its fields' names and
// values, as append_entry_fields() gives them, and "prev" with a value
// counted as long as the entry's id.
std::size_t entry_bytes(const Event& event);

// The argv of a plain XADD of an event with its position as id (explicit
// ids only), trimmed to about "maxlen" entries unless it is empty, its
// last field "prev" with the value given (the stream's last id when the
// entry is appended): the same entry as the append script writes.
// Replaces the content of argv; the views point into the arguments.
void xadd_argv(std::vector<std::string_view>& argv, std::string_view stream_key, const Event& event,
               std::string_view prev, std::string_view maxlen);

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
// the stream. And it writes nothing when the stream's last id is below the last
// position the relay knows it published there: Redis lost entries
// (FLUSHALL, a restart without the last writes, a failover), and writing
// newer entries first would make the lost ones impossible to republish.
//
// KEYS[1]: the stream. ARGV: maxlen (0: none), the expected last id ('':
// none), then per entry: id ("*" for an id Redis generates), number of
// field and value strings, the strings (without "prev"). Returns {written, already} or {written, already, error}; the
// error "PGOUTBOX_BEHIND <last id>" means nothing was written.
extern const char* const kAppendScript;

// The prefix of the script's error when the stream is behind.
inline constexpr std::string_view kBehindError = "PGOUTBOX_BEHIND ";

// The argv of an EVALSHA of kAppendScript for some events of one stream.
// The views point into the arguments.
std::vector<std::string_view> append_script_argv(const std::string& sha, const std::string& stream_key,
                                                 const std::vector<const Event*>& events, IdMode id_mode,
                                                 const std::string& maxlen_text, const std::string& expected_last,
                                                 std::vector<std::string>& counts);

}  // namespace pg_outbox
