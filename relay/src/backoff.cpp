#include "pg_outbox/backoff.hpp"

#include <algorithm>

namespace pg_outbox {

std::chrono::milliseconds Backoff::next() {
    const auto shift = std::min(attempt_, 30);
    const auto base = std::min<std::int64_t>(max_.count(), min_.count() * (std::int64_t{1} << shift));
    ++attempt_;
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    return std::chrono::milliseconds(std::max<std::int64_t>(1, static_cast<std::int64_t>(base * jitter(rng_))));
}

}  // namespace pg_outbox
