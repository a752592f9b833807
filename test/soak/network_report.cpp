// pg_outbox_soak_network: the report of the soak test's network faults
// (SOAK_MODE=network). The soak records when it cut a path, when it
// healed it and when publishing or applying resumed; the relays' and
// workers' own JSON logs say when each of them noticed. Reading those
// logs is a program's job, so this is one.
//
//   pg_outbox_soak_network RESULTS LEASE_MS POLL_MS [DETECT_BOUND_MS]
//
// RESULTS has a line per fault, tab-separated:
//   kind  path  standby  seconds  cut  heal  resumed  cut-logs  standby-log
// with kind blackhole, reset or link-down; path relay-pg, relay-redis,
// consumer-pg or consumer-redis; standby with, without or -; the times in
// epoch seconds (resumed empty when nothing resumed within the soak's
// wait); cut-logs the comma-separated logs of the processes the fault cut
// off; standby-log the log of the standby relay, or "-".
//
// For each fault it prints what happened, then the longest time from a
// cut to its detection (the last of the cut processes to log a warning
// or an error after the cut), from a cut to the standby leading, and from
// a heal to resumed publishing and to resumed applying, each beside its
// target: resuming within the lease plus one poll, detecting within
// DETECT_BOUND_MS when given. The figures are printed, never judged: the
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
    if (argc < 4) {
        std::fprintf(stderr, "usage: pg_outbox_soak_network RESULTS LEASE_MS POLL_MS [DETECT_BOUND_MS]\n");
        return 2;
    }
    std::ifstream in(argv[1]);
    if (!in) {
        std::fprintf(stderr, "pg_outbox_soak_network: cannot read %s\n", argv[1]);
        return 2;
    }
    const double lease = std::stod(argv[2]) / 1000, poll = std::stod(argv[3]) / 1000;
    // Negative: no documented bound given.
    const double detect_bound = argc > 4 ? std::stod(argv[4]) / 1000 : -1;

    Longest detect, takeover, resume_publish, resume_apply;
    std::vector<std::string> unnoticed, unresumed;
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        const auto f = split(line, '\t');
        if (f.size() != 9) {
            std::fprintf(stderr, "pg_outbox_soak_network: a line of %zu fields, not 9: %s\n", f.size(), line.c_str());
            return 2;
        }
        ++n;
        const auto& kind = f[0];
        const auto& path = f[1];
        const auto& standby = f[2];
        const double cut = std::stod(f[4]), heal = std::stod(f[5]);
        std::string what = kind + " " + describe_path(path);
        if (standby == "with") what += ", a standby relay running";
        if (standby == "without") what += ", no standby relay";
        std::printf("fault %d: %s, %.1f s:", n, what.c_str(), heal - cut);

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
            std::printf(" noticed after %.1f s (%s);", *noticed, shorten(how).c_str());
            detect.add(*noticed, what);
        } else {
            std::printf(" not noticed during the cut;");
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.1f s", heal - cut);
            unnoticed.push_back(buf);
        }

        if (f[8] != "-") {
            const auto l = first_after(f[8], cut, [](const LogLine& l) {
                return l.msg.rfind("leading group", 0) == 0;
            });
            if (l && l->ts <= heal) {
                std::printf(" the standby led after %.1f s;", l->ts - cut);
                takeover.add(l->ts - cut, what);
            } else {
                std::printf(" the standby did not lead during the cut;");
            }
        }

        const bool publishing = path.rfind("relay-", 0) == 0;
        if (f[6].empty()) {
            std::printf(" %s did not resume\n", publishing ? "publishing" : "applying");
            unresumed.push_back(what);
        } else {
            const double r = std::stod(f[6]) - heal;
            std::printf(" %s resumed %.1f s after the heal\n", publishing ? "publishing" : "applying", r);
            (publishing ? resume_publish : resume_apply).add(r, what);
        }
    }

    auto verdict = [](double s, double target) { return s <= target ? "met" : "missed"; };
    if (detect.count > 0) {
        std::printf("cut to detection: longest %.1f s (%s)", detect.seconds, detect.what.c_str());
        if (detect_bound >= 0)
            std::printf("; target %.1f s: %s", detect_bound, verdict(detect.seconds, detect_bound));
        std::printf("\n");
    }
    if (!unnoticed.empty()) {
        std::printf("cuts that ended before every process they cut noticed: %zu (", unnoticed.size());
        for (std::size_t i = 0; i < unnoticed.size(); ++i) std::printf("%s%s", i ? ", " : "", unnoticed[i].c_str());
        std::printf(")\n");
    }
    if (takeover.count > 0)
        std::printf("cut to a standby leading: longest %.1f s (%s); target (the lease plus one poll) %.1f s: %s\n",
                    takeover.seconds, takeover.what.c_str(), lease + poll, verdict(takeover.seconds, lease + poll));
    if (resume_publish.count > 0)
        std::printf("heal to resumed publishing: longest %.1f s (%s); target (the lease plus one poll) %.1f s: %s\n",
                    resume_publish.seconds, resume_publish.what.c_str(), lease + poll,
                    verdict(resume_publish.seconds, lease + poll));
    if (resume_apply.count > 0)
        std::printf("heal to resumed applying: longest %.1f s (%s)\n", resume_apply.seconds, resume_apply.what.c_str());
    for (const auto& w : unresumed) std::printf("did not resume after the heal: %s\n", w.c_str());
    return 0;
}
