// pg_outbox_soak_network: the report of the soak test's network faults
// (SOAK_MODE=network). The soak records when it cut a path, when it
// healed it and when publishing or applying resumed; the relays' and
// workers' own JSON logs say when each of them noticed. Reading those
// logs is a program's job, so this is one.
//
//   pg_outbox_soak_network RESULTS LEASE_MS POLL_MS [RELAY_BOUND_MS CONSUMER_BOUND_MS]
//
// RESULTS has a line per fault, tab-separated:
//   kind  path  standby  seconds  cut  heal  resumed  cut-logs  standby-log  relay-logs
// with kind blackhole, reset or link-down; path relay-pg, relay-redis,
// consumer-pg or consumer-redis; standby with, without or -; the times in
// epoch seconds; resumed the time of the first apply after the heal, or
// "log": the first batch a relay logged as published after the heal (at
// debug level) in relay-logs, or "-": nothing resumed within the soak's
// wait; cut-logs the comma-separated logs of the processes the fault cut
// off; standby-log the log of the standby relay, or "-".
//
// For each fault it prints what happened, then, for the relays and for
// the consumer, the longest time from a cut to its detection (the last of
// the cut processes to log a warning or an error after the cut), from a
// cut to the standby leading, and from a heal to resumed publishing and
// to resumed applying, each beside its target: a standby leading and
// publishing resuming within the lease plus one poll, a cut noticed
// within the documented bound of the wait under way (RELAY_BOUND_MS and
// CONSUMER_BOUND_MS, when given; a cut that lasted longer and was not
// noticed misses it too). The figures are printed, never judged: the
// soak's verdict is the history checker's. Exit status 2 on bad input.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string f;
    while (std::getline(ss, f, sep)) out.push_back(f);
    if (!s.empty() && s.back() == sep) out.emplace_back();
    return out;
}

struct LogLine {
    double ts;
    std::string level;
    std::string msg;
};

// The first line of a JSON log after a moment that the predicate accepts.
// Lines that are not the relay's JSON (a crash's text on stderr) are
// skipped.
template <typename Pred>
std::optional<LogLine> first_after(const std::string& path, double after, Pred pred) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object() || !j.contains("ts") || !j["ts"].is_number()) continue;
        LogLine l{j["ts"].get<double>(), j.value("level", ""), j.value("msg", "")};
        if (l.ts > after && pred(l)) return l;
    }
    return std::nullopt;
}

bool is_trouble(const LogLine& l) { return l.level == "warning" || l.level == "error" || l.level == "critical"; }

std::string describe_path(const std::string& path) {
    if (path == "relay-pg") return "relay<->PostgreSQL";
    if (path == "relay-redis") return "relay<->Redis";
    if (path == "consumer-pg") return "consumer<->PostgreSQL";
    if (path == "consumer-redis") return "consumer<->Redis";
    return path;
}

std::string shorten(std::string s, std::size_t n = 110) {
    if (s.size() > n) s = s.substr(0, n) + "...";
    for (auto& c : s)
        if (c == '\n' || c == '\t') c = ' ';
    return s;
}

struct Longest {
    double seconds = -1;
    std::string what;
    int count = 0;
    void add(double s, const std::string& w) {
        ++count;
        if (s > seconds) {
            seconds = s;
            what = w;
        }
    }
};

}  // namespace

