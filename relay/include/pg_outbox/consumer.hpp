// Consume mode: stream entries applied through the inbox and a handler.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pg_outbox/backoff.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/position.hpp"
#include "pg_outbox/redis_cluster.hpp"
#include "pg_outbox/service.hpp"
#include "pg_outbox/stream_pool.hpp"

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

// Reads the entries of an XREADGROUP or XAUTOCLAIM entry list.
std::vector<StreamEntry> parse_entries(const std::string& stream, const redisReply* list);

// Why the relay cannot hand an entry to inbox_consume() (a field it reads
// appears twice, or the entry is too large, or its "prev" field is not
// what a relay writes: see entry_prev()), with a SQLSTATE; nullopt when it
// can. Everything about the content is decided by the server.
std::optional<std::pair<std::string, std::string>> framing_fault(const StreamEntry& entry);

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

// Entries missing from a stream before this consumer group read them:
// the ids after "after" (the last entry delivered to the group) up to and
// including "through" (the prev of the entry delivered next, "found"). Ids
// are not dense: the range is exact, the number of entries in it unknown
// (one at least).
struct Gap {
    std::string stream;
    Position after{};
    Position through{};
    std::string found;  // the id of the entry that named "through"

    // "(after through]", as the dead letter's entry id.
    std::string range() const;
};

// The gaps a read of the consumer group reveals. "delivered": per stream,
// the last id delivered to the group just before the read (the group's
// last-delivered-id, read in the same transaction); a stream not in it is
// not checked. "entries": what the read delivered, each stream's in
// order. An entry whose valid prev lies beyond the last id delivered
// (the one before it in the read, or the group's) reveals a gap. A prev at
// or before it is no gap: the group was moved past entries on purpose
// (XGROUP SETID, the report of a trimmed range). Entries without a valid
// prev are not checked but count as delivered.
std::vector<Gap> find_gaps(std::map<std::string, Position> delivered, const std::vector<StreamEntry>& entries);

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

class Consumer : public Service {
public:
    Consumer(const Config& config, Metrics& metrics, const std::atomic<bool>& stop);

private:
    // The handler's SQL runs in the relay's session with the role's settings.
    bool keeps_handler_settings() const override { return true; }
    // What an apply left for later: entries held after a configuration or
    // transient fault, to be retried after a backoff.
    struct Held {
        std::vector<StreamEntry> entries;
        std::string sqlstate;
        std::string message;
        Fault fault = Fault::configuration;
    };

    void turn() override;
    void on_stop() override;
    void on_pg_connected() override;
    void on_redis_connected() override;
    void on_redis_fault() override;
    // A command on a stream: on the connection, or in a Redis Cluster on
    // the master of the stream's slot (MOVED and ASK followed).
    RedisReply command(std::string_view stream, const std::vector<std::string_view>& argv,
                       std::string_view context = {});
    RedisReply command_raw(std::string_view stream, const std::vector<std::string_view>& argv);

