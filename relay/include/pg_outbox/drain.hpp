// The drain of parked keys: the relay that reads a stream applies the
// parked entries of its keys that are draining (their failed entry applied
// on a retry, or inbox_redrive / inbox_skip called), in steps between its
// reads, through its own handler.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "pg_outbox/backoff.hpp"
#include "pg_outbox/config.hpp"
#include "pg_outbox/inbox_session.hpp"
#include "pg_outbox/metrics.hpp"

namespace pg_outbox {

// Steps of inbox_redrive_step(), at most this many entries each (one
// transaction; after a failure, a subtransaction per entry up to it).
inline constexpr int kMaxDrainStepEntries = 64;
// A turn's drain stops taking steps after about this long, so that new
// entries of the other keys keep being read.
inline constexpr std::chrono::milliseconds kDrainTurnBudget{100};

// Which parked keys to drain, and when: poll() reads the parked keys of
// the streams the worker reads (every --claim-interval, and after a pool
// stream is settled); tick() runs steps of the draining ones that are due,
// within kDrainTurnBudget. A step's failure is recorded through
// inbox_park_key(): an entry fault retries after --min-idle and parks the
// key as dead after --max-deliveries; a configuration or transient fault
// backs off. Both modes drain (skip honours the parks made before).
class Drainer {
public:
    Drainer(const Config& config, Metrics& metrics, InboxSession& session);

    // Reads the parked keys of "reading", sets the keys_parked gauge and
    // schedules the draining keys (those scheduled already keep their
    // time; those no longer draining are forgotten). A retryable PgError
    // is thrown; any other error is logged and counted.
    void poll(const std::vector<std::string>& reading);
    // Runs the steps that are due, skipping the keys of streams "lost"
    // says this worker no longer holds; at most kDrainTurnBudget, or until
    // "stop". A retryable PgError is thrown (the key is tried again at the
    // next tick).
    void tick(const std::function<bool(const std::string&)>& lost, const std::atomic<bool>& stop);
    // Keys scheduled to drain, due or not.
    std::size_t scheduled() const { return keys_.size(); }
    // Whether a key of a stream not "lost" is due now (a drain left for
    // the next turn): the read then takes what is there without waiting
    // for more.
    bool due(const std::function<bool(const std::string&)>& lost) const;

private:
    struct Due {
        std::chrono::steady_clock::time_point next_at;
        Backoff backoff;
        long long redriven = 0;  // entries applied since it was scheduled, for the log
    };
    using Key = std::pair<std::string, std::string>;  // stream, key bytes

    // One step of a key; whether it may take another at once.
    bool step(const Key& key, Due& due);

    const Config& config_;
    Metrics& metrics_;
    InboxSession& session_;
    std::map<Key, Due> keys_;
};

}  // namespace pg_outbox
