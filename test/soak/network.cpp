// The soak test's network mode (SOAK_MODE=network): the test's own hosts,
// the faults it makes between them, and what it records of each fault for
// the report (test/soak/network_report.cpp).
//
// The hosts are network namespaces: "db" runs PostgreSQL and Redis;
// relay1, relay2 and consumer (both consume workers) each have one of
// their own, joined to db by two veth pairs, one that carries PostgreSQL
// and one that carries Redis, so that each path can be cut alone:
//
//   relay1    10.250.1.2 -- 10.250.1.1  db, PostgreSQL
//             10.251.1.2 -- 10.251.1.1  db, Redis
//   relay2    10.250.2.2 -- 10.250.2.1
//             10.251.2.2 -- 10.251.2.1
//   consumer  10.250.3.2 -- 10.250.3.1
//             10.251.3.2 -- 10.251.3.1
//
// These addresses exist only inside these namespaces (IPv6 is off there,
// so no link-local address either); the root namespace gets no interface
// and no address. The soak itself (writers, queries) reaches PostgreSQL and
// Redis through their Unix sockets, which no fault touches. Every
// namespace and interface is named with a prefix ("pgox<PID of the
// soak>-"), and the teardown deletes those names only. Every ip and
// iptables command is an argv: nothing is built into a shell string.
//
// A fault is made in the db namespace on the db end of one path:
//   blackhole  iptables DROP of every packet in and out (no RST, no ICMP)
//   reset      iptables REJECT --reject-with tcp-reset of TCP in and out
//   link-down  ip link set down
// on relay<->PostgreSQL or relay<->Redis of the leading relay (the other
// relay standing by, or stopped for the time of the fault),
// consumer<->PostgreSQL or consumer<->Redis (both workers). tc netem is
// not used.
#include <fcntl.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "soak.hpp"

