// Publish mode over one group or several: the --group list expanded and
// checked against the database, and a Publisher for each group or shard,
// in a thread of its own when there are several.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "pg_outbox/config.hpp"

namespace pg_outbox {

// A row of outbox_groups(): a group of one shard (shards 1, shard 0), or one
// shard of a sharded group.
struct GroupRow {
    std::string name;
    int shard = 0;
    int shards = 1;
};

// The --group list ("groups", checked by parse_command_line) as the
// publishers to run, in the order given: "<group>/*" becomes every shard
// of the group, <group>/0 to <group>/<N-1> (the group's name alone when it
// has one shard). Throws ConfigError, naming the item, when one names a
// group that "rows" (outbox_groups()) lacks, a shard the group does not
// have, a sharded group without its shard, or a group or shard that
// another item names too ("orders/1" and "orders/*"; "g" and "g/0", the
// one shard of g); and when a sharded group is served with a stream
// template ("stream_template") without {shard}.
std::vector<std::string> expand_groups(const std::vector<std::string>& groups, const std::vector<GroupRow>& rows,
                                       const std::string& stream_template);

// Whether the --group list needs the database before anything starts:
// several items, or "<group>/*".
bool needs_group_lookup(const std::vector<std::string>& groups);

// Runs publish mode until "stop" is set (SIGTERM, SIGINT), and returns the
// exit code. One group or shard, as --group names it: a Publisher in the
// calling thread, as it always was (0 stopped, 1 a fatal error, 2 a
// setting that cannot work). Several (see needs_group_lookup): the list is
// read from outbox_groups() first (expand_groups; connection failures are
// retried until stopped), then each group or shard runs in a thread of its
// own with its own connections, leadership, backoff and metrics, and logs
// with its name (set_log_context). A fatal error of one group (exit 1 for
// a relay of one group) ends that group's run alone: it is logged, /health
// fails naming it, and the group starts again after --retry-max while the
// others go on. A setting that cannot work (ConfigError) in any group
// stops them all (each finishes its batch and resigns) and exits 2. Serves
// /metrics and /health for every group when --metrics-address is set.
int run_publish(const Config& config, std::atomic<bool>& stop);

}  // namespace pg_outbox
