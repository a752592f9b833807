// The PostgreSQL side of publishing a group: its leadership, the
// pipelined fetch of batches and advance of the cursor, and maintenance.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/event.hpp"
#include "pg_outbox/extension.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/pg.hpp"
#include "pg_outbox/position.hpp"

namespace pg_outbox {

// Raised when the session no longer leads its group (a standby took over:
// SQLSTATE OB003).
struct LostLeadership {};

// Raised when outbox_rewind() moved the group's cursor while this session
// led it (SQLSTATE OB002): what was read ahead of the old cursor, and the
// positions not yet advanced to, no longer count.
struct GroupRewound {
    std::string message;
};

// Raised when the group's next event can never be published (SQLSTATE
// OB004): its payload and headers print as more JSON text than any event
// may, and every fetch refuses it, cheaply, until an admin passes it with
// outbox_skip(). The events before it were returned and published.
struct EventTooLarge {
    std::string position;  // as the server named it ("" if it could not be read)
    std::string message;   // the server's error, with its detail and hint
};

// The position an OB004 error names ("event at position 1785-3 of group
// ..."), or "" when the message has none.
std::string too_large_position(const std::string& message);

// What the group recorded as published: the last position per stream, and
// its cursor.
struct PublishedStreams {
    std::map<std::string, Position> streams;
    std::optional<Position> cursor;
};

// The refusals of a sharded group named without its shard, and of a
// stream template without {shard} for a sharded group: shards writing one
// stream would each refuse the other's entries as already present.
ConfigError sharded_group_without_shard(const std::string& group, int shards);
ConfigError template_without_shard(const std::string& stream_template, const std::string& name, int shards);

class GroupSession {
public:
    GroupSession(const Config& config, Metrics& metrics);

    // A new connection: the lease, LISTEN, and the prepared statements.
    // The connection and the extension found on it must outlive their use
    // here, until reset().
    void connected(PgConnection& pg, const Extension& extension);
    // The connection is gone: its leadership, what it read ahead and what
    // it had not advanced to go with it.
    void reset();

    // Takes the group's leadership if no other session holds it; logs once
    // which session does while this one stands by.
    bool lead();
    // Stands by after LostLeadership: the results still queued and the
    // batch read ahead are dropped.
    void stand_by();
    // After GroupRewound: nothing read ahead or unadvanced counts.
    void rewound();
    // Advances the cursor as far as Redis acknowledged, then resigns.
    void resign();

    // Fetching. The server sleeps in outbox_fetch() for a commit instead
    // of this relay waiting for a notification (pg_outbox preloaded).
    bool sleeps_in_fetch() const { return sleeps_in_fetch_; }
    // The batch read ahead, if any (taken: the next take is empty). What
    // it says of the lag counts when it is taken: it was read while the
    // batch before it was being written, which may fail.
    std::vector<Event> take_prefetched();
    void drop_prefetched();
    // Drops what Redis acknowledged but the cursor was not advanced to: it
    // is fetched and written again (a replay Redis refuses as present).
    void forget_unadvanced() { unadvanced_.reset(); }
    // The next batch after the last one Redis acknowledged, advanced or not.
    std::vector<Event> fetch() {
        send_next_fetch();
        return receive_fetch();
    }
    // Asks for a notification (the next committing emitter sends one) and
    // looks once more for what committed before the request, in the same
    // round trip.
    std::vector<Event> fetch_asking_for_wakeup();
    // Reads ahead the batch after "after" (the batch still being written
    // to Redis); receive_prefetch() keeps it for take_prefetched(). A read
    // ahead that meets an event too large to publish is dropped: the write
    // goes on, and the fetch after it reports the event (EventTooLarge).
    void send_prefetch(const std::string& after) { send_fetch(&after); }
    void receive_prefetch();
    // A batch written and done with: the next one is unpacked into its
    // events' strings, which then need no allocation. A field of more than
    // 64 KB gives its memory back rather than keep it.
    void recycle(std::vector<Event> events);
    // Reads ahead with the server sleeping up to "wait" for a commit.
    void prefetch_waiting(std::chrono::milliseconds wait) {
        send_next_fetch(wait);
        prefetched_.events = receive_fetch();
    }

    // The cursor advance of the batches Redis acknowledged: recorded, sent
    // with a next fetch when due, or alone when the feed runs dry.
    bool advance_due() const;
    bool has_unadvanced() const { return unadvanced_.has_value(); }
    std::chrono::steady_clock::time_point next_advance_at() const;
    void record_published(const std::string& position, std::map<std::string, std::string> streams);
    void send_advance();
    void receive_advance();
    void flush_advance() {
        send_advance();
        receive_advance();
    }
    // After a batch failed while the advance and the next fetch were in
    // flight, or after they were received: reads what is still queued and
    // drops it, whatever it says, with the batch read ahead.
    void settle_pipeline();
    // Reads and drops the results still queued on the connection.
    void discard_queued();

    // The group's record of what it published; nullopt when the group is
    // gone.
    std::optional<PublishedStreams> published_streams();
    // Moves the group's cursor back to "to" (below "cursor").
    void rewind(const Position& cursor, const Position& to);

    // Partition maintenance, unless a background worker runs it; while
    // there is a backlog it waits for the feed to run dry ("idle"), for
    // one more interval at most.
    void maybe_maintain(bool idle);

private:
    void check_shards();
    // Refuses (ConfigError) a --stream other than the template the group
    // recorded.
    void check_template(std::string_view recorded) const;
    // Records the --stream template when the group has none, and checks
    // it against the group's; false when this session no longer leads.
    bool record_template();
    void send_fetch(const std::string* after, std::chrono::milliseconds wait = std::chrono::milliseconds(0));
    void send_next_fetch(std::chrono::milliseconds wait = std::chrono::milliseconds(0)) {
        send_fetch(unadvanced_ ? &unadvanced_->first : nullptr, wait);
    }
    std::vector<Event> receive_fetch();
    // A fetch's batch, and the lag and stall metrics it implies.
    PackedBatch receive_batch();
    void note_lag(const PackedBatch& batch);
    PackedBatch unpack_fetch(const PgResult& result);
    void size_next_fetch(std::size_t received);

    const Config& config_;
    Metrics& metrics_;
    PgConnection* pg_ = nullptr;  // between connected() and reset()
    const Extension* extension_ = nullptr;
    // A statement of the relay's, qualified with the extension's schema.
    std::string sql(const char* statement) const;
    // Whether "standing by" was logged since this session last led.
    bool standing_by_ = false;
    bool sleeps_in_fetch_ = false;
    // The batch fetched while the previous one was being written to Redis.
    PackedBatch prefetched_;
    bool prefetched_unnoted_ = false;  // its lag not yet noted
    std::vector<Event> spare_;         // see recycle()
    // The last position Redis acknowledged, not yet sent to the cursor.
    std::optional<std::pair<std::string, std::map<std::string, std::string>>> unadvanced_;
    bool advance_sent_ = false;
    std::chrono::steady_clock::time_point advance_sent_at_{};
    std::chrono::steady_clock::time_point fetch_sent_{};
    int fetch_size_ = 0;       // events the next fetch asks for (size_next_fetch)
    int fetch_size_sent_ = 0;  // and the one in flight
    bool fetch_waits_ = false;  // the fetch in flight may sleep in the server
    std::chrono::steady_clock::time_point next_maintain_{};
};

}  // namespace pg_outbox
