// The soak test's faults on one Redis and on a Redis Cluster: each a
// named entry of a table, drawn by the seeded schedule (Soak::rng), each
// with the line it writes to faults.log. Remarks (a fault skipped, a
// cluster that did not fail over in time) go to shell.log.
#include <signal.h>

#include <algorithm>
#include <functional>
#include <sstream>

#include "pg_outbox/redis_cluster.hpp"
#include "soak.hpp"

namespace pg_outbox::soak {

namespace {

struct Fault {
    const char* name;
    std::function<void(Soak&)> run;
};

std::vector<std::string> split_words(const std::string& line) {
    std::vector<std::string> out;
    std::istringstream in(line);
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

bool has_flag(const std::string& flags, const std::string& flag) {
    std::istringstream in(flags);
    for (std::string f; std::getline(in, f, ',');)
        if (f == flag) return true;
    return false;
}

// The port of a CLUSTER NODES address, "127.0.0.1:port@bus".
int port_of(const std::string& address) {
    const auto colon = address.rfind(':', address.find('@'));
    if (colon == std::string::npos) return -1;
    try {
        return std::stoi(address.substr(colon + 1));
    } catch (const std::exception&) {
        return -1;
    }
}

void kill_and_restart(Soak& s, const std::string& name) {
    s.note("kill -9 " + name);
    s.signal(name, SIGKILL);
    nap(0.3);
    s.start(name);
}

void stop_and_continue(Soak& s, const std::string& name) {
    s.note("stop and continue " + name);
    s.signal(name, SIGSTOP);
    nap(2);
    s.signal(name, SIGCONT);
}

// Stops a relay that leads for three leases: the standby takes over, the
// old leader is fenced off when it comes back.
void hang(Soak& s, const std::string& name) {
    s.signal(name, SIGSTOP);
    nap(3);
    s.signal(name, SIGCONT);
}

void postgresql_restart(Soak& s) {
    s.note("postgresql fast restart");
    try {
        s.pg->restart();
    } catch (const std::exception& e) {
        s.remark(std::string("  the restart failed: ") + e.what());
    }
}

// The single-node faults, one every 1 to 4 seconds, in a random order.
const std::vector<Fault>& single_faults() {
    static const std::vector<Fault> table{
        {"kill a relay", [](Soak& s) { kill_and_restart(s, "relay" + std::to_string(1 + s.draw(2))); }},
        {"kill a worker", [](Soak& s) { kill_and_restart(s, "worker" + std::to_string(1 + s.draw(2))); }},
        {"stop a relay", [](Soak& s) { stop_and_continue(s, "relay" + std::to_string(1 + s.draw(2))); }},
        {"kill redis",
         [](Soak& s) {
             s.note("kill -9 redis, restart from its AOF");
             s.redis->kill();
             nap(0.5);
             s.redis->start();
         }},
        {"redis unreachable",
         [](Soak& s) {
             s.note("redis unreachable for 3s");
             s.redis->signal(SIGSTOP);
             nap(3);
             s.redis->signal(SIGCONT);
         }},
        {"postgresql restart", postgresql_restart},
        {"trim",
         [](Soak& s) {
             s.note("trim outbox:t1 below unread entries");
             s.signal("worker1", SIGSTOP);
             s.signal("worker2", SIGSTOP);
             nap(1.5);
             try {
                 auto c = s.redis->connect();
                 c.command({"XTRIM", "outbox:t1", "MAXLEN", "3"});
             } catch (const std::exception& e) {
                 s.remark(std::string("  XTRIM failed: ") + e.what());
             }
             s.signal("worker1", SIGCONT);
             s.signal("worker2", SIGCONT);
         }},
        {"maintenance",
         [](Soak& s) {
             s.note("maintenance");
             try {
                 s.query("soak", "SELECT count(*) FROM outbox_maintain()");
             } catch (const std::exception& e) {
                 s.remark(std::string("  maintenance failed: ") + e.what());
             }
         }},
        {"hung leader",
         [](Soak& s) {
             const auto n = s.leading_relay({"relay1", "relay2"});
             s.note("hung leader: stop the leading relay for 3 leases");
             hang(s, n);
         }},
    };
    return table;
}

}  // namespace

void Soak::fault() {
    const auto& table = single_faults();
    const auto i = static_cast<std::size_t>(draw(static_cast<int>(table.size()) + (opt.park ? 1 : 0)));
    if (i == table.size())
        key_fault();
    else
        table[i].run(*this);
}

// ---- the Redis Cluster

void Soak::cluster_fault() {
    static const std::vector<Fault> table{
        {"kill a relay", [](Soak& s) { kill_and_restart(s, s.relays[s.draw(static_cast<int>(s.relays.size()))]); }},
        {"stop a relay", [](Soak& s) { stop_and_continue(s, s.relays[s.draw(static_cast<int>(s.relays.size()))]); }},
        {"hung leader",
         [](Soak& s) {
             const auto shard = std::to_string(s.draw(2));
             const auto n = s.leading_relay({"relay" + shard + "a", "relay" + shard + "b"});
             s.note("hung leader: stop the leading relay of a shard for 3 leases");
             hang(s, n);
         }},
        {"postgresql restart", postgresql_restart},
        {"kill a master",
         [](Soak& s) {
             s.note("kill -9 a master, its replica takes over, it comes back as a replica");
             s.kill_master(false);
         }},
        {"kill a lagging master",
         [](Soak& s) {
             s.note("kill -9 a master behind a lagging replica (a tail of its streams is lost)");
             s.kill_master(true);
         }},
        {"reshard",
         [](Soak& s) {
             s.note("reshard 100 slots from a stream's master to another");
             s.reshard();
         }},
        {"migrate a slot",
         [](Soak& s) {
             s.note("migrate a stream's slot to another master");
             s.migrate_stream_slot();
         }},
    };
    const auto i = static_cast<std::size_t>(draw(static_cast<int>(table.size()) + (opt.park ? 1 : 0)));
    if (i == table.size())
        key_fault();
    else
        table[i].run(*this);
}

// A node that answers.
std::size_t Soak::cluster_port_index() {
    for (std::size_t i = 0; i < cluster->size(); ++i) {
        if (!cluster->node(i).running()) continue;
        try {
            auto c = cluster->node(i).connect();
            c.command({"PING"});
            return i;
        } catch (const std::exception&) {
        }
    }
    return 0;
}

std::string Soak::cluster_nodes() {
    auto c = cluster->node(cluster_port_index()).connect();
    return std::string(reply_text(c.command({"CLUSTER", "NODES"}).get()));
}

RedisConnection Soak::node_connection(int port) {
    const int i = node_index(port);
    if (i < 0) throw std::runtime_error("no cluster node on port " + std::to_string(port));
    return cluster->node(static_cast<std::size_t>(i)).connect();
}

int Soak::node_index(int port) {
    for (std::size_t i = 0; i < cluster->size(); ++i)
        if (cluster->node(i).port() == port) return static_cast<int>(i);
    return -1;
}

// The masters that are not failed and are connected: id and port.
std::vector<std::pair<std::string, int>> Soak::cluster_masters() {
    std::vector<std::pair<std::string, int>> out;
    std::istringstream in(cluster_nodes());
    for (std::string line; std::getline(in, line);) {
        const auto w = split_words(line);
        if (w.size() < 8) continue;
        if (has_flag(w[2], "master") && !has_flag(w[2], "fail") && w[7] == "connected")
            out.emplace_back(w[0], port_of(w[1]));
    }
    return out;
}

// The port of the master that serves a slot, -1 when none does.
int Soak::slot_master(int slot) {
    std::istringstream in(cluster_nodes());
    for (std::string line; std::getline(in, line);) {
        const auto w = split_words(line);
        if (w.size() < 9 || !has_flag(w[2], "master") || has_flag(w[2], "fail")) continue;
        for (std::size_t i = 8; i < w.size(); ++i) {
            if (w[i].empty() || w[i][0] == '[') continue;
            const auto dash = w[i].find('-');
            const int from = std::stoi(w[i].substr(0, dash));
            const int to = dash == std::string::npos ? from : std::stoi(w[i].substr(dash + 1));
            if (from <= slot && slot <= to) return port_of(w[1]);
        }
    }
    return -1;
}

// True when every node sees the cluster whole, every replica is in sync
// with its master and no slot is open.
bool Soak::cluster_settled() {
    try {
        for (std::size_t i = 0; i < cluster->size(); ++i) {
            auto c = cluster->node(i).connect();
            const std::string info(reply_text(c.command({"CLUSTER", "INFO"}).get()));
            if (info.find("cluster_state:ok") == std::string::npos) return false;
            const std::string repl(reply_text(c.command({"INFO", "replication"}).get()));
            if (repl.find("role:master") == std::string::npos && repl.find("master_link_status:up") == std::string::npos)
                return false;
        }
        const auto nodes = cluster_nodes();
        return nodes.find("->-") == std::string::npos && nodes.find("-<-") == std::string::npos;
    } catch (const std::exception&) {
        return false;
    }
}

// True when the node on a port is marked failed and the others see the
// cluster whole again (its replica took over).
bool Soak::failed_over(int port) {
    try {
        const auto i = cluster_port_index();
        auto c = cluster->node(i).connect();
        const std::string nodes(reply_text(c.command({"CLUSTER", "NODES"}).get()));
        bool failed = false;
        std::istringstream in(nodes);
        for (std::string line; std::getline(in, line);) {
            const auto w = split_words(line);
            if (w.size() >= 3 && w[1].rfind("127.0.0.1:" + std::to_string(port) + "@", 0) == 0 && has_flag(w[2], "fail"))
                failed = true;
        }
        const std::string info(reply_text(c.command({"CLUSTER", "INFO"}).get()));
        return failed && info.find("cluster_state:ok") != std::string::npos;
    } catch (const std::exception&) {
        return false;
    }
}

// True when the node on a port is a replica whose link is up, and the
// cluster is settled.
bool Soak::replicating(int port) {
    try {
        auto c = node_connection(port);
        const std::string repl(reply_text(c.command({"INFO", "replication"}).get()));
        return repl.find("master_link_status:up") != std::string::npos && cluster_settled();
    } catch (const std::exception&) {
        return false;
    }
}

// Kills a master by PID, waits for its replica to take over, restarts it
// (same port, directory and nodes.conf, so it rejoins as a replica) and
// waits for it to replicate. Lagging: the replica first loses its link to
// the master and cannot make it again (AUTH with a password the master
// does not have; a SIGSTOP would not do: the kernel's socket buffer keeps
// what the master sent), so the master takes 700 ms of writes that the
// promoted replica never had; the master is then one that serves streams
// (a random stream's), else any.
void Soak::kill_master(bool lagging) {
    std::string master_id;
    int port = -1;
    const auto masters = cluster_masters();
    if (lagging) {
        port = slot_master(key_slot(streams[static_cast<std::size_t>(draw(static_cast<int>(streams.size())))]));
        for (const auto& [id, p] : masters)
            if (p == port) master_id = id;
    } else if (!masters.empty()) {
        const auto& m = masters[static_cast<std::size_t>(draw(static_cast<int>(masters.size())))];
        master_id = m.first;
        port = m.second;
    }
    if (master_id.empty()) return;
    const int idx = node_index(port);
    if (idx < 0) return;
    int replica = -1;
    if (lagging) {
        auto c = node_connection(port);
        std::istringstream in(std::string(reply_text(c.command({"CLUSTER", "NODES"}).get())));
        for (std::string line; std::getline(in, line) && replica < 0;) {
            const auto w = split_words(line);
            if (w.size() >= 4 && has_flag(w[2], "slave") && w[3] == master_id) replica = port_of(w[1]);
        }
        if (replica > 0) {
            auto r = node_connection(replica);
            r.command({"CONFIG", "SET", "masterauth", "not-the-password"});
            r.command({"CLIENT", "KILL", "TYPE", "master"});
            nap(0.7);
        }
    }
    auto& node = cluster->node(static_cast<std::size_t>(idx));
    node.kill();
    if (!wait_for(30, [&] { return failed_over(port); })) remark("  the cluster did not fail over within 30 s");
    if (replica > 0) {
        try {
            node_connection(replica).command({"CONFIG", "SET", "masterauth", ""});
        } catch (const std::exception&) {
        }
    }
    try {
        node.start();
    } catch (const std::exception& e) {
        remark(std::string("  the old master did not start again: ") + e.what());
    }
    if (!wait_for(30, [&] { return replicating(port); }))
        remark("  the old master did not come back as a replica within 30 s");
}

// Moves 100 slots (the lowest of the source) from the master of a random
// stream's slot to another master, with redis-cli --cluster reshard.
void Soak::reshard() {
    if (!cluster_settled()) {
        remark("  not settled, skipped");
        return;
    }
    const auto& stream = streams[static_cast<std::size_t>(draw(static_cast<int>(streams.size())))];
    const int from = slot_master(key_slot(stream));
    std::vector<std::string> others;
    for (const auto& [id, p] : cluster_masters())
        if (p != from) others.push_back(id);
    if (from < 0 || others.empty()) return;
    const auto to = others[static_cast<std::size_t>(draw(static_cast<int>(others.size())))];
    const auto from_id = std::string(reply_text(node_connection(from).command({"CLUSTER", "MYID"}).get()));
    const auto r = run_program({"redis-cli", "--cluster", "reshard", "127.0.0.1:" + std::to_string(from),
                                "--cluster-from", from_id, "--cluster-to", to, "--cluster-slots", "100",
                                "--cluster-yes"},
                               std::chrono::seconds(60), work + "/reshard.log");
    if (!r.ok()) {
        remark("  reshard failed (see reshard.log)");
        cluster_fix();
    }
}

// Moves the slot of a random stream to another master as redis-cli's
// reshard does, slot by slot: IMPORTING, MIGRATING, MIGRATE, NODE.
void Soak::migrate_stream_slot() {
    if (!cluster_settled()) {
        remark("  not settled, skipped");
        return;
    }
    const auto& stream = streams[static_cast<std::size_t>(draw(static_cast<int>(streams.size())))];
    const int slot = key_slot(stream);
    const int from = slot_master(slot);
    std::vector<std::pair<std::string, int>> others;
    for (const auto& m : cluster_masters())
        if (m.second != from) others.push_back(m);
    if (from < 0 || others.empty()) return;
    const auto [to, to_port] = others[static_cast<std::size_t>(draw(static_cast<int>(others.size())))];
    remark("  slot " + std::to_string(slot) + " of " + stream + " from :" + std::to_string(from) + " to :" +
           std::to_string(to_port));
    std::ofstream log(work + "/reshard.log", std::ios::app);
    try {
        const auto s = std::to_string(slot);
        auto src = node_connection(from);
        auto dst = node_connection(to_port);
        const auto from_id = std::string(reply_text(src.command({"CLUSTER", "MYID"}).get()));
        dst.command({"CLUSTER", "SETSLOT", s, "IMPORTING", from_id});
        src.command({"CLUSTER", "SETSLOT", s, "MIGRATING", to});
        for (int i = 0; i < 100; ++i) {
            auto keys = src.command({"CLUSTER", "GETKEYSINSLOT", s, "100"});
            if (keys->elements == 0) break;
            std::vector<std::string> argv{"MIGRATE", "127.0.0.1", std::to_string(to_port), "", "0", "10000", "KEYS"};
            for (std::size_t k = 0; k < keys->elements; ++k) argv.emplace_back(reply_text(keys->element[k]));
            std::vector<std::string_view> views(argv.begin(), argv.end());
            log << "MIGRATE " << keys->elements << " keys of slot " << s << ": "
                << reply_text(src.command(views).get()) << '\n';
        }
        std::vector<int> ports{to_port, from};
        for (const auto& [id, p] : cluster_masters())
            if (p != from && p != to_port) ports.push_back(p);
        for (int p : ports) node_connection(p).command({"CLUSTER", "SETSLOT", s, "NODE", to});
    } catch (const std::exception& e) {
        log << "migration of slot " << slot << " failed: " << e.what() << '\n';
        log.close();
        remark("  migration failed (see reshard.log)");
        cluster_fix();
    }
}

// Closes slots a failed migration left open.
void Soak::cluster_fix() {
    run_program({"redis-cli", "--cluster", "fix", "127.0.0.1:" + std::to_string(cluster->node(cluster_port_index()).port()),
                 "--cluster-yes"},
                std::chrono::seconds(60), work + "/reshard.log");
}

// The handler fails for one of the hot keys for 5 to 15 s (with
// SOAK_PARK): its first failing entry is tried again, dead-lettered after
// 3 deliveries, and the key's later entries are parked meanwhile.
void Soak::key_fault() {
    const auto key = "hot" + std::to_string(draw(10));
    const auto seconds = std::to_string(5 + draw(11));
    note("key fail: the handler fails for a hot key for 5 to 15 s");
    try {
        query("sink",
              "INSERT INTO soak_failing VALUES ($1, clock_timestamp() + make_interval(secs => $2::int)) "
              "ON CONFLICT (key) DO UPDATE SET until = excluded.until",
              {key, seconds});
    } catch (const Interrupted&) {
        throw;
    } catch (const std::exception& e) {
        remark(std::string("  key fail failed: ") + e.what());
    }
}

}  // namespace pg_outbox::soak
