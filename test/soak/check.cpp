// pg_outbox_check: checks a history of an outbox system for loss, phantoms,
// duplicates and reordering, the way queue checkers judge message systems.
//
// It reads four tab-separated files from a directory, so it can check a
// soak run as well as a history taken from a real deployment:
//
//   committed.tsv     event_id  topic  position  created_at (epoch seconds)
//                     [stream  key]
//                     every event of a committed transaction (the outbox);
//                     with the optional columns, the stream the event must
//                     be published to (a sharded group's: its shard's) and
//                     its key (empty when it has none), which turn on the
//                     routing and the per-key order checks
//   streams.tsv       stream  entry_id  event_id  position
//                     every stream entry, in stream order
//   applied.tsv       event_id  applied_at (epoch seconds)  [order]
//                     every application of an event by the consumer (one row
//                     per application: a duplicate apply is two rows); the
//                     optional order (an increasing number) says in which
//                     order they were applied, else applied_at does
//   dead_letters.tsv  stream  entry_id  event_id  [skipped]
//                     entries the consumer gave up on; an entry_id "(A B)"
//                     (or "(A B]") is a range of ids trimmed before the
//                     consumer read them; "skipped" when an operator gave
//                     the entry up on purpose (inbox_skip)
//   parked.tsv        stream  entry_id  event_id   (optional)
//                     entries a consumer with --on-failure park-key holds
//                     behind an earlier failing entry of their key; its
//                     presence says the consumer parks, which turns on
//                     the check that no event of a key is passed over:
//                     an event dead-lettered and never applied nor
//                     skipped while a later event of its (topic, key) was
//                     applied is a key order violation
//
// It prints one line per measure and a verdict; the exit status is 0 when
// lost, phantom, duplicate applies, order violations, duplicate stream
// entries and (when checked) misrouted entries and key order violations
// are all 0. Per-key order: the first applications of the events of one
// (topic, key), or of one topic's keyless events, are in feed order.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

using Position = std::pair<std::uint64_t, std::uint64_t>;

std::optional<Position> parse_position(const std::string& s) {
    const auto dash = s.find('-');
    if (dash == std::string::npos) return std::nullopt;
    try {
        return Position{std::stoull(s.substr(0, dash)), std::stoull(s.substr(dash + 1))};
    } catch (const std::exception&) {
        return std::nullopt;
    }
}

std::vector<std::vector<std::string>> read_tsv(const std::string& path) {
    std::vector<std::vector<std::string>> rows;
    std::ifstream in(path);
    if (!in) {
        std::fprintf(stderr, "pg_outbox_check: cannot read %s\n", path.c_str());
        std::exit(2);
    }
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        std::vector<std::string> fields;
        std::stringstream ss(line);
        std::string f;
        while (std::getline(ss, f, '\t')) fields.push_back(f);
        while (fields.size() < 6) fields.emplace_back();
        rows.push_back(std::move(fields));
    }
    return rows;
}

