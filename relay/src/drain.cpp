// The drain of parked keys. A key parks at its first entry fault
// (--on-failure park-key): its later entries are stored in the consumer's
// database instead of applied. When the failed entry applies on a retry,
// or inbox_redrive / inbox_skip is called after its dead letter, the key
// is "draining": the relay that reads its stream applies the parked
// entries in their order, through its own handler and session, in steps
// of inbox_redrive_step() between its reads, so that the other keys keep
// flowing and no transaction stays open long. The SQL functions record
// nothing about a failure: the relay classifies it, as it classifies a
// live apply's, and records it through inbox_park_key().
#include "pg_outbox/drain.hpp"

#include <spdlog/spdlog.h>

#include "pg_outbox/errors.hpp"

namespace pg_outbox {

namespace {

// Qualified and typed as every statement of the relay's (see
// inbox_session.cpp).
constexpr const char* kParkedKeysSql =
    "SELECT stream, key_bytes, state, parked, deliveries "
    "FROM @extschema@.inbox_parked_keys($1::pg_catalog.text, $2::pg_catalog.text[])";
constexpr const char* kRedriveStepSql =
    "SELECT applied, dead_lettered, failed_entry_id, error_code, error_message, deliveries, key_state "
    "FROM @extschema@.inbox_redrive_step($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, "
    "$4::pg_catalog.bytea, $5::pg_catalog.int4)";

int to_int(std::string_view text) { return text.empty() ? 0 : std::stoi(std::string(text)); }

}  // namespace

std::vector<ParkedKey> InboxSession::parked_keys(const std::vector<std::string>& streams) {
    std::vector<const std::string*> names;
    names.reserve(streams.size());
    for (const auto& s : streams) names.push_back(&s);
    const auto r = pg_->exec(extension_->sql(kParkedKeysSql), {config_.consumer, pg_text_array(names)}, {0, 1});
    std::vector<ParkedKey> out;
    out.reserve(static_cast<std::size_t>(r.rows()));
    for (int i = 0; i < r.rows(); ++i) {
        ParkedKey k;
        k.stream = std::string(r.get(i, 0));
        auto key = pg_bytea_from_hex(r.get(i, 1));
        if (!key) throw PgError("inbox_parked_keys() returned a key_bytes that is not a bytea in hex", "XX000", false);
        k.key = std::move(*key);
        k.state = std::string(r.get(i, 2));
        k.parked = r.is_null(i, 3) ? 0 : std::stoll(std::string(r.get(i, 3)));
        k.deliveries = r.is_null(i, 4) ? 0 : to_int(r.get(i, 4));
        out.push_back(std::move(k));
    }
    return out;
}

DrainStep InboxSession::redrive_step(const std::string& stream, const std::string& key) {
    const auto r = pg_->exec(extension_->sql(kRedriveStepSql),
                             {config_.consumer, config_.handler, stream, key, std::to_string(kMaxDrainStepEntries)},
                             {0, 0, 0, 1, 0});
    DrainStep out;
    if (r.rows() == 0) return out;
    out.applied = r.is_null(0, 0) ? 0 : to_int(r.get(0, 0));
    out.dead_lettered = r.is_null(0, 1) ? 0 : to_int(r.get(0, 1));
    if (!r.is_null(0, 2)) out.failed_entry_id = std::string(r.get(0, 2));
    out.error_code = std::string(r.get(0, 3));
    out.error_message = std::string(r.get(0, 4));
    out.deliveries = r.is_null(0, 5) ? 0 : to_int(r.get(0, 5));
    if (!r.is_null(0, 6)) out.key_state = std::string(r.get(0, 6));
    return out;
}

Drainer::Drainer(const Config& config, Metrics& metrics, InboxSession& session)
    : config_(config), metrics_(metrics), session_(session) {}

void Drainer::poll(const std::vector<std::string>& reading) {
    if (reading.empty()) {
        metrics_.keys_parked = 0;
        keys_.clear();
        return;
    }
    std::vector<ParkedKey> parked;
    try {
        parked = session_.parked_keys(reading);
    } catch (const PgError& e) {
        if (e.retryable()) throw;
        metrics_.count_error("pg");
        spdlog::error("the parked keys could not be read, none drained until the next poll: {} (SQLSTATE {})",
                      pg_error_line(e.what()), e.sqlstate());
        return;
    }
    metrics_.keys_parked = static_cast<std::int64_t>(parked.size());
    std::map<Key, Due> next;
    const auto now = std::chrono::steady_clock::now();
    for (auto& k : parked) {
        if (k.state != "draining") continue;
        Key key{std::move(k.stream), std::move(k.key)};
        if (auto it = keys_.find(key); it != keys_.end()) {
            next.insert(keys_.extract(it));
        } else {
            spdlog::info("stream \"{}\": key {} is draining, {} parked entries to apply in order", key.first,
                         log_key(key.second), k.parked);
            next.emplace(std::move(key), Due{now, Backoff(config_.retry_min, config_.retry_max)});
        }
    }
    keys_ = std::move(next);
}

void Drainer::tick(const std::function<bool(const std::string&)>& lost, const std::atomic<bool>& stop) {
    if (keys_.empty()) return;
    const auto deadline = std::chrono::steady_clock::now() + kDrainTurnBudget;
    for (bool stepped = true; stepped;) {
        stepped = false;
        for (auto it = keys_.begin(); it != keys_.end();) {
            const auto now = std::chrono::steady_clock::now();
            if (stop || now >= deadline) return;
            if (it->second.next_at > now || lost(it->first.first)) {
                ++it;
                continue;
            }
            stepped = true;
            if (step(it->first, it->second))
                ++it;
            else
                it = keys_.erase(it);
        }
    }
}

bool Drainer::due(const std::function<bool(const std::string&)>& lost) const {
    const auto now = std::chrono::steady_clock::now();
    for (const auto& [key, d] : keys_)
        if (d.next_at <= now && !lost(key.first)) return true;
    return false;
}

bool Drainer::step(const Key& key, Due& due) {
    const auto& [stream, bytes] = key;
    const auto now = std::chrono::steady_clock::now();
    DrainStep s;
    try {
        s = session_.redrive_step(stream, bytes);
    } catch (const PgError& e) {
        if (e.retryable()) throw;
        // The step rolled back as a whole (a handler's fault outside its
        // subtransaction, a function missing): nothing applied, tried again
        // after a backoff.
        const auto delay = due.backoff.next();
        due.next_at = now + delay;
        metrics_.count_error(classify_sqlstate(e.sqlstate()) == Fault::configuration ? "pg_configuration" : "pg");
        spdlog::error("stream \"{}\": the drain of key {} failed, retrying in {} ms: {} (SQLSTATE {})", stream,
                      log_key(bytes), delay.count(), pg_error_line(e.what()), e.sqlstate());
        return true;
    }
    metrics_.entries_redriven += static_cast<std::uint64_t>(s.applied);
    metrics_.dead_letters += static_cast<std::uint64_t>(s.dead_lettered);
    due.redriven += s.applied;
    if (s.failed_entry_id) {
        const auto fault = classify_sqlstate(s.error_code);
        if (fault != Fault::entry) {
            // The same for every entry (the handler, its privileges) or
            // passing: the key stays draining, tried again after a backoff.
            const auto delay = due.backoff.next();
            due.next_at = now + delay;
            metrics_.count_error(fault == Fault::transient ? "pg_transient" : "pg_configuration");
            spdlog::error("stream \"{}\": the drain of key {} met a {} fault at entry {}, retrying in {} ms: {} "
                          "(SQLSTATE {})",
                          stream, log_key(bytes), to_string(fault), *s.failed_entry_id, delay.count(),
                          s.error_message, s.error_code);
            return true;
        }
        metrics_.events_failed++;
        StreamEntry failed;
        failed.stream = stream;
        failed.id = *s.failed_entry_id;
        failed.deliveries = std::max(1, s.deliveries);
        const bool dead = failed.deliveries >= config_.max_deliveries;
        const auto record = session_.park_key(failed, s.error_message, s.error_code, dead);
        if (record.fault) {
            const auto delay = due.backoff.next();
            due.next_at = now + delay;
            spdlog::error("stream \"{}\": entry {} of key {} failed in a drain ({}; SQLSTATE {}) and the failure "
                          "could not be recorded, retrying in {} ms: {} (SQLSTATE {})",
                          stream, failed.id, log_key(bytes), s.error_message, s.error_code, delay.count(),
                          record.fault->second, record.fault->first);
            return true;
        }
        if (record.state && *record.state == "draining") {
            due.next_at = now + config_.min_idle;
            spdlog::warn("stream \"{}\": entry {} of key {} failed in a drain (delivery {} of {}), tried again in "
                         "{} ms: {} (SQLSTATE {})",
                         stream, failed.id, log_key(bytes), failed.deliveries, config_.max_deliveries,
                         config_.min_idle.count(), s.error_message, s.error_code);
            return true;
        }
        spdlog::error("stream \"{}\": entry {} of key {} failed in a drain {} times, dead-lettered; the key is "
                      "parked ({}) from it on until inbox_redrive or inbox_skip: {} (SQLSTATE {})",
                      stream, failed.id, log_key(bytes), failed.deliveries, record.state.value_or("un-parked"),
                      s.error_message, s.error_code);
        return false;
    }
    due.backoff.reset();
    if (!s.key_state) {
        spdlog::info("stream \"{}\": key {} un-parked, {} entries redriven", stream, log_key(bytes), due.redriven);
        return false;
    }
    if (*s.key_state == "draining") {
        due.next_at = now;
        return true;
    }
    // Parked again (its head failed on a redrive, recorded by another
    // worker) or retrying: nothing to drain until it is draining again.
    return false;
}

}  // namespace pg_outbox
