// The PostgreSQL side of consume mode: the consumer's session, which
// checks the settings, applies entries through inbox_consume_keyed()
// (inbox_consume() with the parked keys honoured), records dead letters
// and parks the keys of failed entries (--on-failure park-key).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/extension.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/pg.hpp"
#include "pg_outbox/stream_entry.hpp"

namespace pg_outbox {

// The fields inbox_consume() reads; each may appear at most once.
inline constexpr std::string_view kEntryFields[] = {"event_id", "topic", "key", "payload", "headers"};

// Entries whose fields add up to more are dead-lettered unread
// (SQLSTATE 54000): PostgreSQL takes a value of up to 1 GB, and a jsonb
// payload of up to 256 MB.
inline constexpr std::size_t kMaxEntryBytes = 256u << 20;
// One inbox_consume() call takes entries of up to this many bytes
// together (one larger entry goes alone).
inline constexpr std::size_t kMaxCallBytes = 32u << 20;
// When a batch fails as one, its entries apply again each in a
// subtransaction of its own, in calls of at most this many entries:
// PostgreSQL keeps 64 subtransaction ids per backend before it overflows
// (inbox_consume() refuses more with isolate).
inline constexpr std::size_t kMaxIsolatedEntries = 64;
// A dead letter keeps an entry's fields losslessly up to this many bytes
// together; beyond, each value is cut to kTruncatedValueBytes.
inline constexpr std::size_t kMaxDeadLetterBytes = 256u << 20;
inline constexpr std::size_t kTruncatedValueBytes = 1u << 20;

// A PostgreSQL bytea[] in the binary format, for a binary parameter:
// one element per value, NULL for absent ones; values may hold any bytes.
std::string pg_bytea_array(const std::vector<const std::string*>& values);
// The same for a text[] (values in the connection's encoding, no NULL).
std::string pg_text_array(const std::vector<const std::string*>& values);
// The bytes of a bytea in PostgreSQL's text output ("\\x" and hex digits);
// nullopt when it is not that.
std::optional<std::string> pg_bytea_from_hex(std::string_view text);

// Why the relay cannot hand an entry to inbox_consume() (a CloudEvent it
// cannot read: StreamEntry::format_fault; a field it reads appears twice, or the entry is too large, or its "prev" field is not
// what a relay writes: see entry_prev()), with a SQLSTATE; nullopt when it
// can. Everything about the content is decided by the server.
std::optional<std::pair<std::string, std::string>> framing_fault(const StreamEntry& entry);

// Why a handler cannot be a statement inbox_consume() runs: it applies
// each entry in a subtransaction of the worker's transaction, on a session
// the worker keeps. Refused: transaction control (BEGIN, COMMIT, ROLLBACK,
// SAVEPOINT, RELEASE, PREPARE TRANSACTION, ...), what PostgreSQL refuses
// inside a transaction block or a function (VACUUM, CREATE DATABASE,
// CREATE INDEX CONCURRENTLY, COPY from or to the client, ...), and what
// changes the session for the entries and the worker's statements that
// follow (SET without LOCAL, RESET, DISCARD, PREPARE, DEALLOCATE, LISTEN).
// Judged from the statement's words as psql judges them for AUTOCOMMIT
// off: white space, comments, quoted identifiers and strings skipped,
// case ignored. nullopt when the handler is none of these; otherwise the
// reason, a sentence naming the statement.
std::optional<std::string> handler_refusal(std::string_view handler);

// A key as a log line shows it: quoted, its first 64 bytes only (a key may
// be of any size), control characters escaped.
std::string log_key(std::string_view key);

// The first line of a PostgreSQL error, without libpq's prefixes.
std::string pg_error_line(const std::string& message);

// Where the session sends entries as it settles them: acknowledged in
// Redis, or held for a retry. Called in the order the session learns it,
// each settled entry after the commit that settled it.
class EntrySink {
public:
    virtual ~EntrySink() = default;
    // Entries applied, found applied before (duplicate) or dead-lettered:
    // to be acknowledged.
    virtual void settled(const std::vector<const StreamEntry*>& entries) = 0;
    // An entry that met a configuration or transient fault (with its
    // SQLSTATE and message): to be retried, neither acknowledged nor
    // dead-lettered.
    virtual void held(const StreamEntry& entry, std::string_view sqlstate, std::string_view message) = 0;
};

// What inbox_park_key() recorded: the key's state after (nullopt when
// nothing is parked: a keyless entry, or a plain dead letter), or the
// SQLSTATE and message of the error that kept it from being recorded.
struct ParkRecord {
    std::optional<std::string> state;
    std::optional<std::pair<std::string, std::string>> fault;
};

// A key of inbox_parked_keys(), as the drain reads it.
struct ParkedKey {
    std::string stream;
    std::string key;  // the key field's bytes
    std::string state;  // retrying, draining or dead
    long long parked = 0;
    int deliveries = 0;
};

// One inbox_redrive_step(): what it applied and dead-lettered, the entry
// that failed (with its SQLSTATE, message and delivery count) if one did,
// and the key's state after (nullopt: un-parked).
struct DrainStep {
    int applied = 0;
    int dead_lettered = 0;
    std::optional<std::string> failed_entry_id;
    std::string error_code;
    std::string error_message;
    int deliveries = 0;
    std::optional<std::string> key_state;
};

// The consumer's PostgreSQL session (--consumer, --handler): what the
// relay keeps of it between batches (the prepared inbox_consume() call,
// whether the settings were checked), the isolate fallback of a batch that
// fails as one, and the fate of an entry that fails (--max-deliveries,
// dead letters).
class InboxSession {
public:
    InboxSession(const Config& config, Metrics& metrics, EntrySink& sink);

