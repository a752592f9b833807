// The backlog of a group, measured for the lag metric, and who leads it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "pg_outbox/extension.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/pg.hpp"

namespace pg_outbox {

// Who leads a group, for a standby's log: "backend pid 4711 (client
// 10.0.0.5:53422, application "...")", from outbox_group_stats()'s
// leader_pid and pg_stat_activity (the client address shows only where
// the role may see it). Counts the group's backlog too: a standby calls it
// once. A PostgreSQL error other than a lost connection is described,
// not thrown.
std::string describe_leader(PgConnection& pg, const Extension& extension, const std::string& group);

// Counts the events a group has still to publish, every interval, on a
// PostgreSQL connection and in a thread of its own. Counting is O(backlog)
// (a quarter of a second and more at a million events), and the loop that
// publishes the backlog must not wait for it. Failures leave the last
// value in place and are retried at the next interval.
class LagProbe {
public:
    LagProbe(std::string conninfo, std::string group, std::chrono::milliseconds interval, Metrics& metrics);
    ~LagProbe();
    LagProbe(const LagProbe&) = delete;
    LagProbe& operator=(const LagProbe&) = delete;

private:
    void run();
    // One count; the connection is made again after a failure.
    void measure();

    const std::string conninfo_;
    const std::string group_;
    const std::chrono::milliseconds interval_;
    Metrics& metrics_;
    std::optional<PgConnection> pg_;  // used by the probe's thread only
    Extension extension_;              // found on pg_
    bool failing_ = false;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace pg_outbox
