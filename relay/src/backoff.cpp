#include "pg_outbox/backoff.hpp"

#include <algorithm>
#include <thread>

namespace pg_outbox {

std::chrono::milliseconds Backoff::next() {
    const auto shift = std::min(attempt_, 30);
    const auto base = std::min<std::int64_t>(max_.count(), min_.count() * (std::int64_t{1} << shift));
    ++attempt_;
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    return std::chrono::milliseconds(std::max<std::int64_t>(1, static_cast<std::int64_t>(base * jitter(rng_))));
}

void pause_unless_stopped(std::chrono::milliseconds d, const std::atomic<bool>& stop) {
    const auto until = std::chrono::steady_clock::now() + d;
    while (!stop && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::min(d, std::chrono::milliseconds(50)));
}

}  // namespace pg_outbox
