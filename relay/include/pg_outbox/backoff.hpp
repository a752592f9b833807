// Exponential backoff with jitter between retries.
#pragma once

#include <atomic>
#include <chrono>
#include <random>

namespace pg_outbox {

class Backoff {
public:
    Backoff(std::chrono::milliseconds min, std::chrono::milliseconds max) : min_(min), max_(max) {}

    // The next delay: min * 2^attempt capped at max, times a random factor
    // in [0.5, 1.0] so that relays that failed together retry apart.
    std::chrono::milliseconds next();
    void reset() { attempt_ = 0; }
    int attempt() const { return attempt_; }

private:
    std::chrono::milliseconds min_;
    std::chrono::milliseconds max_;
    int attempt_ = 0;
    std::mt19937_64 rng_{std::random_device{}()};
};

// Sleeps for d, in short slices, unless "stop" is or becomes set.
void pause_unless_stopped(std::chrono::milliseconds d, const std::atomic<bool>& stop);

}  // namespace pg_outbox
