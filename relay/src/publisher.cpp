// Publish mode: each turn takes a batch from the GroupSession (read ahead
// during the previous write when there was one), has the StreamWriter
// write it, and records it for the next advance of the cursor, which
// travels with the next fetch while Redis writes.
#include "pg_outbox/publisher.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "pg_outbox/errors.hpp"

namespace pg_outbox {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The longest sleep in outbox_fetch(): a stop request waits for it.
constexpr std::chrono::milliseconds kFetchWaitSlice{100};

}  // namespace

Publisher::Publisher(const Config& config, Metrics& metrics, const std::atomic<bool>& stop)
    : Service(config, metrics, stop, "pg_outbox_relay publish " + config.group),
      session_(config, metrics),
      writer_(config, metrics, stop),
      lag_(config.pg_conninfo, config.group, config.stats_interval, metrics) {
    spdlog::info("publishing group \"{}\" to {} as {}", config_.group, config_.redis.to_string(),
                 config_.stream_template);
}

void Publisher::on_pg_connected() {
    session_.connected(*pg_, extension_);
    writer_.set_database(extension_.database);
    streams_checked_ = false;
}

void Publisher::on_redis_connected() {
    streams_checked_ = false;
    writer_.reset(*redis_);
}

void Publisher::on_pg_lost() {
    metrics_.redis_oom = false;  // what Redis refuses says nothing while standing by
    metrics_.clear_event_too_large();  // the next fetch says so again, if it still is
    session_.reset();
}

void Publisher::on_redis_fault() {
    // Unless the backlog is known to be empty, events wait from now on if
    // they did not already (a fault may come before any fetch, e.g. in the
    // check of the streams).
    if (metrics_.leader && metrics_.lag_events.load() != 0) metrics_.batch_waiting();
    writer_.fault();
    // What was read ahead of, or written after, the batch that failed is
    // fetched and written again.
    session_.drop_prefetched();
    session_.forget_unadvanced();
    streams_checked_ = false;
    // A node lost, a failover, a slot without a master: a cluster's nodes
    // are connected to again and its slot map read again; a failover under
    // a Sentinel address: the next connection is to the new master. The
    // stream-loss check runs first (below), each stream on its master.
    reset_redis_after_fault();
}

// Finds out whether Redis lost entries the group published: a stream
// whose last id is below the last position the group published to it
// (Redis flushed, restarted without its last writes, or failed over to a
// replica that was behind). The group then rewinds to the lowest such id
// and publishes again from the outbox; entries Redis still has are
// refused as already present. Every stream the group recorded (its most
// recently written ones, pg_outbox.max_group_streams) is checked when the
// relay starts leading, after each reconnect (after a Sentinel failover
// too: the new master may lack what the old one acknowledged) and when
// the append script reports a stream behind: "every". In between, each
// --stats-interval checks the next kStreamsCheckedPerInterval of them in
// turn, so that a group of many streams does not stall its publishing
// for a round trip per stream each interval: a stream deleted or trimmed
// while the connection stayed up is found within one round of shares.
void Publisher::check_streams(bool every) {
    next_check_ = std::chrono::steady_clock::now() + config_.stats_interval;
    if (config_.id_mode != IdMode::explicit_position) return;
    const auto published = session_.published_streams();
    if (!published) return;
    const auto& all = published->streams;
    std::map<std::string, Position> share;
    if (!every) {
        auto it = all.upper_bound(last_stream_checked_);
        while (share.size() < std::min(kStreamsCheckedPerInterval, all.size())) {
            if (it == all.end()) it = all.begin();
            last_stream_checked_ = it->first;
            share.insert(*it++);
        }
    }
    const auto rewind_to = writer_.check_streams(every ? all : share, every);
    spdlog::debug("checked {} of the {} streams group \"{}\" recorded for entries Redis lost",
                  every ? all.size() : share.size(), all.size(), config_.group);
    if (rewind_to && published->cursor && *rewind_to < *published->cursor)
        session_.rewind(*published->cursor, *rewind_to);
}

// Waits for a notification, the timeout or a stop request, whichever
// comes first.
void Publisher::wait(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!stop_) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
        if (left.count() <= 0) return;
        const auto slice = std::min(left, std::chrono::milliseconds(100));
        if (pg_) {
            if (pg_->wait_for_notification(slice) > 0) return;
        } else {
            std::this_thread::sleep_for(slice);
        }
    }
}

std::chrono::milliseconds Publisher::large_event_retry() const {
    return std::max(std::chrono::milliseconds(1), std::min(config_.retry_max, config_.lease / 3));
}

// A fetch refused the group's next event (OB004): its payload and headers
// print as more JSON text than any event may, and nothing after it is
// published until an admin passes it with outbox_skip(). Exiting would
// meet it again at each restart; this relay keeps the group and says so,
// the log with the command that passes it (once per position), /health
// and pg_outbox_relay_event_too_large while it lasts. The server refuses
// it before printing any of it, so that each later fetch costs little.
void Publisher::hold_at_large_event(const EventTooLarge& e) {
    metrics_.count_error("event_too_large");
    session_.drop_prefetched();
    const std::string position = e.position.empty() ? "<position>" : e.position;
    // The call an admin makes, its arguments written as SQL literals.
    const auto literal = [](const std::string& text) {
        std::string quoted = "'";
        for (const char c : text) quoted += c == '\'' ? std::string("''") : std::string(1, c);
        return quoted + "'";
    };
    const std::string skip = "outbox_skip(" + literal(config_.group) + ", " + literal(position) + ", '<reason>')";
    metrics_.set_event_too_large("the event at position " + position + " of group \"" + config_.group +
                                 "\" is too large to publish; nothing after it is published until an admin passes "
                                 "it with " + skip);
    if (large_event_logged_ == position) {
        spdlog::debug("group \"{}\" still holds at position {}: the event there is too large to publish", config_.group,
                      position);
        return;
    }
    large_event_logged_ = position;
    spdlog::error("group \"{}\" holds at position {}: the event there is too large to publish, and nothing after it "
                  "is published until an admin passes it with {} (a copy of it is kept in outbox.skipped_events); "
                  "fetching again every {} ms meanwhile. The server said: {}",
                  config_.group, position, skip, large_event_retry().count(), e.message);
}