    // A new connection: at the first, checks the settings; prepares the
    // inbox_consume() call. The connection and the extension found on it
    // must outlive their use here, until reset().
    void connected(PgConnection& pg, const Extension& extension);
    // The connection is gone.
    void reset();

    // One call of inbox_consume() for entries of up to kMaxCallBytes
    // together (or one larger), one transaction without a subtransaction
    // per entry. A call that fails as one is made again with isolate (each
    // entry in a subtransaction), in parts of at most kMaxIsolatedEntries,
    // each part's settled entries handed to the sink after its commit.
    // The entries settled by the call itself are added to "done", those
    // held go to the sink; an entry failing for its own reasons stays
    // pending until --max-deliveries, then is dead-lettered. A lost
    // connection or a transient error throws PgError (the call is not
    // settled).
    //
    // Every call goes through inbox_consume_keyed(), which parks the
    // entries of parked keys (acknowledged as settled). With --on-failure
    // park-key, an entry failing for its own reasons parks its key
    // (park_key()): no later entry of the key is applied before it, in the
    // call (the server blocks them; they are submitted again and park),
    // in later calls, or by any worker; an entry held after a
    // configuration fault holds the later entries of its key given to
    // apply() until begin_apply().
    void apply(const std::vector<const StreamEntry*>& call, std::vector<const StreamEntry*>& done);
    // A new batch: forgets the keys held by the previous one.
    void begin_apply() { held_keys_.clear(); }
    // An entry the relay cannot hand to inbox_consume() (framing_fault())
    // or that the server found malformed: dead-lettered and added to
    // "done", or held when its dead letter cannot be recorded.
    void malformed(const StreamEntry& entry, const std::string& reason, const std::string& sqlstate,
                   std::vector<const StreamEntry*>& done);
    // Records a dead letter with the entry's raw fields (cut when they are
    // too large for the server); an entry without fields stands for a
    // range of ids or an entry gone from the stream. The SQLSTATE and
    // message of the error that kept it from being recorded, nullopt when
    // it is recorded.
    std::optional<std::pair<std::string, std::string>> dead_letter(const StreamEntry& entry,
                                                                   const std::string& reason,
                                                                   const std::optional<std::string>& sqlstate);

    // Records an entry's failure through inbox_park_key(): a keyed entry
    // with fields parks its key (retrying, or dead with its dead letter
    // when "dead"); a keyless one is dead-lettered when "dead"; an entry
    // without fields (a parked entry failing in a drain, an entry deleted
    // from the stream) updates its key or becomes a plain dead letter. The
    // fields are cut as dead_letter() cuts them. A lost connection or a
    // transient error throws PgError.
    ParkRecord park_key(const StreamEntry& entry, const std::string& reason,
                        const std::optional<std::string>& sqlstate, bool dead);

    // The drain (drain.cpp): the parked keys of these streams
    // (inbox_parked_keys()), and one step of a draining key
    // (inbox_redrive_step(), one transaction). PgError when they fail.
    std::vector<ParkedKey> parked_keys(const std::vector<std::string>& streams);
    DrainStep redrive_step(const std::string& stream, const std::string& key);

private:
    // At start-up: the consumer may be used by this role, the streams are
    // text, the handler prepares with the five parameter types, is no
    // statement handler_refusal() refuses, and its objects are accessible.
    // A failure is a ConfigError (exit 2).
    void validate_settings();
    void apply_call(const std::vector<const StreamEntry*>& call, std::vector<const StreamEntry*>& done,
                    bool isolate);
    // One entry's failure that is the entry's: counts the delivery, and
    // dead-letters it after --max-deliveries.
    void entry_failed(const StreamEntry& e, std::string_view sqlstate, std::string_view message,
                      std::vector<const StreamEntry*>& done);
    // The same with --on-failure park-key for a keyed entry: parks its key
    // (dead after --max-deliveries, then added to "done"); held, with its
    // key, when the park cannot be recorded.
    void key_failed(const StreamEntry& e, std::string_view sqlstate, std::string_view message,
                    std::vector<const StreamEntry*>& done);
    // Hands an entry to the sink as held; with park-key its key is held
    // too, so that no later entry of it applies in this batch.
    void hold(const StreamEntry& e, std::string_view sqlstate, std::string_view message);
    // Runs "record" with the entry's raw fields as a bytea[] (NULL when it
    // has none), cut when they are too large for the server; the SQLSTATE
    // and message of the error that kept it from running, nullopt when it
    // ran.
    std::optional<std::pair<std::string, std::string>> with_fields(
        const StreamEntry& e, const std::string& reason,
        const std::function<void(const std::string& why, const Param& fields)>& record);
    bool parking() const { return config_.on_failure == OnFailure::park_key; }

    const Config& config_;
    Metrics& metrics_;
    EntrySink& sink_;
    PgConnection* pg_ = nullptr;  // between connected() and reset()
    const Extension* extension_ = nullptr;
    bool validated_ = false;
    // With park-key, the keys (stream, key bytes) of entries held in this
    // batch, with the SQLSTATE and message they were held for.
    std::map<std::pair<std::string, std::string>, std::pair<std::string, std::string>> held_keys_;
};

}  // namespace pg_outbox
