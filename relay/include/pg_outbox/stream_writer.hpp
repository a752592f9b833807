// The Redis side of publishing: how a batch of the feed becomes entries of
// its streams, in order, once each.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/event.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/position.hpp"
#include "pg_outbox/redis.hpp"

namespace pg_outbox {

class RedisTarget;

// Expands a stream key template: "{topic}", "{group}" (the group's name)
// and "{shard}" (the shard's number, 0 for a group of one) are replaced,
// everything else (Redis Cluster hash tag braces included) is kept.
std::string expand_stream_key(const std::string& tmpl, const std::string& topic, const std::string& group,
                              int shard = 0);

// Writes batches to Redis Streams: routes each event to its stream
// (--stream), splits a batch into per-stream shares, and appends them by
// the fast path (plain XADDs in MULTI/EXEC under WATCH, when a look at the
// streams shows the batch can be appended as is) or by the append script
// (which tells entries already present from missing ones); in a Redis
// Cluster, the fast path runs per hash slot on the slot's master.
// Remembers what it knows of each stream between batches.
class StreamWriter {
public:
    // The last position written to each stream.
    using Written = std::map<std::string, std::string>;

    // "stop" cuts short the pauses between parts while Redis is short of
    // memory.
    StreamWriter(const Config& config, Metrics& metrics, const std::atomic<bool>& stop);

    // A new target (one server, or a cluster): nothing is watched on it;
    // each of its connections loads the append script and is checked for
    // MULTI when made. Each stream's commands go to the server of its key,
    // pipelined per server, every server at once. On a target whose
    // transactions are per slot (a cluster: WATCH and MULTI/EXEC take the
    // keys of one slot), the fast path runs on each node one slot's
    // transaction after another, the look at the next slot in the round
    // trip of the one before. The target must outlive its use here, until
    // the next reset().
    void reset(RedisTarget& target);
    // The database the events come from: the CloudEvents formats name it
    // in their source (--ce-source).
    void set_database(const std::string& database);
    // A command failed: what was watched on the connections is unknown.
    void fault() {
        watched_.clear();
        node_watched_.clear();
    }

    // Writes a batch in feed order, in parts of at most --batch-bytes (at
    // least one event each); returns the last position per stream. A part
    // Redis refuses for want of memory (OOM) is written again in halves,
    // down to one event, before the batch fails. Throws RedisError after
    // reading every reply when an entry failed.
    //
    // "while_waiting", when given, runs once while Redis works on the
    // batch: after the first part is sent, before its replies are read
    // (the relay reads the next batch from PostgreSQL meanwhile). What it
    // throws is thrown once that part's replies are read, the connection
    // left in step; the later parts are then not written.
    Written write(std::span<const Event> batch, const std::function<void()>& while_waiting = {});

