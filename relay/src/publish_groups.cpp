// Publish mode over one group or several: one process, a thread per group
// or shard, each as a relay of one group would be.
#include "pg_outbox/publish_groups.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "pg_outbox/backoff.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/group_session.hpp"
#include "pg_outbox/log.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/pg.hpp"
#include "pg_outbox/publisher.hpp"
#include "pg_outbox/service.hpp"

namespace pg_outbox {

namespace {

// Every group and shard the database has (qualified and typed as every
// statement of the relay's, see group_session.cpp).
constexpr const char* kGroupsSql =
    "SELECT group_name, shard, shards FROM @extschema@.outbox_groups(NULL::pg_catalog.text) ORDER BY 1, 2";

std::string join(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
    return out;
}

// Reads the groups (outbox_groups()) and expands the --group list, on a
// connection of its own; a lost or refused connection is retried (with
// backoff) until the database answers or "stop" is set (then: an empty
// list). A setting
// libpq refuses, or a database without pg_outbox of this version, is a
// ConfigError; any other PostgreSQL error a PgError.
std::vector<std::string> lookup_groups(const Config& config, const std::atomic<bool>& stop) {
    spdlog::info("reading the groups of --group {} from PostgreSQL: {}", join(config.groups),
                 describe_conninfo(config.pg_conninfo));
    Backoff backoff(config.retry_min, config.retry_max);
    while (!stop) {
        try {
            std::optional<PgConnection> pg;
            try {
                pg.emplace(config.pg_conninfo, "pg_outbox_relay publish");
            } catch (const PgError& e) {
                if (is_settings_failure(e.what())) throw ConfigError(std::string("--pg: ") + e.what());
                throw;
            }
            const auto extension = use_extension(*pg, SearchPath::pin);
            const auto r = pg->exec(extension.sql(kGroupsSql));
            std::vector<GroupRow> rows;
            for (int i = 0; i < r.rows(); ++i)
                rows.push_back({std::string(r.get(i, 0)), std::stoi(std::string(r.get(i, 1))),
                                std::stoi(std::string(r.get(i, 2)))});
            return expand_groups(config.groups, rows, config.stream_template);
        } catch (const PgError& e) {
            if (!e.retryable()) throw;
            spdlog::warn("PostgreSQL: {}; retrying", e.what());
            pause_unless_stopped(backoff.next(), stop);
        }
    }
    return {};
}

// One group's or shard's thread: a Publisher, made anew after a fatal error
// of its own, until stopped or a setting cannot work (exit_code 2, and
// every group is asked to stop).
void run_group(const Config& config, Metrics& metrics, std::atomic<bool>& stop, std::atomic<int>& exit_code) {
    set_log_context(config.group);
    while (!stop) {
        std::string why;
        try {
            Publisher publisher(config, metrics, stop);
            if (publisher.run() == 0) return;
            why = publisher.fatal_error();
        } catch (const ConfigError& e) {
            spdlog::critical("{}", e.what());
            exit_code = 2;
            if (!stop.exchange(true))
                spdlog::critical(
                    "a setting cannot work: stopping every group (each finishes its batch), then exiting 2");
            return;
        } catch (const std::exception& e) {
            spdlog::critical("{}", e.what());
            why = e.what();
        } catch (...) {
            why = "an unexpected error";
            spdlog::critical("{}", why);
        }
        // Where a relay of one group would exit 1 (and its service manager
        // start it again), this group's run ends alone: its connections
        // are closed (a standby relay takes the group over), and it starts
        // again after --retry-max while the others go on.
        spdlog::error("stopped on a fatal error; starting again in {} ms, the other groups go on",
                      config.retry_max.count());
        metrics.leader = false;
        metrics.pg_connected = false;
        metrics.redis_connected = false;
        metrics.redis_oom = false;
        metrics.set_failed(why + "; starting again every " + std::to_string(config.retry_max.count()) + " ms");
        pause_unless_stopped(config.retry_max, stop);
        metrics.clear_failed();
    }
}

int run_threads(const Config& config, const std::vector<std::string>& groups, MetricsSet& metrics,
                std::atomic<bool>& stop) {
    spdlog::info("publishing {} groups or shards, a thread each: {}", groups.size(), join(groups));
    std::deque<Config> configs;  // each publisher's, named by its thread's group
    std::vector<std::thread> threads;
    std::atomic<int> exit_code{0};
    try {
        for (const auto& group : groups) {
            auto& own = configs.emplace_back(config);
            own.group = group;
            own.groups = {group};
            auto& own_metrics = metrics.add(group, config.stuck_after);
            threads.emplace_back(
                [&own, &own_metrics, &stop, &exit_code] { run_group(own, own_metrics, stop, exit_code); });
        }
    } catch (...) {
        stop = true;
        for (auto& t : threads) t.join();
        throw;
    }
    for (auto& t : threads) t.join();
    spdlog::info("every group stopped");
    return exit_code;
}

}  // namespace

bool needs_group_lookup(const std::vector<std::string>& groups) {
    return groups.size() > 1 ||
           std::any_of(groups.begin(), groups.end(), [](const std::string& g) { return is_every_shard(g); });
}

std::vector<std::string> expand_groups(const std::vector<std::string>& groups, const std::vector<GroupRow>& rows,
                                       const std::string& stream_template) {
    // The shard count of each group.
    std::map<std::string, int> shards;
    for (const auto& row : rows) shards[row.name] = std::max(shards[row.name], row.shards);
    auto count_of = [&](const std::string& item, const std::string& name) {
        const auto it = shards.find(name);
        if (it == shards.end())
            throw ConfigError("--group \"" + item + "\": group \"" + name +
                              "\" does not exist (create it with outbox_group_create(), or leave it out)");
        return it->second;
    };
    std::vector<std::string> out;
    // "<name>/<shard>" of each group or shard served, and the item naming it.
    std::map<std::string, std::string> named_by;
    auto add = [&](const std::string& group, const std::string& name, int shard, const std::string& item) {
        const auto key = name + "/" + std::to_string(shard);
        const auto [it, added] = named_by.emplace(key, item);
        if (!added)
            throw ConfigError(it->second == item
                                  ? "--group \"" + item + "\" is given twice; name each group or shard once"
                                  : "--group \"" + item + "\" names " + (group == item ? "" : "\"" + group + "\", ") +
                                        "a group or shard that \"" + it->second +
                                        "\" names too; name each group or shard once");
        out.push_back(group);
    };
    bool sharded = false;
    std::string sharded_name;
    int sharded_count = 0;
    for (const auto& item : groups) {
        std::string name;
        int shard = -1;
        if (is_every_shard(item, &name)) {
            const int n = count_of(item, name);
            if (n == 1) {
                add(name, name, 0, item);
                continue;
            }
            for (int s = 0; s < n; ++s) add(name + "/" + std::to_string(s), name, s, item);
            shard = 0;
        } else {
            split_group_name(item, name, shard);
            const int n = count_of(item, name);
            if (shard < 0 && n > 1) throw sharded_group_without_shard(item, n);
            if (shard >= n)
                throw ConfigError(
                    "--group \"" + item + "\": group \"" + name + "\" has no shard " + std::to_string(shard) +
                    (n == 1 ? "; it has one, named \"" + name + "\"" + " (or \"" + name + "/0\")"
                            : "; its shards are " + name + "/0 to " + name + "/" + std::to_string(n - 1)));
            add(item, name, std::max(shard, 0), item);
        }
        if (shards[name] > 1 && !sharded) {
            sharded = true;
            sharded_name = name;
            sharded_count = shards[name];
        }
    }
    if (sharded && stream_template.find("{shard}") == std::string::npos)
        throw template_without_shard(stream_template, sharded_name, sharded_count);
    return out;
}

int run_publish(const Config& config, std::atomic<bool>& stop) {
    // Declared before the endpoint, which reads it until it goes.
    MetricsSet metrics;
    try {
        std::unique_ptr<MetricsServer> server;
        if (config.metrics_address) server = std::make_unique<MetricsServer>(*config.metrics_address, metrics);
        if (!needs_group_lookup(config.groups)) {
            auto& own = metrics.add(config.group, config.stuck_after);
            return Publisher(config, own, stop).run();
        }
        const auto groups = lookup_groups(config, stop);
        if (groups.empty()) {
            spdlog::info("stopped");
            return 0;
        }
        if (groups.size() == 1) {
            // "<group>/*" of a group of one shard: a relay of one group.
            Config one = config;
            one.group = groups.front();
            one.groups = groups;
            auto& own = metrics.add(one.group, one.stuck_after);
            return Publisher(one, own, stop).run();
        }
        return run_threads(config, groups, metrics, stop);
    } catch (const ConfigError& e) {
        // A setting that cannot work, found at start-up.
        spdlog::critical("{}", e.what());
        return 2;
    } catch (const PgError& e) {
        spdlog::critical("PostgreSQL: {} (SQLSTATE {})", e.what(), e.sqlstate());
        return 1;
    } catch (const std::exception& e) {
        spdlog::critical("{}", e.what());
        return 1;
    }
}

}  // namespace pg_outbox