void Publisher::passed_large_event() {
    if (!metrics_.event_too_large() && large_event_logged_.empty()) return;
    if (!large_event_logged_.empty())
        spdlog::info("group \"{}\" is past the event at position {} that was too large to publish", config_.group,
                     large_event_logged_);
    metrics_.clear_event_too_large();
    large_event_logged_.clear();
}

void Publisher::turn() {
    if (!metrics_.leader) {
        if (!session_.lead()) {
            wait(config_.poll_interval);
            return;
        }
        streams_checked_ = false;
    }
    // The append script found a stream behind: check every stream, and
    // rewind, before the next batch.
    if (writer_.take_stream_behind()) streams_checked_ = false;
    try {
        // Held at an event too large to publish: what was published before
        // it is advanced to (the cursor is then just before it, where
        // outbox_skip() expects it), and the fetch is tried again after a
        // pause, the lease renewed first (a refused fetch renews nothing).
        // outbox_skip() meanwhile makes the fetch refused once (OB002).
        if (metrics_.event_too_large()) {
            session_.flush_advance();
            pause(large_event_retry());
            if (stop_) return;
            if (!session_.lead()) throw LostLeadership{};
        }
        if (!streams_checked_ || std::chrono::steady_clock::now() >= next_check_) {
            session_.flush_advance();
            session_.drop_prefetched();
            check_streams(!streams_checked_);
            streams_checked_ = true;
        }
        session_.maybe_maintain(false);
        auto batch = session_.take_prefetched();
        // Nothing read ahead: fetch, unless the server sleeps in the fetch
        // below, which returns at once what is there.
        if (batch.empty() && !session_.sleeps_in_fetch()) {
            batch = session_.fetch();
            // About to sleep: ask for a notification, and look once more.
            if (batch.empty() && config_.listen) batch = session_.fetch_asking_for_wakeup();
        }
        if (batch.empty()) {
            passed_large_event();  // gone, if one was held: nothing waits
            // A relay keeping up with a trickle of commits runs dry many
            // times a second: the cursor still moves at most every
            // advance interval, and the sleep ends when it is due.
            auto sleep = config_.poll_interval;
            if (session_.advance_due())
                session_.flush_advance();
            else if (session_.has_unadvanced())
                sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::milliseconds>(
                                            session_.next_advance_at() - std::chrono::steady_clock::now()) +
                                            std::chrono::milliseconds(1));
            session_.maybe_maintain(true);
            if (session_.sleeps_in_fetch()) {
                // The server sleeps until a commit that emitted wakes it and
                // returns the batch then: one hop from the commit to the
                // rows, where a notification would wake this relay to send
                // a fetch. In slices, so that a stop request is seen.
                session_.prefetch_waiting(std::min(sleep, kFetchWaitSlice));
            } else {
                wait(sleep);
            }
            return;
        }
        const auto t0 = std::chrono::steady_clock::now();
        // While Redis writes this batch, PostgreSQL advances the cursor past
        // the previous ones (when an advance is due) and fetches the next,
        // which this relay reads and unpacks before Redis replies.
        if (session_.advance_due()) session_.send_advance();
        session_.send_prefetch(batch.back().position);
        StreamWriter::Written streams;
        try {
            streams = writer_.write(batch, [this] {
                session_.receive_advance();
                session_.receive_prefetch();
            });
        } catch (...) {
            session_.settle_pipeline();
            throw;
        }
        const auto t1 = std::chrono::steady_clock::now();
        metrics_.batches_published++;
        metrics_.batch_published();
        passed_large_event();
        session_.record_published(batch.back().position, std::move(streams));
        spdlog::debug("published {} events up to {} (redis {:.2f} ms, overlapped with the advance and next fetch; "
                      "turn {:.2f} ms)",
                      batch.size(), batch.back().position, metrics_.redis_rtt_seconds * 1000,
                      std::chrono::duration<double, std::milli>(t1 - t0).count() + seconds_since(t1) * 1000);
        session_.recycle(std::move(batch));
    } catch (const LostLeadership&) {
        passed_large_event();
        session_.stand_by();
        metrics_.redis_oom = false;
        spdlog::warn("group \"{}\" is led by another session now; standing by", config_.group);
    } catch (const GroupRewound& e) {
        // Published entries stay (their ids make a replay harmless); the
        // next fetch starts at the moved cursor, and the streams are
        // looked at again before it.
        session_.rewound();
        streams_checked_ = false;
        metrics_.rewinds_noticed++;
        spdlog::warn("{}; publishing from the moved cursor", e.message);
        passed_large_event();
    } catch (const EventTooLarge& e) {
        hold_at_large_event(e);
    }
}

void Publisher::on_stop() {
    if (!pg_ || !metrics_.leader) return;
    try {
        session_.resign();
    } catch (const PgError&) {
        // The connection is going away anyway, and the lock with it.
    } catch (const LostLeadership&) {
    } catch (const GroupRewound&) {
    }
}

}  // namespace pg_outbox
