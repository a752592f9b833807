// Consume mode: stream entries applied through the inbox and a handler.
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "pg_outbox/backoff.hpp"
#include "pg_outbox/drain.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/inbox_session.hpp"
#include "pg_outbox/service.hpp"
#include "pg_outbox/stream_entry.hpp"
#include "pg_outbox/stream_pool.hpp"
#include "pg_outbox/stream_reader.hpp"

namespace pg_outbox {

// Orchestrates a turn: the StreamReader (Redis: reads, claims, gaps,
// acknowledgements) hands entries to the InboxSession (PostgreSQL: apply,
// dead letters), which tells what is settled (acknowledged) and what is
// held (retried after a backoff, first, before anything new is read);
// with --pool, only the streams this worker holds are read and applied.
class Consumer : public Service, private EntrySink {
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
    void on_pg_lost() override;
    void on_redis_connected() override;
    void on_redis_fault() override;

    // EntrySink: settled entries are acknowledged; a held entry is kept
    // for the retry, its delivery not counted.
    void settled(const std::vector<const StreamEntry*>& entries) override;
    void held(const StreamEntry& e, std::string_view sqlstate, std::string_view message) override;

    // Claims the pending entries of workers that died or hang, and applies
    // them.
    void reclaim();
    // Claims the stream's pending entries idle at least "min_idle" ms,
    // whoever's they are, in id order, and applies them; the idle time of
    // the oldest left pending, in seconds.
    double reclaim_stream(const std::string& stream, const std::string& min_idle);
    // Dead-letters what the reader found missing: a gap, entries deleted
    // while pending, a range trimmed unread (the group then moves past it).
    void record_gap(const Gap& gap);
    void record_deleted(const std::string& stream, const std::string& id);
    void report_trimmed_unread(const std::string& stream);
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
    // Applies entries (in calls of at most kMaxCallBytes, each one
    // transaction without a subtransaction per entry), then acknowledges
    // what is done: applied, duplicate, dead-lettered. Entries that met a
    // configuration or transient fault are held for retry.
    void apply(const std::vector<StreamEntry>& entries);

    StreamReader reader_;
    InboxSession session_;
    // The parked keys of the streams read, drained between reads.
    Drainer drainer_;
    // The held entries are retried on a new session: the one they failed on
    // was closed after a configuration fault (the handler may have changed
    // it: its search_path, its role).
    bool held_on_new_session_ = false;
    std::chrono::steady_clock::time_point next_claim_{};
    Held held_;
    Backoff hold_backoff_;
    // With --pool: the streams this worker holds, and those of them whose
    // previous owner's pending entries are still to be applied.
    std::optional<StreamPool> pool_;
    std::set<std::string> unsettled_;
};

}  // namespace pg_outbox