int main(int argc, char** argv) {
    if (argc != 4 && argc != 6) {
        std::fprintf(stderr, "usage: pg_outbox_soak_network RESULTS LEASE_MS POLL_MS [RELAY_BOUND_MS CONSUMER_BOUND_MS]\n");
        return 2;
    }
    std::ifstream in(argv[1]);
    if (!in) {
        std::fprintf(stderr, "pg_outbox_soak_network: cannot read %s\n", argv[1]);
        return 2;
    }
    const double lease = std::stod(argv[2]) / 1000, poll = std::stod(argv[3]) / 1000;
    // Negative: no documented bound given.
    const double bounds[2] = {argc == 6 ? std::stod(argv[4]) / 1000 : -1, argc == 6 ? std::stod(argv[5]) / 1000 : -1};
    const char* sides[2] = {"relays", "consumer"};

    Longest detect[2], takeover, resume_publish, resume_apply;
    std::vector<std::pair<std::string, double>> unnoticed[2];
    std::vector<std::string> unresumed;
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        const auto f = split(line, '\t');
        if (f.size() != 10) {
            std::fprintf(stderr, "pg_outbox_soak_network: a line of %zu fields, not 10: %s\n", f.size(), line.c_str());
            return 2;
        }
        ++n;
        const auto& kind = f[0];
        const auto& path = f[1];
        const auto& standby = f[2];
        const double cut = std::stod(f[4]), heal = std::stod(f[5]);
        const bool publishing = path.rfind("relay-", 0) == 0;
        const int side = publishing ? 0 : 1;
        std::string what = kind + " " + describe_path(path);
        if (standby == "with") what += ", a standby relay running";
        if (standby == "without") what += ", no standby relay";
        char lasted[32];
        std::snprintf(lasted, sizeof lasted, "%.2f s", heal - cut);
        std::printf("fault %d: %s, %s:", n, what.c_str(), lasted);

        // Detection: the last of the cut processes to notice.
        std::optional<double> noticed;
        std::string how;
        bool all = true;
        for (const auto& log : split(f[7], ',')) {
            const auto l = first_after(log, cut, is_trouble);
            if (!l || l->ts > heal) {
                all = false;
                continue;
            }
            if (!noticed || l->ts - cut > *noticed) {
                noticed = l->ts - cut;
                how = l->msg;
            }
        }
        if (all && noticed) {
            std::printf(" noticed after %.2f s (%s);", *noticed, shorten(how).c_str());
            detect[side].add(*noticed, what);
        } else {
            std::printf(" not noticed during the cut;");
            unnoticed[side].emplace_back(what + ", " + lasted, heal - cut);
        }

        if (f[8] != "-") {
            const auto l = first_after(f[8], cut, [](const LogLine& l) {
                return l.msg.rfind("leading group", 0) == 0;
            });
            if (l && l->ts <= heal) {
                std::printf(" the standby led after %.2f s;", l->ts - cut);
                takeover.add(l->ts - cut, what);
            } else {
                std::printf(" the standby did not lead during the cut;");
            }
        }

        std::optional<double> resumed;
        if (f[6] == "log") {
            for (const auto& log : split(f[9], ',')) {
                const auto l = first_after(log, heal, [](const LogLine& l) { return l.msg.rfind("published ", 0) == 0; });
                if (l && (!resumed || l->ts < *resumed)) resumed = l->ts;
            }
        } else if (f[6] != "-") {
            resumed = std::stod(f[6]);
        }
        if (!resumed) {
            std::printf(" %s did not resume\n", publishing ? "publishing" : "applying");
            unresumed.push_back(what);
        } else {
            const double r = *resumed - heal;
            std::printf(" %s resumed %.2f s after the heal\n", publishing ? "publishing" : "applying", r);
            (publishing ? resume_publish : resume_apply).add(r, what);
        }
    }

    auto verdict = [](double s, double target) { return s <= target ? "met" : "missed"; };
    for (int side = 0; side < 2; ++side) {
        const double bound = bounds[side];
        if (detect[side].count > 0) {
            std::printf("cut to detection, %s: longest %.2f s (%s)", sides[side], detect[side].seconds,
                        detect[side].what.c_str());
            if (bound >= 0)
                std::printf("; bound %.2f s: %s", bound, verdict(detect[side].seconds, bound));
            std::printf("\n");
        }
        if (!unnoticed[side].empty()) {
            std::printf("cuts of the %s not noticed while they lasted: %zu (", sides[side], unnoticed[side].size());
            std::size_t longer = 0;
            for (std::size_t i = 0; i < unnoticed[side].size(); ++i) {
                std::printf("%s%s", i ? "; " : "", unnoticed[side][i].first.c_str());
                if (bound >= 0 && unnoticed[side][i].second > bound) ++longer;
            }
            std::printf(")");
            if (bound >= 0)
                std::printf("; %zu of them lasted longer than the bound, %.2f s: %s", longer, bound,
                            longer > 0 ? "missed" : "met");
            std::printf("\n");
        }
    }
    if (takeover.count > 0)
        std::printf("cut to a standby leading: longest %.2f s (%s); target (the lease plus one poll) %.2f s: %s\n",
                    takeover.seconds, takeover.what.c_str(), lease + poll, verdict(takeover.seconds, lease + poll));
    if (resume_publish.count > 0)
        std::printf("heal to resumed publishing: longest %.2f s (%s); target (the lease plus one poll) %.2f s: %s\n",
                    resume_publish.seconds, resume_publish.what.c_str(), lease + poll,
                    verdict(resume_publish.seconds, lease + poll));
    if (resume_apply.count > 0)
        std::printf("heal to resumed applying: longest %.2f s (%s)\n", resume_apply.seconds, resume_apply.what.c_str());
    for (const auto& w : unresumed) std::printf("did not resume after the heal: %s\n", w.c_str());
    return 0;
}
