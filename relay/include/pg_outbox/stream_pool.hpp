// Consume --pool: the streams of a consumer group shared out among its
// workers, each stream read by one live worker at a time.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/redis.hpp"

namespace pg_outbox {

// A worker holds a stream through a lease in Redis: a key per (consumer
// group, stream) set to the worker's token with SET NX PX --pool-lease,
// renewed every --pool-renew by a script that extends it only while it
// still holds the token, and deleted the same way when the worker lets
// the stream go. The live workers are the members of a sorted set scored
// by when their heartbeat runs out (Redis's clock); a worker takes streams
// up to its share, ceil(streams / live workers), and lets go of those
// beyond it, so that workers joining get their share. A dead worker's
// leases and heartbeat run out after --pool-lease, and the others take
// its streams.
//
// The worker's own deadline for each hold is measured from before the
// command that set or renewed it was sent: it passes before the key runs
// out in Redis, so a worker paused past its lease (SIGSTOP, a long GC-like
// stall, a network partition) knows on waking that it holds nothing, and
// reads and applies nothing more of those streams. What it had sent to
// PostgreSQL before the pause commits; the inbox recognises those events
// when the next owner applies them again.
//
// Each key is one command on its own key, routed by that key in a Redis
// Cluster: a lease need not share its stream's slot.
class StreamPool {
public:
    using Clock = std::chrono::steady_clock;
    // Runs a command on the server of "key" (the connection, or the
    // cluster's master of its slot); an error reply throws RedisError.
    using Command = std::function<RedisReply(std::string_view key, const std::vector<std::string_view>& argv)>;

    StreamPool(const Config& config, Metrics& metrics, Command command);

    // The lease key of a stream and the heartbeat key of a consumer
    // group: "pg_outbox:pool:<length of group>:<group>:lease:<stream>" and
    // "pg_outbox:pool:<length of group>:<group>:workers" (the length keeps
    // any group and stream names apart).
    static std::string lease_key(std::string_view group, std::string_view stream);
    static std::string workers_key(std::string_view group);

    // Whether a renewal is due.
    bool due() const { return Clock::now() >= next_; }
    // Drops holds past their deadline, beats the heartbeat, renews the
    // holds, lets go of those beyond the share and takes streams up to
    // it. Returns the streams just taken: their previous owner's pending
    // entries are to be settled before anything new is read. The first
    // call only makes the worker seen, so that workers started together
    // share at once.
    std::vector<std::string> maintain();
    // Whether this worker holds the stream now (its deadline is ahead).
    bool holds(std::string_view stream) const;
    // The streams held now, in the order of --stream.
    std::vector<std::string> held() const;
    // At a clean exit: lets go of every stream and leaves the heartbeat.
    void leave();
    const std::string& token() const { return token_; }

private:
    struct Hold {
        std::string stream;
        Clock::time_point deadline;
    };
    void lost(const Hold& hold, const char* why);
    void release(const Hold& hold);

    const Config& config_;
    Metrics& metrics_;
    Command command_;
    std::string token_;  // "<worker>#<random>": unique per process
    std::string workers_key_;
    std::vector<Hold> holds_;  // in the order taken
    bool joined_ = false;
    Clock::time_point next_{};
};

}  // namespace pg_outbox
