// pg_outbox_testkit: the test kit's servers for shell scripts (the demo,
// the README test, the examples, the soak test, the benchmarks), so that
// they start PostgreSQL, Redis, Sentinel and a Redis Cluster the way the
// relay's tests do, from one implementation. A server started here is
// detached: it outlives this program, runs in the directory given, and is
// stopped by the PID the kit wrote there ("stop --dir").
//
// "start" prints shell assignments for eval (ports, PIDs, the Redis
// Cluster's URL); everything else it says goes to standard error.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "pg_outbox/testkit/servers.hpp"

namespace {

using namespace pg_outbox::testing;

constexpr const char* kUsage = R"(usage:
  pg_outbox_testkit start pg --dir DIR [--port PORT] [SETTING ...]
      initdb (as the postgres user when root) and pg_ctl start; listens on
      127.0.0.1:PORT and a socket in DIR; each SETTING is a postgresql.conf
      line. Prints PG_PORT, PG_PID.
  pg_outbox_testkit start redis --dir DIR [--port PORT] [-- REDIS_ARG ...]
      redis-server on 127.0.0.1:PORT without persistence unless the
      arguments say otherwise (a later argument overrides). Prints
      REDIS_PORT, REDIS_PID.
  pg_outbox_testkit start sentinel --dir DIR --master-port PORT [--master-name NAME]
      [--quorum N] [--port PORT] [LINE ...]
      redis-server --sentinel monitoring 127.0.0.1:PORT (name "mymaster",
      quorum 1 unless given); each LINE is a configuration line. Prints
      SENTINEL_PORT, SENTINEL_PID.
  pg_outbox_testkit start cluster --dir DIR [--masters N] [--replicas N]
      [--node-timeout MS] [-- REDIS_ARG ...]
      a Redis Cluster (3 masters, 1 replica each, node timeout 2000 ms
      unless given), node i in DIR/node<i>, every node with REDIS_ARGs;
      returns once every node says cluster_state:ok and replicas synced.
      Prints REDIS_CLUSTER_PORTS and REDIS_CLUSTER_PIDS (bash arrays,
      masters first as created), REDIS_CLUSTER_URL.
  pg_outbox_testkit stop --dir DIR
      stops every server started under DIR, by PID (PostgreSQL by a fast
      shutdown), and waits until they are gone.
  pg_outbox_testkit free-port
      prints a TCP port of 127.0.0.1 that nothing listens on.
)";

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A word as a shell reads it back: single-quoted.
std::string quote(const std::string& word) {
    std::string out = "'";
    for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

int to_int(const std::string& option, const std::string& value) {
    try {
        std::size_t used = 0;
        const int n = std::stoi(value, &used);
        if (used == value.size() && n >= 0) return n;
    } catch (const std::exception&) {
    }
    throw UsageError(option + " takes a number, not \"" + value + "\"");
}

int to_port(const std::string& option, const std::string& value) {
    const int port = to_int(option, value);
    if (port < 1 || port > 65535) throw UsageError(option + " takes a TCP port (1 to 65535), not " + value);
    return port;
}

// The options of "start" and "stop": --NAME VALUE pairs, then the rest
// (after "--", or from the first word that is no option).
struct Options {
    std::string dir;
    int port = 0;
    int master_port = 0;
    std::string master_name = "mymaster";
    int quorum = 1;
    int masters = 3;
    int replicas = 1;
    int node_timeout = 2000;
    std::vector<std::string> rest;
};

Options parse(const std::vector<std::string>& args) {
    Options o;
    std::size_t i = 0;
    for (; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "--") {
            ++i;
            break;
        }
        if (a.rfind("--", 0) != 0) break;
        if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
        const std::string& v = args[++i];
        if (a == "--dir")
            o.dir = v;
        else if (a == "--port")
            o.port = to_port(a, v);
        else if (a == "--master-port")
            o.master_port = to_port(a, v);
        else if (a == "--master-name")
            o.master_name = v;
        else if (a == "--quorum")
            o.quorum = to_int(a, v);
        else if (a == "--masters")
            o.masters = to_int(a, v);
        else if (a == "--replicas")
            o.replicas = to_int(a, v);
        else if (a == "--node-timeout")
            o.node_timeout = to_int(a, v);
        else
            throw UsageError("unknown option " + a);
    }
    o.rest.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
    if (o.dir.empty()) throw UsageError("--dir is required");
    return o;
}

Placement placement(const Options& o) { return Placement{o.dir, o.port, true}; }

void start(const std::string& kind, const Options& o) {
    if (kind == "pg") {
        PgServer pg(o.rest, placement(o));
        std::cout << "PG_PORT=" << pg.port() << "\nPG_PID=" << pg.pid() << "\n";
    } else if (kind == "redis") {
        RedisServer redis(false, o.rest, placement(o));
        std::cout << "REDIS_PORT=" << redis.port() << "\nREDIS_PID=" << redis.pid() << "\n";
    } else if (kind == "sentinel") {
        if (o.master_port == 0) throw UsageError("start sentinel needs --master-port");
        SentinelServer sentinel(o.master_name, o.master_port, o.quorum, std::chrono::milliseconds(1000),
                                std::chrono::milliseconds(4000), o.rest, placement(o));
        std::cout << "SENTINEL_PORT=" << sentinel.port() << "\nSENTINEL_PID=" << sentinel.pid() << "\n";
    } else if (kind == "cluster") {
        if (o.masters < 1) throw UsageError("--masters must be at least 1");
        Placement where = placement(o);
        where.port = 0;
        RedisClusterServers cluster(o.masters, o.replicas, std::chrono::milliseconds(o.node_timeout), o.rest,
                                    where);
        std::string ports, pids;
        for (std::size_t i = 0; i < cluster.size(); ++i) {
            ports += (i ? " " : "") + std::to_string(cluster.node(i).port());
            pids += (i ? " " : "") + std::to_string(cluster.node(i).pid());
        }
        std::cout << "REDIS_CLUSTER_PORTS=(" << ports << ")\nREDIS_CLUSTER_PIDS=(" << pids
                  << ")\nREDIS_CLUSTER_URL=" << quote(cluster.url()) << "\n";
    } else {
        throw UsageError("unknown server kind \"" + kind + "\" (pg, redis, sentinel or cluster)");
    }
}

}  // namespace

int main(int argc, char** argv) {
    const std::vector<std::string> args(argv + 1, argv + argc);
    try {
        if (args.size() == 1 && args[0] == "free-port") {
            std::cout << free_port() << "\n";
            return 0;
        }
        if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
            std::cout << kUsage;
            return 0;
        }
        if (args.size() >= 2 && args[0] == "start") {
            const Options o = parse({args.begin() + 2, args.end()});
            try {
                start(args[1], o);
            } catch (const UsageError&) {
                throw;
            } catch (const std::exception&) {
                // What started before the failure does not stay behind.
                stop_servers_in(o.dir);
                throw;
            }
            return 0;
        }
        if (args.size() >= 1 && args[0] == "stop") {
            const Options o = parse({args.begin() + 1, args.end()});
            if (!o.rest.empty()) throw UsageError("stop takes no arguments but --dir");
            stop_servers_in(o.dir);
            return 0;
        }
        throw UsageError(args.empty() ? "no command" : "unknown command \"" + args[0] + "\"");
    } catch (const UsageError& e) {
        std::cerr << "pg_outbox_testkit: " << e.what() << "\n" << kUsage;
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "pg_outbox_testkit: " << e.what() << "\n";
        return 1;
    }
}