struct Committed {
    std::string topic;
    Position position;
    double created_at;
    std::string stream;  // empty: prefix + topic
    std::string key;
};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: pg_outbox_check HISTORY_DIR [STREAM_PREFIX]\n"
                             "       (STREAM_PREFIX, default \"outbox:\", maps a topic to its stream)\n");
        return 2;
    }
    const std::string dir = argv[1];
    const std::string prefix = argc > 2 ? argv[2] : "outbox:";

    std::unordered_map<std::string, Committed> committed;
    bool routed = false;
    for (const auto& r : read_tsv(dir + "/committed.tsv")) {
        committed[r[0]] = Committed{r[1], parse_position(r[2]).value_or(Position{}), std::stod(r[3]), r[4], r[5]};
        if (!r[4].empty()) routed = true;
    }
    auto stream_of = [&](const Committed& c) { return c.stream.empty() ? prefix + c.topic : c.stream; };

    // Streams: distinct events, duplicates, order.
    std::unordered_map<std::string, int> in_streams;
    std::map<std::string, std::optional<Position>> last_in_stream;
    std::size_t phantom = 0, duplicate_entries = 0, order_violations = 0, misrouted = 0;
    for (const auto& r : read_tsv(dir + "/streams.tsv")) {
        const auto& stream = r[0];
        const auto& event_id = r[2];
        if (++in_streams[event_id] == 2) ++duplicate_entries;
        const auto it = committed.find(event_id);
        if (it == committed.end())
            ++phantom;
        else if (routed && stream != stream_of(it->second))
            ++misrouted;
        const auto pos = parse_position(r[3]);
        auto& last = last_in_stream[stream];
        if (pos && last && !(*last < *pos)) ++order_violations;
        if (pos) last = pos;
    }

    // Applies: distinct, duplicates, delays.
    // The first application of each event, by (topic, key), in the order
    // applied, for the per-key order check.
    std::unordered_map<std::string, int> applies;
    std::vector<double> delays;
    std::size_t duplicate_applies = 0, applied_phantom = 0;
    std::unordered_map<std::string, std::vector<std::pair<double, Position>>> by_key;
    for (const auto& r : read_tsv(dir + "/applied.tsv")) {
        if (++applies[r[0]] == 2) ++duplicate_applies;
        const auto it = committed.find(r[0]);
        if (it == committed.end()) {
            ++applied_phantom;
            continue;
        }
        if (applies[r[0]] == 1) {
            delays.push_back((std::stod(r[1]) - it->second.created_at) * 1000.0);
            if (routed)
                by_key[it->second.topic + '\0' + it->second.key].emplace_back(
                    std::stod(r[2].empty() ? r[1] : r[2]), it->second.position);
        }
    }
    // An event applied after a later event of its key (in feed order) is
    // one violation.
    std::size_t key_order_violations = 0;
    for (auto& [unit, events] : by_key) {
        std::sort(events.begin(), events.end(),
                  [](const auto& a, const auto& b) { return a.first < b.first; });
        std::optional<Position> highest;
        for (const auto& e : events) {
            if (highest && e.second < *highest) ++key_order_violations;
            if (!highest || *highest < e.second) highest = e.second;
        }
    }

    // Dead letters: single entries by event id, or by stream and entry id
    // (an entry trimmed while pending has no event id left; with explicit
    // ids its entry id is the position); ranges by stream and position.
    std::unordered_set<std::string> dead_ids, skipped_ids;
    std::set<std::pair<std::string, Position>> dead_entries;
    struct Range {
        Position from, to;
        bool to_included;
    };
    std::map<std::string, std::vector<Range>> dead_ranges;
    for (const auto& r : read_tsv(dir + "/dead_letters.tsv")) {
        if (!r[2].empty()) dead_ids.insert(r[2]);
        if (!r[2].empty() && r[3] == "skipped") skipped_ids.insert(r[2]);
        if (const auto p = parse_position(r[1]); p && r[1].front() != '(') dead_entries.emplace(r[0], *p);
        if (!r[1].empty() && r[1].front() == '(') {
            std::string from, to;
            std::stringstream ss(r[1].substr(1, r[1].size() - 2));
            ss >> from >> to;
            const auto a = parse_position(from), b = parse_position(to);
            if (a && b) dead_ranges[r[0]].push_back(Range{*a, *b, r[1].back() == ']'});
        }
    }
    auto dead_lettered = [&](const std::string& id, const Committed& c) {
        if (dead_ids.count(id) || dead_entries.count({stream_of(c), c.position})) return true;
        const auto it = dead_ranges.find(stream_of(c));
        if (it == dead_ranges.end()) return false;
        for (const auto& range : it->second)
            if (range.from < c.position && (c.position < range.to || (range.to_included && c.position == range.to)))
                return true;
        return false;
    };

    // Parked entries, by event id: accounted for, not lost.
    std::unordered_set<std::string> parked_ids;
    std::ifstream parked_file(dir + "/parked.tsv");
    const bool parks = static_cast<bool>(parked_file);
    parked_file.close();
    if (parks)
        for (const auto& r : read_tsv(dir + "/parked.tsv"))
            if (!r[2].empty()) parked_ids.insert(r[2]);

    std::size_t lost = 0, dead = 0, parked = 0, published = 0;
    // With parking, the feed position of the latest applied event of each
    // (topic, key), to find events passed over.
    std::unordered_map<std::string, Position> latest_applied;
    if (parks && routed)
        for (const auto& [id, c] : committed)
            if (applies.count(id)) {
                auto& latest = latest_applied[c.topic + '\0' + c.key];
                if (latest < c.position) latest = c.position;
            }
    for (const auto& [id, c] : committed) {
        if (in_streams.count(id)) ++published;
        const bool applied = applies.count(id) > 0;
        const bool is_parked = !applied && parked_ids.count(id) > 0;
        const bool is_dead = !applied && !is_parked && dead_lettered(id, c);
        if (is_parked) ++parked;
        if (is_dead) ++dead;
        if (!applied && !is_dead && !is_parked) ++lost;
        // Passed over: given up without an operator's say while a later
        // event of its key went through.
        if (parks && routed && is_dead && dead_ids.count(id) && !skipped_ids.count(id)) {
            const auto it = latest_applied.find(c.topic + '\0' + c.key);
            if (it != latest_applied.end() && c.position < it->second) ++key_order_violations;
        }
    }

    std::sort(delays.begin(), delays.end());
    const double p99 = delays.empty() ? 0 : delays[std::min(delays.size() - 1, delays.size() * 99 / 100)];
    const double max = delays.empty() ? 0 : delays.back();

    std::printf("committed: %zu\n", committed.size());
    std::printf("published: %zu\n", published);
    std::printf("applied: %zu\n", applies.size());
    std::printf("dead-lettered: %zu\n", dead);
    if (parks) std::printf("parked: %zu\n", parked);
    std::printf("lost (committed, never applied nor dead-lettered%s): %zu\n", parks ? " nor parked" : "", lost);
    std::printf("phantom (published or applied, never committed): %zu\n", phantom + applied_phantom);
    std::printf("duplicate stream entries: %zu\n", duplicate_entries);
    std::printf("duplicate applies: %zu\n", duplicate_applies);
    std::printf("order violations: %zu\n", order_violations);
    if (routed) {
        std::printf("misrouted (in another stream than their shard's): %zu\n", misrouted);
        std::printf("key order violations (applied after a later event of their key%s): %zu\n",
                    parks ? ", or dead-lettered and passed over" : "", key_order_violations);
    }
    std::printf("end-to-end delay: p99 %.1f ms, max %.1f ms\n", p99, max);
    const bool ok = lost == 0 && phantom + applied_phantom == 0 && duplicate_applies == 0 && order_violations == 0 &&
                    duplicate_entries == 0 && misrouted == 0 && key_order_violations == 0 && !committed.empty();
    std::printf("verdict: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
