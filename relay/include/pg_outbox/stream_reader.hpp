// The Redis side of consume mode: the consumer group's reads, claims,
// gap checks, trim reports and acknowledgements, through the relay's Redis
// target (one server, or the master of each stream's slot in a cluster).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/position.hpp"
#include "pg_outbox/redis.hpp"
#include "pg_outbox/redis_target.hpp"
#include "pg_outbox/stream_entry.hpp"

namespace pg_outbox {

// Reads the entries of an XREADGROUP or XAUTOCLAIM entry list.
std::vector<StreamEntry> parse_entries(const std::string& stream, const redisReply* list);

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
    // What the dead letter and the log say of it.
    std::string reason() const;
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

// Entries trimmed from a stream before the consumer group read them: the
// ids after "last" (the group's last-delivered id) and before "first"
// (the first entry the stream still holds), "lost" of them by Redis's
// counts.
struct TrimmedRange {
    std::string stream;
    Position last{};
    Position first{};
    long long lost = 0;
    // The group's entries-read once it is moved past the range.
    long long entries_read = 0;

    // "(last first)", as the dead letter's entry id.
    std::string range() const;
    // What the dead letter and the log say of it.
    std::string reason() const;
};

// One page of XAUTOCLAIM: the cursor to go on from ("0-0" when the
// stream's pending entries were all looked at), the entries claimed, and
// the ids of pending entries deleted from the stream (Redis drops them
// from the pending list as it reports them).
struct ClaimPage {
    std::string cursor;
    std::vector<StreamEntry> entries;
    std::vector<std::string> deleted;
};

// Reads for one worker (--worker) of a consumer group (--consumer-group).
// Owns what it learned of the server: whether the groups exist, whether
// Redis refuses MULTI or XINFO GROUPS.
class StreamReader {
public:
    // "stop" cuts a cluster's read short between slots.
    StreamReader(const Config& config, Metrics& metrics, const std::atomic<bool>& stop);

    // A new Redis target, or a fault ("redis": the target kept, nullptr
    // when there is none): the groups are made sure of again. The target
    // must outlive its use here, until the next reset().
    void reset(RedisTarget* redis);
    // Whether there is a server to send to.
    bool reachable() const { return redis_ != nullptr; }

    // A command on a stream's server (in a cluster, MOVED and ASK
    // followed). An error reply throws its typed error (redis_error.hpp).
    RedisReply command(std::string_view key, const std::vector<std::string_view>& argv,
                       std::string_view context = {});

    // Creates the consumer group on each stream (and the stream) where it
    // is missing, once after each reset().
    void ensure_groups();
    // Reads new entries of these streams for this worker, and in the same
    // transaction the group's last-delivered id in each stream, which
    // tells gaps (see find_gaps()) whatever the other workers of the
    // group read: each is counted, logged and handed to "gap" (to be
    // dead-lettered) before the entries are returned. When there is
    // nothing new, waits up to --block for an entry and returns none (the
    // next read takes it); without "wait_for_entries", returns none at
    // once (the worker has other work: parked keys to drain).
    std::vector<StreamEntry> read(const std::vector<std::string>& streams, const std::function<void(const Gap&)>& gap,
                                  bool wait_for_entries = true);

    // The stream's pending entries idle at least "min_idle" ms, whoever's
    // they are, claimed for this worker in id order from "cursor", a page
    // of --consume-batch-size; nullopt when Redis's reply says nothing.
    std::optional<ClaimPage> claim(const std::string& stream, const std::string& min_idle, const std::string& cursor);
    // Sets each claimed entry's delivery count (XAUTOCLAIM's delivery
    // included), and counts them as reclaimed.
    void count_deliveries(const std::string& stream, std::vector<StreamEntry>& entries);
    // The idle time of the stream's oldest pending entry, in seconds; 0
    // when there is none or Redis does not say.
    double oldest_pending_idle(const std::string& stream);
    // Entries trimmed from the stream before the group read them (see
    // stream_reader.cpp), logged; nullopt when none are, or Redis cannot
    // tell.
    std::optional<TrimmedRange> trimmed_unread(const std::string& stream);
    // Moves the group past a trimmed range once it is reported, so that it
    // is reported once.
    void skip_trimmed(const TrimmedRange& range);

    // Gives an entry back its delivery count as it was before this
    // delivery, and restarts its idle time: it stays this worker's, to be
    // retried.
    void release(const StreamEntry& entry);
    // Acknowledges entries (committed, or dead-lettered). On one server the
    // reply is read with the next command's.
    void ack(const std::vector<const StreamEntry*>& entries);

private:
    RedisReply command_raw(std::string_view stream, const std::vector<std::string_view>& argv);
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
    // The redirection an error reply's text is, in a cluster; nullopt for
    // any other error, and for every error on one server.
    std::optional<Redirect> redirection(std::string_view text) const;
    // Counts and logs the gaps a read revealed, and hands each to "gap".
    void report_gaps(std::map<std::string, Position> delivered, const std::vector<StreamEntry>& entries,
                     const std::function<void(const Gap&)>& gap);

    const Config& config_;
    Metrics& metrics_;
    const std::atomic<bool>& stop_;
    RedisTarget* redis_ = nullptr;  // between reset(&target) and the next reset()
    bool groups_ready_ = false;
    // Redis refused MULTI: the group's position and the read are then two
    // commands, exact with one worker per group (warned once).
    bool multi_refused_warned_ = false;
    // Redis refused XINFO GROUPS (an ACL): reads go without the group's
    // position, and gaps are not checked.
    bool positions_refused_ = false;
    // How many times a slot's read follows MOVED before the read fails.
    static constexpr int kMaxClusterRedirects = 5;
};

}  // namespace pg_outbox