    // At start-up: the consumer may be used by this role, the streams are
    // text, the handler prepares with the five parameter types, is no
    // statement handler_refusal() refuses, and its objects are accessible.
    // A failure is a ConfigError (exit 2).
    void validate_settings();
    void ensure_groups();
    // Reads new entries for this worker, and in the same transaction the
    // group's last-delivered id in each stream, which tells gaps (see
    // find_gaps()) whatever the other workers of the group read. Waits up
    // to --block for an entry when there is none.
    std::vector<StreamEntry> read_new();
    // The same in a Redis Cluster, slot by slot (see consumer.cpp).
    std::vector<StreamEntry> read_new_cluster();
    // What read_group() found: entries ("read"; none when there was
    // nothing new), nothing because Redis refused XINFO GROUPS ("refused":
    // the next read goes without the group's position), or nothing
    // because the streams' slot is served by another node ("redirected",
    // in a cluster).
    struct GroupRead {
        enum class Outcome { read, refused, redirected };
        Outcome outcome = Outcome::read;
        std::vector<StreamEntry> entries;
        std::optional<Redirect> redirect;
    };
    // One read for this worker on "redis", of streams all on that server
    // (in a cluster, of one slot): MULTI, XINFO GROUPS of each stream (its
    // last-delivered id into "delivered"), XREADGROUP without blocking,
    // EXEC.
    GroupRead read_group(RedisConnection& redis, const std::vector<std::string_view>& streams,
                         std::map<std::string, Position>& delivered);
    // The XREAD that waits up to "block" for an entry after the group's
    // position in each stream ("$" where it is unknown), reading nothing
    // for the group.
    std::vector<std::string> wait_argv(const std::vector<std::string_view>& streams,
                                       const std::map<std::string, Position>& delivered,
                                       std::chrono::milliseconds block) const;
    // Reports a gap: a warning, pg_outbox_relay_gaps_total, a dead letter
    // for the range.
    void report_gap(const Gap& gap);
    void reclaim();
    // Claims the stream's pending entries idle at least "min_idle" ms,
    // whoever's they are, in id order, and applies them; the idle time of
    // the oldest left pending, in seconds.
    double reclaim_stream(const std::string& stream, const std::string& min_idle);
    // The streams this worker reads now: all of them, or with --pool the
    // ones it holds whose previous owner's pending entries are settled.
    std::vector<std::string> reading() const;
    // With --pool: whether the stream was lost since it was read (its
    // entries are then left to its next owner).
    bool lost(const std::string& stream) const { return pool_ && !pool_->holds(stream); }
    // With --pool: renews the holds when due; the streams just taken wait
    // in unsettled_ until their pending entries are settled.
    void keep_pool();
    // Sleeps, keeping the pool's holds renewed meanwhile.
    void wait(std::chrono::milliseconds d);
    void report_trimmed_unread(const std::string& stream);
    // Applies entries (in calls of at most kMaxCallBytes, each one
    // transaction without a subtransaction per entry), then acknowledges
    // what is done: applied, duplicate, dead-lettered. Entries that met a
    // configuration or transient fault are held for retry.
    void apply(const std::vector<StreamEntry>& entries);
    // One call of inbox_consume(). A call that fails as one is made again
    // with isolate (each entry in a subtransaction), in parts of at most
    // kMaxIsolatedEntries.
    void apply_call(const std::vector<const StreamEntry*>& call, std::vector<const StreamEntry*>& done,
                    bool isolate = false);
    // One entry's failure that is the entry's: counts the delivery, and
    // dead-letters it after --max-deliveries.
    void entry_failed(const StreamEntry& e, std::string_view sqlstate, std::string_view message,
                      std::vector<const StreamEntry*>& done);
    void malformed(const StreamEntry& e, const std::string& reason, const std::string& sqlstate,
                   std::vector<const StreamEntry*>& done);
    void hold(const StreamEntry& e, std::string_view sqlstate, std::string_view message);
    // Records a dead letter with the entry's raw fields (cut when they are
    // too large for the server); the SQLSTATE and message of the error that
    // kept it from being recorded, nullopt when it is recorded.
    std::optional<std::pair<std::string, std::string>> dead_letter(const StreamEntry& entry, const std::string& reason,
                                                                   const std::optional<std::string>& sqlstate);
    void ack(const std::vector<const StreamEntry*>& entries);

    bool groups_ready_ = false;
    bool validated_ = false;
    // The held entries are retried on a new session: the one they failed on
    // was closed after a configuration fault (the handler may have changed
    // it: its search_path, its role).
    bool held_on_new_session_ = false;
    // Redis refused MULTI: the group's position and the read are then two
    // commands, exact with one worker per group (warned once).
    bool multi_refused_warned_ = false;
    // Redis refused XINFO GROUPS (an ACL): reads go without the group's
    // position, and gaps are not checked.
    bool positions_refused_ = false;
    std::chrono::steady_clock::time_point next_claim_{};
    Held held_;
    Backoff hold_backoff_;
    // With --pool: the streams this worker holds, and those of them whose
    // previous owner's pending entries are still to be applied.
    std::optional<StreamPool> pool_;
    std::set<std::string> unsettled_;
    // The Redis target when it is a cluster, else nullptr: what consume
    // still does per kind of target (reading slot by slot) until it reads
    // through RedisTarget alone.
    RedisCluster* cluster() const { return dynamic_cast<RedisCluster*>(redis_.get()); }
    // How many times a slot's read follows MOVED before the turn fails.
    static constexpr int kMaxClusterRedirects = 5;
};

}  // namespace pg_outbox
