// The one place where the relay waits on a network socket; see io_wait.hpp.
#include "pg_outbox/io_wait.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>

namespace pg_outbox {

namespace {

std::atomic<const std::atomic<bool>*> g_stop_request{nullptr};
// When a wait first saw the stop request (steady clock, in ns; 0: not yet).
std::atomic<std::int64_t> g_stop_seen_ns{0};

std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// The end of the stop request's grace, or max() while none is set.
std::chrono::steady_clock::time_point stop_deadline() {
    const auto* stop = g_stop_request.load();
    if (stop == nullptr || !stop->load()) return std::chrono::steady_clock::time_point::max();
    std::int64_t seen = g_stop_seen_ns.load();
    if (seen == 0) {
        const auto now = now_ns();
        g_stop_seen_ns.compare_exchange_strong(seen, now);
        if (seen == 0) seen = now;
    }
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(seen)) + kStopGrace;
}

}  // namespace

void watch_stop_request(const std::atomic<bool>* stop) { g_stop_request = stop; }

void restart_stop_grace() {
    const auto* stop = g_stop_request.load();
    if (stop != nullptr && stop->load()) g_stop_seen_ns = now_ns();
}

bool stop_grace_over() { return std::chrono::steady_clock::now() >= stop_deadline(); }

WaitResult wait_socket(int fd, short events, std::chrono::steady_clock::time_point deadline) {
    while (true) {
        const auto now = std::chrono::steady_clock::now();
        const auto stop_at = stop_deadline();
        if (now >= stop_at) return WaitResult::stopping;
        if (now >= deadline) return WaitResult::timed_out;
        const auto until = std::min({deadline, stop_at, now + kStopSlice});
        const auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
        pollfd pfd{fd, events, 0};
        const int rc = ::poll(&pfd, 1, static_cast<int>(std::max<std::int64_t>(ms, 1)));
        if (rc > 0) return WaitResult::ready;
        if (rc < 0 && errno != EINTR) return WaitResult::ready;  // the caller's next call reports the error
    }
}

}  // namespace pg_outbox
