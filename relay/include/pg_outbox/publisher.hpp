// Publish mode: a group's feed to Redis Streams.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>

#include "pg_outbox/group_session.hpp"
#include "pg_outbox/lag.hpp"
#include "pg_outbox/service.hpp"
#include "pg_outbox/stream_writer.hpp"

namespace pg_outbox {

// Orchestrates a turn: the GroupSession (PostgreSQL: leadership, fetch,
// advance) and the StreamWriter (Redis: the writes), overlapping the
// advance and the next fetch with the write of a batch; and waits when the
// feed runs dry.
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

    // Finds out whether Redis lost entries the group published, and
    // rewinds the group when it did: in every stream the group recorded,
    // or in the next share of them.
    void check_streams(bool every);
    // How many streams a check between the full ones looks at.
    static constexpr std::size_t kStreamsCheckedPerInterval = 100;
    void wait(std::chrono::milliseconds timeout);
    // The group's next event is too large to publish (EventTooLarge): says
    // so (the log once per position, health and a gauge while it lasts)
    // and holds there until an admin passes it with outbox_skip().
    void hold_at_large_event(const EventTooLarge& e);
    void passed_large_event();
    // How long a relay held at such an event waits between fetches: within
    // a third of the lease, which each wait ends by renewing.
    std::chrono::milliseconds large_event_retry() const;

    GroupSession session_;
    StreamWriter writer_;
    // Whether the streams were checked since the last (re)connection or
    // the last time this relay started leading.
    bool streams_checked_ = false;
    std::chrono::steady_clock::time_point next_check_{};
    // The position of the event too large to publish last logged.
    std::string large_event_logged_;
    // The last stream the shares checked, in the order of their names: the
    // next share starts after it.
    std::string last_stream_checked_;
    // The lag metric, measured on its own connection and thread.
    LagProbe lag_;
};

}  // namespace pg_outbox
