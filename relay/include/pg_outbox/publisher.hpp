// Publish mode: a group's feed to Redis Streams.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <string>
#include <vector>

#include "pg_outbox/event.hpp"
#include "pg_outbox/lag.hpp"
#include "pg_outbox/position.hpp"
#include "pg_outbox/service.hpp"

namespace pg_outbox {

class Publisher : public Service {
public:
    Publisher(const Config& config, Metrics& metrics, const std::atomic<bool>& stop);

private:
    void turn() override;
    void on_pg_connected() override;
    void on_redis_connected() override;
    void on_pg_lost() override;
    void on_redis_fault() override;
    void on_stop() override;

    void load_script();
    void check_transactions();
    bool take_leadership();
    void check_streams();
    // The next batch after the cursor, or after "after" when given (the
    // batch still being written to Redis). fetch() is send_fetch() then
    // receive_fetch().
    // With "wait", an empty batch waits in the server for a commit.
    void send_fetch(const std::string* after, std::chrono::milliseconds wait = std::chrono::milliseconds(0));
    std::vector<Event> receive_fetch();
    // The next batch after the last one Redis acknowledged, advanced or not.
    void send_next_fetch(std::chrono::milliseconds wait = std::chrono::milliseconds(0)) {
        send_fetch(unadvanced_ ? &unadvanced_->first : nullptr, wait);
    }
    std::vector<Event> fetch() {
        send_next_fetch();
        return receive_fetch();
    }
    // A batch split by stream, each stream's events in feed order.
    struct Shares {
        std::vector<std::string> keys;
        std::vector<std::vector<const Event*>> events;
    };
    Shares split(std::span<const Event> events) const;
    // Publishes a batch in feed order, in parts of at most --batch-bytes
    // (at least one event each); returns the last position per stream.
    // A part Redis refuses for want of memory (OOM) is written again in
    // halves, down to one event, before the batch fails. Throws RedisError
    // after reading every reply when an entry failed.
    std::map<std::string, std::string> publish(const std::vector<Event>& batch);
    // Writes one part of a batch: the transaction, or the append script.
    std::map<std::string, std::string> write_part(std::span<const Event> events);
    // How write_transaction() ended.
    enum class Transaction { written, declined, aborted };
    // The fast path: plain XADDs in MULTI/EXEC, once WATCH and a look at
    // each stream showed the batch can be appended as is. "declined": the
    // streams are not as expected, nothing was sent after the look and the
    // streams are still watched; "aborted": a watched stream changed before
    // EXEC, which wrote nothing. Throws RedisError when Redis refused the
    // transaction or an entry of it.
    Transaction write_transaction(const Shares& shares, std::map<std::string, std::string>& last);
    static void format_look(std::string& out, const std::vector<std::string>& keys);
    void read_look(const std::vector<std::string>& keys);
    bool streams_as_known(const Shares& shares) const;
    Transaction read_transaction_replies(const Shares& shares, const redisReply* exec,
                                         std::map<std::string, std::string>& last);
    // The append script, stream by stream (after UNWATCH, when streams are
    // watched).
    std::map<std::string, std::string> write_with_script(const Shares& shares);
    // How many of the first n events of a stream's share, found already
    // present by the script, were not counted before.
    std::size_t count_already(const std::string& key, const std::vector<const Event*>& events, std::size_t n);
    // The cursor advance of the batches Redis acknowledged: recorded, sent
    // with a next fetch when due, or alone when the feed runs dry.
    bool advance_due() const;
    void record_published(const std::string& position, std::map<std::string, std::string> streams);
    void send_advance();
    void receive_advance();
    void flush_advance();
    void maybe_maintain(bool idle);
    void wait(std::chrono::milliseconds timeout);
    void discard_queued();

    bool streams_checked_ = false;
    // Whether "standing by" was logged since this relay last led.
    bool standing_by_ = false;
    // The batch fetched while the previous one was being written to Redis.
    std::vector<Event> prefetched_;
    // The last position Redis acknowledged, not yet sent to the cursor.
    std::optional<std::pair<std::string, std::map<std::string, std::string>>> unadvanced_;
    bool advance_sent_ = false;
    std::chrono::steady_clock::time_point advance_sent_at_{};
    std::string maxlen_text_;
    std::string script_sha_;
    std::string transaction_;  // the last transaction formatted, its capacity kept
    std::string look_;         // the last look at streams formatted
    // Streams watched on the Redis connection, with their last id when the
    // WATCH began (nullopt: not a stream, or unreadable). A stream that
    // changes after that aborts the next EXEC.
    std::map<std::string, std::optional<Position>> watched_;
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
    std::chrono::steady_clock::time_point next_check_{};
    std::chrono::steady_clock::time_point next_maintain_{};
    std::chrono::steady_clock::time_point fetch_sent_{};
    bool fetch_waits_ = false;  // the fetch in flight may sleep in the server
    // The server sleeps in outbox_fetch() until a commit wakes it, instead
    // of this relay waiting for a notification (pg_outbox preloaded).
    bool sleeps_in_fetch_ = false;
    // The lag metric, measured on its own connection and thread.
    LagProbe lag_;
};

}  // namespace pg_outbox