    // The stream-loss check: compares each stream the group published to
    // ("published": its last position there) with its last id in Redis.
    // A stream whose last id is below lost entries (Redis flushed,
    // restarted without its last writes, or failed over to a replica that
    // was behind): returns the lowest such id, for the group to rewind to.
    // What the writer expects of each stream is reset to what Redis holds.
    // "every": these are every stream the group recorded (what this
    // relay knew of others is forgotten); otherwise a share of them.
    std::optional<Position> check_streams(const std::map<std::string, Position>& published, bool every = true);
    // Whether the append script found a stream behind what this writer
    // expects (Redis lost entries) since the last call: the streams want
    // checking before the next batch.
    bool take_stream_behind() { return std::exchange(stream_behind_, false); }

private:
    // A batch split by stream, each stream's events in feed order.
    struct Shares {
        std::vector<std::string> keys;
        std::vector<std::vector<const Event*>> events;
    };
    Shares split(std::span<const Event> events) const;
    // Loads the append script on a server.
    void load_script(RedisConnection& node);
    // The one server's connection, when the transactions are not per slot.
    RedisConnection& server();
    // Writes one part of a batch: the transaction, or the append script.
    Written write_part(std::span<const Event> events);
    // How write_transaction() ended.
    enum class Transaction { written, declined, aborted };
    // The fast path: plain XADDs in MULTI/EXEC, once WATCH and a look at
    // each stream showed the batch can be appended as is. "declined": the
    // streams are not as expected, nothing was sent after the look and the
    // streams are still watched; "aborted": a watched stream changed before
    // EXEC, which wrote nothing. Throws RedisError when Redis refused the
    // transaction or an entry of it.
    Transaction write_transaction(const Shares& shares, Written& last);
    static void format_look(std::string& out, const std::vector<std::string>& keys);
    void read_look(const std::vector<std::string>& keys);
    bool streams_as_known(const Shares& shares) const;
    // Whether one stream, watched as "watched" says, is as this relay left
    // it, its share lying above its last id (see streams_as_known()).
    bool stream_as_known(const std::map<std::string, std::optional<Position>>& watched, const std::string& key,
                         const std::vector<const Event*>& events) const;
    // Formats the XADDs of a stream's share, each naming the one before it
    // as prev, the first the last position this relay published there.
    // "sent", when given, receives the formatted commands in pieces of
    // about kSendPieceBytes as they are formatted.
    void format_share(std::string& out, const std::string& key, const std::vector<const Event*>& events,
                      RedisConnection* sent);
    // The fast path on a Redis Cluster: each slot's share in a
    // transaction of its own on the slot's master, under WATCH as on one
    // server. Returns the shares (indices) for the append script: those
    // not as known, aborted, or redirected (MOVED, ASK, TRYAGAIN: nothing
    // of the transaction ran). Throws RedisError, after reading every
    // reply, when Redis refused a transaction or an entry of it.
    std::vector<std::size_t> write_cluster_transactions(const Shares& shares, Written& last);
    // The XADD replies of a transaction that ran, for the shares "streams".
    // The first failure is kept in "failure", a typed error (redis_error.hpp).
    void read_exec_replies(const Shares& shares, const std::vector<std::size_t>& streams, const redisReply* exec,
                           Written& last, std::exception_ptr& failure);
    Transaction read_transaction_replies(const Shares& shares, const redisReply* exec, Written& last);
    // The append script, stream by stream (after UNWATCH, when streams are
    // watched).
    Written write_with_script(const Shares& shares);
    // Runs the caller's "while_waiting" if it has not run yet; keeps what
    // it throws for rethrow_deferred().
    void run_while_waiting();
    void rethrow_deferred();
    // How many of the first n events of a stream's share, found already
    // present by the script, were not counted before.
    std::size_t count_already(const std::string& key, const std::vector<const Event*>& events, std::size_t n);

    const Config& config_;
    Metrics& metrics_;
    const std::atomic<bool>& stop_;
    RedisTarget* target_ = nullptr;  // set by reset()
    std::string maxlen_text_;
    std::string group_name_;  // for {group}
    int shard_;               // for {shard}
    // The entries' fields in --format, made in buffers kept between
    // batches.
    EntryFields fields_;
    std::string script_sha_;
    std::string transaction_;  // the last transaction formatted, its capacity kept
    std::string look_;         // the last look at streams formatted
    // Streams watched on the Redis connection, with their last id when the
    // WATCH began (nullopt: not a stream, or unreadable). A stream that
    // changes after that aborts the next EXEC.
    std::map<std::string, std::optional<Position>> watched_;
    // The same for each node connection of a cluster: the streams of the
    // slot watched there (more than one slot's after a look on top of a
    // watch, until EXEC or UNWATCH ends them all). Emptied whenever a node
    // connection is made: a connection is known by its address, which a
    // new one may reuse.
    std::map<const RedisConnection*, std::map<std::string, std::optional<Position>>> node_watched_;
    // The next batch goes through the append script: the last transaction
    // failed, and the script tells entries already present from missing ones.
    bool script_next_ = false;
    // Redis refused MULTI (an ACL, a proxy): the script only, until the
    // next connection checks again.
    bool transactions_refused_ = false;
    // At most this many events per part while Redis is short of memory
    // (0: no limit); halved on OOM, doubled after each part written.
    std::size_t oom_limit_ = 0;
    // Last position published to each stream, as far as this relay knows.
    std::map<std::string, Position> known_;
    // Per stream, the highest position counted as already published.
    std::map<std::string, Position> already_counted_;
    bool stream_behind_ = false;
    // The "while_waiting" of the batch being written, until it runs, and
    // what it threw.
    const std::function<void()>* while_waiting_ = nullptr;
    std::exception_ptr deferred_;
};

}  // namespace pg_outbox
