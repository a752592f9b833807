// Consume mode: each turn retries what is held, settles the streams a
// pool's worker just took, reclaims pending entries when due, and reads
// new ones. The StreamReader talks to Redis, the InboxSession to
// PostgreSQL; this class owns the loop, the held entries and the pool.
#include "pg_outbox/consumer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <iterator>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/sqlstates.hpp"

namespace pg_outbox {

Consumer::Consumer(const Config& config, Metrics& metrics, const std::atomic<bool>& stop)
    : Service(config, metrics, stop, "pg_outbox_relay consume " + config.consumer),
      reader_(config, metrics, stop),
      session_(config, metrics, *this),
      drainer_(config, metrics, session_),
      hold_backoff_(config.retry_min, config.retry_max) {
    for (const auto& stream : config_.streams) metrics_.add_gap_stream(stream);
    spdlog::info("consumer \"{}\" (worker \"{}\", group \"{}\") reading {} stream(s) from {}", config_.consumer,
                 config_.worker, config_.consumer_group, config_.streams.size(), config_.redis.to_string());
    spdlog::info("on failure: {}", config_.on_failure == OnFailure::park_key
                                       ? "park-key (a key whose entry fails waits behind it; inbox_parked_keys())"
                                       : "skip (an entry failing --max-deliveries times is dead-lettered and its "
                                         "key goes on)");
    if (config_.on_failure == OnFailure::park_key && !config_.pool)
        spdlog::warn("--on-failure park-key without --pool: every worker honours the parked keys, but with several "
                     "workers reading a stream, or a worker that crashes between applying a part of a batch and "
                     "parking its key, a key's later entry may apply before its failed one; use --pool, or one "
                     "worker per stream");
    if (config_.pool) {
        pool_.emplace(config_, metrics_, [this](std::string_view key, const std::vector<std::string_view>& argv) {
            return reader_.command(key, argv, "pool");
        });
        spdlog::info("pool: each stream read by one live worker at a time (lease {} ms, renewed every {} ms)",
                     config_.pool_lease.count(), config_.pool_renew.count());
    }
}

std::vector<std::string> Consumer::reading() const {
    if (!pool_) return config_.streams;
    std::vector<std::string> out;
    for (auto& s : pool_->held())
        if (!unsettled_.count(s)) out.push_back(std::move(s));
    return out;
}

void Consumer::keep_pool() {
    if (!pool_ || !pool_->due()) return;
    for (auto& s : pool_->maintain()) unsettled_.insert(std::move(s));
}

void Consumer::wait(std::chrono::milliseconds d) {
    if (!pool_) return pause(d);
    // In steps of --pool-renew at most, renewing in between.
    while (d.count() > 0 && !stop_) {
        const auto step = std::min(d, config_.pool_renew);
        pause(step);
        d -= step;
        keep_pool();
    }
}

void Consumer::on_stop() {
    // Without a connection the holds run out after --pool-lease.
    if (pool_ && reader_.reachable()) pool_->leave();
}

void Consumer::on_redis_connected() { reader_.reset(redis_.get()); }

void Consumer::on_redis_fault() {
    // A cluster's nodes are connected to again; a failover under a
    // Sentinel address: the next connection is to the new master.
    reset_redis_after_fault();
    reader_.reset(redis_.get());
}

void Consumer::on_pg_connected() { session_.connected(*pg_, extension_); }

void Consumer::on_pg_lost() { session_.reset(); }

void Consumer::settled(const std::vector<const StreamEntry*>& entries) { reader_.ack(entries); }

void Consumer::held(const StreamEntry& e, std::string_view sqlstate, std::string_view message) {
    // A lost stream's entry is its next owner's: claiming it back would
    // let that owner read past it.
    if (lost(e.stream)) return;
    reader_.release(e);
    if (held_.entries.empty()) {
        held_.sqlstate = std::string(sqlstate);
        held_.message = std::string(message);
        held_.fault = classify_sqlstate(sqlstate) == Fault::transient ? Fault::transient : Fault::configuration;
    }
    held_.entries.push_back(e);
}

void Consumer::record_gap(const Gap& gap) {
    StreamEntry range;
    range.stream = gap.stream;
    range.id = gap.range();
    if (auto fault = session_.dead_letter(range, gap.reason(), std::nullopt))
        spdlog::error("stream \"{}\": the gap {} could not be dead-lettered: {} (SQLSTATE {})", gap.stream,
                      gap.range(), fault->second, fault->first);
}

void Consumer::record_deleted(const std::string& stream, const std::string& id) {
    StreamEntry gone;
    gone.stream = stream;
    gone.id = id;
    spdlog::error("entry {} of stream \"{}\" was deleted from the stream before it was applied", gone.id, stream);
    const std::string reason = "entry was deleted from the stream (trimmed) before it was applied";
    // A plain dead letter, unless it was a parked key's failed entry (the
    // key is then dead, its dead letter made of the fields kept).
    const auto record = session_.park_key(gone, reason, std::nullopt, true);
    if (record.fault)
        spdlog::error("entry {} of stream \"{}\" could not be dead-lettered: {} (SQLSTATE {})", gone.id, stream,
                      record.fault->second, record.fault->first);
}

// Claims the pending entries of workers that died or hang (idle longer
// than --min-idle; this worker's own failed entries included), looping on
// XAUTOCLAIM's cursor, and applies them. Entries trimmed from the stream
// while pending come back as deleted ids and become dead letters.
void Consumer::reclaim() {
    const auto min_idle = std::to_string(config_.min_idle.count());
    double oldest_idle = 0;
    for (const auto& stream : reading()) oldest_idle = std::max(oldest_idle, reclaim_stream(stream, min_idle));
    metrics_.pending_oldest_idle_seconds = oldest_idle;
}

double Consumer::reclaim_stream(const std::string& stream, const std::string& min_idle) {
    std::string cursor = "0-0";
    do {
        auto page = reader_.claim(stream, min_idle, cursor);
        if (!page) break;
        cursor = std::move(page->cursor);
        for (const auto& id : page->deleted) record_deleted(stream, id);
        if (page->entries.empty()) continue;
        reader_.count_deliveries(stream, page->entries);
        apply(page->entries);
    } while (cursor != "0-0" && !stop_ && !lost(stream));
    report_trimmed_unread(stream);
    return reader_.oldest_pending_idle(stream);
}

// A range trimmed from the stream before this group read it becomes one
// dead letter, so that a loss is reported, never silent (republish it from
// the producer's outbox with outbox_rewind if it matters); the group then
// moves past it, so that it is reported once.
void Consumer::report_trimmed_unread(const std::string& stream) {
    const auto trimmed = reader_.trimmed_unread(stream);
    if (!trimmed) return;
    StreamEntry range;
    range.stream = stream;
    range.id = trimmed->range();
    if (auto fault = session_.dead_letter(range, trimmed->reason(), std::nullopt)) {
        spdlog::error("stream \"{}\": the trimmed range could not be dead-lettered, reported again at the next "
                      "reclaim: {} (SQLSTATE {})",
                      stream, fault->second, fault->first);
        return;
    }
    reader_.skip_trimmed(*trimmed);
}

void Consumer::apply(const std::vector<StreamEntry>& entries) {
    session_.begin_apply();
    // Calls of at most kMaxCallBytes, each acknowledged after its commit.
    std::vector<const StreamEntry*> call;
    std::size_t call_bytes = 0;
    // With --pool, checked before each call: a stream lost meanwhile (the
    // worker was paused past its lease) is applied no further.
    auto drop_lost = [&](std::vector<const StreamEntry*>& list) {
        const auto kept =
            std::remove_if(list.begin(), list.end(), [&](const StreamEntry* e) { return lost(e->stream); });
        if (kept == list.end()) return;
        spdlog::warn("pool: {} entries of streams this worker lost are left to their next owner",
                     std::distance(kept, list.end()));
        list.erase(kept, list.end());
    };
    auto flush = [&] {
        keep_pool();  // a long batch keeps its holds
        drop_lost(call);
        if (call.empty()) return;
        std::vector<const StreamEntry*> done;
        session_.apply(call, done);
        settled(done);
        call.clear();
        call_bytes = 0;
    };
    std::vector<const StreamEntry*> done;
    std::size_t next = 0;
    try {
        for (; next < entries.size(); ++next) {
            const auto& e = entries[next];
            if (lost(e.stream)) continue;
            if (auto fault = framing_fault(e)) {
                session_.malformed(e, fault->first, fault->second, done);
                continue;
            }
            const auto bytes = e.bytes();
            if (!call.empty() && call_bytes + bytes > kMaxCallBytes) flush();
            call.push_back(&e);
            call_bytes += bytes;
        }
        flush();
    } catch (const PgError& e) {
        // The connection was lost or the server is restarting: the call
        // that failed and every entry after it are held, and applied
        // first, in their order, once the connection is back. Left
        // pending, they would be reclaimed only after --min-idle, behind
        // newer entries of the same keys.
        if (!e.retryable()) throw;
        const std::string sqlstate = classify_sqlstate(e.sqlstate()) == Fault::transient ? e.sqlstate() : "08006";
        for (const auto* entry : call) held(*entry, sqlstate, pg_error_line(e.what()));
        for (std::size_t i = next; i < entries.size(); ++i)
            if (!lost(entries[i].stream)) held(entries[i], sqlstate, pg_error_line(e.what()));
        settled(done);
        throw;
    }
    settled(done);
}

void Consumer::turn() {
    keep_pool();
    if (!held_.entries.empty()) {
        // Entries held after a configuration or transient fault: nothing
        // else is read until they apply, dead-letter or stay pending.
        if (!held_on_new_session_) {
            const auto delay = hold_backoff_.next();
            const bool first = hold_backoff_.attempt() == 1;
            if (held_.sqlstate == sqlstate::kParkLimitReached) {
                // Parking is refused past the consumer's park_limit: the
                // worker stops here, loudly, rather than apply a parked
                // key's entry out of order or drop it.
                metrics_.count_error("park_limit");
                metrics_.set_park_limit("consumer \"" + config_.consumer + "\": " + held_.message +
                                        "; nothing is acknowledged until a parked key is redriven or skipped, or "
                                        "park_limit is raised");
            } else {
                metrics_.count_error(held_.fault == Fault::transient ? "pg_transient" : "pg_configuration");
            }
            if (first || held_.fault == Fault::configuration)
                spdlog::log(first ? spdlog::level::err : spdlog::level::warn,
                            "{} fault: {} (SQLSTATE {}); {} entries held, nothing dead-lettered or acknowledged; "
                            "retrying in {} ms{}",
                            to_string(held_.fault), held_.message, held_.sqlstate, held_.entries.size(),
                            delay.count(), held_.fault == Fault::configuration ? " on a new session" : "");
            wait(delay);
            if (stop_) return;
            if (held_.fault == Fault::configuration) {
                // The handler may have changed the session it failed on (a
                // search_path, a role, a prepared statement, a transaction
                // state): the retry runs on a new one, made before the
                // next turn.
                held_on_new_session_ = true;
                drop_pg();
                return;
            }
        }
        held_on_new_session_ = false;
        auto retry = std::move(held_.entries);
        held_ = Held{};
        apply(retry);
        if (held_.entries.empty()) {
            hold_backoff_.reset();
            metrics_.clear_park_limit();
            spdlog::info("the fault is gone: the {} held entries went through", retry.size());
        }
        return;
    }
    reader_.ensure_groups();
    // A stream just taken: what its previous owner read and left pending
    // is applied first, in id order, whatever its idle time, so that each
    // key's events keep their order across the handover.
    bool settled_one = false;
    for (auto it = unsettled_.begin(); it != unsettled_.end() && held_.entries.empty() && !stop_;) {
        if (pool_->holds(*it)) {
            reclaim_stream(*it, "0");
            if (!held_.entries.empty()) break;  // retried first; the stream stays unsettled
            settled_one = true;
        }
        it = unsettled_.erase(it);
    }
    if (!held_.entries.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_claim_) {
        reclaim();
        next_claim_ = now + config_.claim_interval;
        // After the reclaim: a parked key's failed entry redelivered after a
        // lost acknowledgement is acknowledged before its key drains.
        if (held_.entries.empty()) drainer_.poll(reading());
    } else if (settled_one) {
        // A stream just taken may hold keys to drain.
        drainer_.poll(reading());
    }
    if (!held_.entries.empty()) return;
    // Parked keys that are draining, a step at a time within a budget, so
    // that the other keys keep flowing.
    const auto is_lost = [this](const std::string& stream) { return lost(stream); };
    drainer_.tick(is_lost, stop_);
    const auto names = reading();
    if (names.empty()) {
        // A pool's worker holding no stream (the others hold their share).
        pause(config_.block);
        return;
    }
    // A drain left for the next turn: no wait for new entries meanwhile.
    auto entries = reader_.read(names, [this](const Gap& gap) { record_gap(gap); }, !drainer_.due(is_lost));
    if (!entries.empty()) apply(entries);
}

}  // namespace pg_outbox
