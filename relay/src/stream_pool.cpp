#include "pg_outbox/stream_pool.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>

namespace pg_outbox {

namespace {

// Extends the lease while it holds this worker's token: 1, else 0.
constexpr const char* kRenewScript =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
// Deletes the lease while it holds this worker's token: 1, else 0.
constexpr const char* kReleaseScript =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
// Beats this worker's heartbeat (until now + ARGV[2] ms, Redis's clock),
// forgets the heartbeats that ran out, and counts the live workers.
constexpr const char* kHeartbeatScript =
    "local t = redis.call('TIME') "
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) "
    "redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1]) "
    "redis.call('PEXPIRE', KEYS[1], ARGV[2]) "
    "return redis.call('ZCARD', KEYS[1])";

std::string pool_prefix(std::string_view group) {
    return "pg_outbox:pool:" + std::to_string(group.size()) + ":" + std::string(group);
}

}  // namespace

std::string StreamPool::lease_key(std::string_view group, std::string_view stream) {
    return pool_prefix(group) + ":lease:" + std::string(stream);
}

std::string StreamPool::workers_key(std::string_view group) { return pool_prefix(group) + ":workers"; }

StreamPool::StreamPool(const Config& config, Metrics& metrics, Command command)
    : config_(config),
      metrics_(metrics),
      command_(std::move(command)),
      workers_key_(workers_key(config.consumer_group)) {
    std::random_device rd;
    char random[17];
    std::snprintf(random, sizeof random, "%08x%08x", rd(), rd());
    token_ = config_.worker + "#" + random;
    metrics_.pool = true;
}

bool StreamPool::holds(std::string_view stream) const {
    const auto now = Clock::now();
    return std::any_of(holds_.begin(), holds_.end(),
                       [&](const Hold& h) { return h.stream == stream && now < h.deadline; });
}

std::vector<std::string> StreamPool::held() const {
    std::vector<std::string> out;
    for (const auto& s : config_.streams)
        if (holds(s)) out.push_back(s);
    return out;
}

void StreamPool::lost(const Hold& hold, const char* why) {
    metrics_.pool_lost++;
    spdlog::warn("pool: lost stream \"{}\" ({}); reading it no more, its next owner settles what this worker left "
                 "pending",
                 hold.stream, why);
}

void StreamPool::release(const Hold& hold) {
    const auto key = lease_key(config_.consumer_group, hold.stream);
    command_(key, {"EVAL", kReleaseScript, "1", key, token_});
}

std::vector<std::string> StreamPool::maintain() {
    const auto ttl = std::to_string(config_.pool_lease.count());
    const auto now = Clock::now();
    // Holds past their deadline are gone whatever Redis says: the worker
    // was paused or cut off for longer than the lease.
    for (auto it = holds_.begin(); it != holds_.end();) {
        if (now < it->deadline) {
            ++it;
            continue;
        }
        lost(*it, "its lease ran out before it was renewed");
        release(*it);  // in case the key is still this worker's
        it = holds_.erase(it);
    }
    auto live_reply = command_(workers_key_, {"EVAL", kHeartbeatScript, "1", workers_key_, token_, ttl});
    const long long live = std::max(1LL, live_reply->integer);
    for (auto it = holds_.begin(); it != holds_.end();) {
        const auto key = lease_key(config_.consumer_group, it->stream);
        const auto sent = Clock::now();
        auto r = command_(key, {"EVAL", kRenewScript, "1", key, token_, ttl});
        if (r->integer == 1) {
            it->deadline = sent + config_.pool_lease;
            ++it;
            continue;
        }
        lost(*it, "another worker holds its lease");
        it = holds_.erase(it);
    }
    std::vector<std::string> taken;
    if (!joined_) {
        // Seen first, taking nothing: workers started together find each
        // other at their next renewal and each take their share.
        joined_ = true;
        spdlog::info("pool: worker \"{}\" joined consumer group \"{}\" ({} live workers, {} streams)", token_,
                     config_.consumer_group, live, config_.streams.size());
    } else {
        const auto streams = static_cast<long long>(config_.streams.size());
        const auto share = static_cast<std::size_t>((streams + live - 1) / live);
        while (holds_.size() > share) {
            const Hold last = holds_.back();
            holds_.pop_back();
            release(last);
            metrics_.pool_released++;
            spdlog::info("pool: released stream \"{}\" for a worker that joined ({} live workers, a share of {})",
                         last.stream, live, share);
        }
        // Each worker starts looking at its own place among the streams,
        // so that workers taking at once seldom race for the same one.
        const std::size_t n = config_.streams.size();
        const std::size_t start = n == 0 ? 0 : std::hash<std::string>{}(token_) % n;
        for (std::size_t i = 0; i < n && holds_.size() < share; ++i) {
            const auto& stream = config_.streams[(start + i) % n];
            if (std::any_of(holds_.begin(), holds_.end(), [&](const Hold& h) { return h.stream == stream; }))
                continue;
            const auto key = lease_key(config_.consumer_group, stream);
            const auto sent = Clock::now();
            auto r = command_(key, {"SET", key, token_, "NX", "PX", ttl});
            if (r->type != REDIS_REPLY_STATUS) continue;  // nil: another worker holds it
            holds_.push_back(Hold{stream, sent + config_.pool_lease});
            taken.push_back(stream);
            metrics_.pool_taken++;
            spdlog::info("pool: took stream \"{}\" ({} live workers, a share of {}); settling what its previous "
                         "owner left pending before reading it",
                         stream, live, share);
        }
    }
    metrics_.pool_streams_owned = static_cast<std::int64_t>(holds_.size());
    next_ = now + config_.pool_renew;
    return taken;
}

void StreamPool::leave() {
    for (const auto& h : holds_) {
        try {
            release(h);
            metrics_.pool_released++;
            spdlog::info("pool: released stream \"{}\" at exit", h.stream);
        } catch (const RedisError& e) {
            spdlog::warn("pool: could not release stream \"{}\" at exit ({}); it is taken over when its lease runs out",
                         h.stream, e.what());
        }
    }
    holds_.clear();
    metrics_.pool_streams_owned = 0;
    try {
        command_(workers_key_, {"ZREM", workers_key_, token_});
    } catch (const RedisError&) {
        // Its heartbeat runs out after --pool-lease.
    }
}

}  // namespace pg_outbox
