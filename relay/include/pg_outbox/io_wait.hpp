// Bounded waits on a socket. Every wait of the relay on PostgreSQL or
// Redis (connect, write, read) goes through wait_socket() with a deadline,
// so that no wait outlasts its bound (--pg-timeout, --redis-timeout), and
// wakes at least every kStopSlice to look at the stop request, so that a
// stop request (SIGTERM) cuts every wait short within kStopGrace.
#pragma once

#include <atomic>
#include <chrono>

namespace pg_outbox {

// How long a wait may still go on once the process is asked to stop: long
// enough for a server that answers to finish the batch in flight, short
// enough for SIGTERM to be honoured within a second. The grace runs for
// the whole process: every wait after the stop request ends by the same
// instant; restart_stop_grace() gives the last words (the resignation)
// one more grace.
inline constexpr std::chrono::milliseconds kStopGrace{400};
// How often a wait looks at the stop request.
inline constexpr std::chrono::milliseconds kStopSlice{50};

// The process's stop request (set by the signal handling in main); the
// waits read it. Null (the default, and in tests that run the relay's
// classes in their own process): waits end on their deadline only.
void watch_stop_request(const std::atomic<bool>* stop);

// True once the stop request is set and its grace has run out.
bool stop_grace_over();

// Once the loops have stopped: the waits of what a relay does on its way
// out (advance the cursor, resign, leave the pool) get a grace of their
// own from now, so that a batch cut short by the first grace does not
// cost the resignation too. Nothing when no stop request is set.
void restart_stop_grace();

enum class WaitResult {
    ready,      // the socket has one of the events asked for (or an error)
    timed_out,  // the deadline passed
    stopping,   // the stop request's grace ran out
};

// Waits until fd has one of "events" (POLLIN, POLLOUT), the deadline
// passes, or the stop request's grace runs out.
WaitResult wait_socket(int fd, short events, std::chrono::steady_clock::time_point deadline);

}  // namespace pg_outbox