namespace pg_outbox::soak {

namespace {

const std::vector<std::string> kHosts{"relay1", "relay2", "consumer"};
const std::vector<std::string> kKinds{"blackhole", "reset", "link-down"};
const std::vector<std::string> kPaths{"relay-pg", "relay-redis", "consumer-pg", "consumer-redis"};
// The longest wait for publishing or applying to resume after a heal.
constexpr int kResumeWait = 180;

int host_index(const std::string& host) {
    if (host == "relay1") return 1;
    if (host == "relay2") return 2;
    return 3;
}

bool on_path(const std::string& program) {
    const char* path = std::getenv("PATH");
    std::istringstream in(path ? path : "/usr/sbin:/usr/bin:/sbin:/bin");
    for (std::string dir; std::getline(in, dir, ':');) {
        if (!dir.empty() && ::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    }
    return false;
}

std::vector<std::string> words(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

}  // namespace

Network::Network(Soak& soak) : soak_(soak), prefix_("pgox" + std::to_string(::getpid()) + "-") {
    // Which kind and path come first, and which faults have a standby.
    shift_ = soak_.draw(32768);
    standby_shift_ = soak_.draw(32768);
}

Network::~Network() {
    try {
        if (made_) teardown();
    } catch (...) {
    }
}

RunResult Network::ip(const std::vector<std::string>& args) {
    std::vector<std::string> argv{"ip"};
    argv.insert(argv.end(), args.begin(), args.end());
    return soak_.run_program(argv, std::chrono::seconds(30));
}

std::string Network::host_of(const std::string& name) {
    return name.rfind("relay", 0) == 0 ? name : "consumer";
}

std::vector<std::string> Network::exec_prefix(const std::string& host) const {
    return {"ip", "netns", "exec", prefix_ + host};
}

std::string Network::db_addr(const std::string& host, const std::string& kind) {
    return "10." + std::string(kind == "pg" ? "250" : "251") + "." + std::to_string(host_index(host)) + ".1";
}

// The interface of a host's link: its db end or its host end.
std::string Network::dev(const std::string& host, const std::string& kind, bool db_side) const {
    return prefix_ + (db_side ? "d" : "h") + std::to_string(host_index(host)) + kind.substr(0, 1);
}

std::string Network::unavailable() {
    if (::geteuid() != 0) {
        const passwd* pw = ::getpwuid(::geteuid());
        return "it runs as " + (pw ? std::string(pw->pw_name) : std::to_string(::geteuid())) + ", not root";
    }
    if (!on_path("ip")) return "ip (Debian package iproute2) is not installed";
    if (!on_path("iptables")) return "iptables (Debian package iptables) is not installed";
    const std::string ns = prefix_ + "probe";
    made_ = true;
    auto r = ip({"netns", "add", ns});
    if (!r.ok()) return "ip netns add failed (no CAP_SYS_ADMIN or CAP_NET_ADMIN?): " + trimmed(r.output);
    r = ip({"-n", ns, "link", "add", prefix_ + "p0", "type", "veth", "peer", "name", prefix_ + "p1"});
    if (!r.ok()) {
        ip({"netns", "del", ns});
        return "ip link add ... type veth failed: " + trimmed(r.output);
    }
    // Both iptables back ends, nf_tables first, then legacy: the one that
    // works is kept.
    std::string err = "no iptables program";
    for (const char* ipt : {"iptables", "iptables-legacy"}) {
        if (!on_path(ipt)) continue;
        r = soak_.run_program({"ip", "netns", "exec", ns, ipt, "-w", "-I", "INPUT", "-i", prefix_ + "p0", "-j", "DROP"});
        if (r.ok()) {
            iptables_ = ipt;
            err.clear();
            break;
        }
        err = trimmed(r.output);
    }
    ip({"netns", "del", ns});
    return err.empty() ? "" : "iptables cannot add a rule in a network namespace: " + err;
}

void Network::setup() {
    made_ = true;
    auto must = [this](const std::vector<std::string>& args) {
        const auto r = ip(args);
        if (!r.ok()) throw std::runtime_error("ip failed: " + trimmed(r.output));
    };
    std::vector<std::string> all{"db"};
    all.insert(all.end(), kHosts.begin(), kHosts.end());
    for (const auto& h : all) {
        must({"netns", "add", prefix_ + h});
        soak_.run_program({"ip", "netns", "exec", prefix_ + h, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                           "net.ipv6.conf.default.disable_ipv6=1"});
        must({"-n", prefix_ + h, "link", "set", "lo", "up"});
    }
    for (const auto& h : kHosts) {
        const auto i = std::to_string(host_index(h));
        for (const std::string kind : {"pg", "redis"}) {
            const std::string o = kind == "pg" ? "250" : "251";
            const auto d = dev(h, kind), peer = dev(h, kind, false);
            must({"link", "add", d, "netns", prefix_ + "db", "type", "veth", "peer", "name", peer, "netns", prefix_ + h});
            must({"-n", prefix_ + "db", "addr", "add", "10." + o + "." + i + ".1/24", "dev", d});
            must({"-n", prefix_ + h, "addr", "add", "10." + o + "." + i + ".2/24", "dev", peer});
            must({"-n", prefix_ + "db", "link", "set", d, "up"});
            must({"-n", prefix_ + h, "link", "set", peer, "up"});
        }
    }
}

void Network::teardown() {
    for (const auto& line : words(ip({"netns", "list"}).output)) {
        if (line.rfind(prefix_, 0) != 0) continue;
        for (const auto& pid : words(ip({"netns", "pids", line}).output)) {
            try {
                ::kill(std::stoi(pid), SIGKILL);
            } catch (const std::exception&) {
            }
        }
        ip({"netns", "del", line});
    }
    // Interfaces of this run left in the root namespace by a setup cut short.
    std::istringstream in(ip({"-o", "link", "show"}).output);
    for (std::string line; std::getline(in, line);) {
        const auto a = line.find(": ");
        if (a == std::string::npos) continue;
        auto name = line.substr(a + 2);
        name = name.substr(0, name.find_first_of(":@"));
        if (name.rfind(prefix_, 0) == 0) ip({"link", "del", name});
    }
    made_ = false;
}

Network::InDb::InDb(Network& net) {
    saved_ = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    const std::string path = "/run/netns/" + net.prefix_ + "db";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (saved_ < 0 || fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
        if (fd >= 0) ::close(fd);
        throw std::runtime_error("cannot enter the network namespace " + path);
    }
    ::close(fd);
}

Network::InDb::~InDb() {
    if (saved_ >= 0) {
        (void)::setns(saved_, CLONE_NEWNET);
        ::close(saved_);
    }
}

// PostgreSQL listens on the db end of each host's PostgreSQL link (and its
// Unix socket), with an hba file that lets those hosts in. Server-side
// keepalives end the sessions of clients a fault cut off, which would
// otherwise hold connection slots for hours.
std::vector<std::string> Network::pg_settings() const {
    std::string addrs;
    for (const auto& h : kHosts) addrs += (addrs.empty() ? "" : ",") + db_addr(h, "pg");
    const std::string hba = soak_.work + "/pg_hba.conf";
    std::ofstream(hba) << "local all all trust\nhost all all 10.250.0.0/16 trust\n";
    return {"listen_addresses = '" + addrs + "'", "hba_file = '" + hba + "'", "tcp_keepalives_idle = 10",
            "tcp_keepalives_interval = 5", "tcp_keepalives_count = 3"};
}

std::string Network::redis_socket() const { return soak_.work + "/redis/redis.sock"; }

// Redis listens on the db end of each host's Redis link and on a Unix
// socket (where the kit and the soak reach it).
std::vector<std::string> Network::redis_args() const {
    std::vector<std::string> args{"--bind"};
    for (const auto& h : kHosts) args.push_back(db_addr(h, "redis"));
    args.insert(args.end(), {"--protected-mode", "no", "--unixsocket", redis_socket(), "--unixsocketperm", "700"});
    return args;
}

void Network::rules(const std::string& op, const std::string& kind, const std::string& d) {
    const std::vector<std::string> ipt{"ip", "netns", "exec", prefix_ + "db", iptables_, "-w", op};
    auto run = [&](const std::vector<std::string>& rest) {
        auto argv = ipt;
        argv.insert(argv.end(), rest.begin(), rest.end());
        const auto r = soak_.run_program(argv, std::chrono::seconds(30));
        if (!r.ok()) soak_.remark("  " + iptables_ + " " + op + " failed: " + trimmed(r.output));
    };
    if (kind == "blackhole") {
        run({"INPUT", "-i", d, "-j", "DROP"});
        run({"OUTPUT", "-o", d, "-j", "DROP"});
    } else {
        // Not the resets these rules send: a reset that the OUTPUT rule
        // caught would never reach the client.
        run({"INPUT", "-i", d, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"});
        run({"OUTPUT", "-o", d, "-p", "tcp", "!", "--tcp-flags", "RST", "RST", "-j", "REJECT", "--reject-with",
             "tcp-reset"});
    }
}

void Network::cut(const std::string& kind, const std::string& d) {
    if (kind == "link-down")
        ip({"-n", prefix_ + "db", "link", "set", d, "down"});
    else
        rules("-I", kind, d);
}

void Network::heal(const std::string& kind, const std::string& d) {
    if (kind == "link-down")
        ip({"-n", prefix_ + "db", "link", "set", d, "up"});
    else
        rules("-D", kind, d);
}

// The relay that leads the group (by the address its session comes from),
// or "".
std::string Network::leader() {
    try {
        const auto addr = soak_.value("soak",
                                      "SELECT host(a.client_addr) FROM outbox.groups g JOIN pg_stat_activity a ON "
                                      "a.pid = g.leader_pid WHERE g.name = 'soak' AND g.lease_until > now()");
        if (addr == "10.250.1.2") return "relay1";
        if (addr == "10.250.2.2") return "relay2";
    } catch (const Interrupted&) {
        throw;
    } catch (const std::exception&) {
    }
    return "";
}

// What the relays published (entries in the streams), and what the workers
// applied (the projection's sequence): each only grows.
long long Network::published() {
    long long n = 0;
    try {
        auto c = soak_.redis->connect();
        for (const auto& s : soak_.streams) n += c.command({"XLEN", s})->integer;
    } catch (const std::exception&) {
    }
    return n;
}

long long Network::applied() {
    try {
        return std::stoll(soak_.value("sink", "SELECT last_value FROM projection_seq_seq"));
    } catch (const Interrupted&) {
        throw;
    } catch (const std::exception&) {
        return 0;
    }
}

// The network faults, one at a time, each measured until publishing or
// applying resumed, 1 to 3 seconds apart; the last starts 5 s before the
// end at the latest.
void Network::faults() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(soak_.opt.seconds - 5);
    nap(2);
    for (int n = 0; std::chrono::steady_clock::now() < until; ++n) {
        fault(n);
        nap(1 + soak_.draw(3));
    }
}

// One fault, the n-th: its kind, path and standby are in a rotation that
// makes every kind on every path within 12 faults, and with a standby and
// without one within 24 (shifted by the seed); it lasts 5 s to
// SOAK_FAULT_MAX. Right after the heal it emits an event, so that there
// is something to publish and apply even when the writers pause, and
// waits (at most kResumeWait seconds) until the streams or the projection
// grow. Records a line for the report:
//   kind path standby seconds cut heal resumed cut-logs standby-log relay-logs
// (times in epoch seconds; resumed: when the first apply after the heal
// happened (the projection's applied_at), "log" when the relays' logs say
// when they published first after it, "-" when nothing resumed; logs
// comma-separated, "-" for none), and says what it did in faults.log.
void Network::fault(int n) {
    const auto& kind = kKinds[static_cast<std::size_t>((n + shift_) % 3)];
    const auto& path = kPaths[static_cast<std::size_t>((n + shift_ / 3) % 4)];
    const int d = 5 + soak_.draw(soak_.opt.fault_max - 4);
    std::string host, other, standby = "-";
    std::vector<std::string> procs;
    const bool relay_path = path.rfind("relay-", 0) == 0;
    if (relay_path) {
        if (!wait_for(30, [this] { return !leader().empty(); })) {
            soak_.note("no relay led within 30 s; no fault");
            return;
        }
        host = leader();
        if (host.empty()) host = "relay1";
        other = host == "relay2" ? "relay1" : "relay2";
        standby = "with";
        if ((n + n / 12 + standby_shift_) % 2 == 1) {
            standby = "without";
            soak_.stop(other);
        }
        procs = {host};
    } else {
        host = "consumer";
        procs = soak_.workers;
    }
    std::string logs;
    for (const auto& p : procs) logs += (logs.empty() ? "" : ",") + soak_.work + "/" + p + ".log";
    const auto server = path.substr(path.find('-') + 1);
    const auto d_dev = dev(host, server);
    const std::string what = (relay_path ? "relay" : "consumer") + std::string("<->") +
                             (server == "pg" ? "PostgreSQL" : "Redis");
    if (standby == "with")
        soak_.note(kind + " " + what + ", a standby relay running");
    else if (standby == "without")
        soak_.note(kind + " " + what + ", no standby relay");
    else
        soak_.note(kind + " " + what);
    auto counter = [&] { return relay_path ? published() : applied(); };
    // The times are taken when the rules are in place, and when they are
    // gone.
    cut(kind, d_dev);
    const double t_cut = epoch_now();
    nap(d);
    const long long at_heal = counter();
    heal(kind, d_dev);
    const double t_heal = epoch_now();
    soak_.query("soak", "SELECT outbox_emit('t0', 'heal', jsonb_build_object('n', nextval('soak_n')))");
    std::string t_res = "-";
    for (int i = 0; i < kResumeWait * 10; ++i) {
        if (counter() > at_heal) {
            t_res = "log";
            break;
        }
        nap(0.1);
    }
    if (!relay_path && t_res == "log")
        t_res = soak_.value("sink",
                            "SELECT extract(epoch FROM min(applied_at)) FROM projection WHERE applied_at > "
                            "to_timestamp($1::double precision)",
                            {epoch_text(t_heal)});
    const std::string standby_log = standby == "with" ? soak_.work + "/" + other + ".log" : "-";
    const std::string relay_logs =
        relay_path ? soak_.work + "/relay1.log," + soak_.work + "/relay2.log" : std::string("-");
    std::ofstream(results, std::ios::app) << kind << '\t' << path << '\t' << standby << '\t' << d << '\t'
                                          << epoch_text(t_cut) << '\t' << epoch_text(t_heal) << '\t' << t_res << '\t'
                                          << logs << '\t' << standby_log << '\t' << relay_logs << '\n';
    if (!other.empty() && standby == "without") soak_.start(other);
}

}  // namespace pg_outbox::soak
