// Consume mode's Redis side: the consumer group's reads with the group's
// position in the same transaction (which tells gaps), the claims of
// pending entries, the report of entries trimmed unread, and the
// acknowledgements. Every Redis command of consume mode but the pool's
// leases is here. It goes through the relay's Redis target, one server or
// a cluster: only the read tells them apart, by per_slot() (a cluster's
// transaction names the keys of one slot).
#include "pg_outbox/stream_reader.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/redis_cluster.hpp"  // key_slot()

namespace pg_outbox {

std::vector<StreamEntry> parse_entries(const std::string& stream, const redisReply* list) {
    std::vector<StreamEntry> out;
    if (list == nullptr || list->type != REDIS_REPLY_ARRAY) return out;
    for (std::size_t i = 0; i < list->elements; ++i) {
        const redisReply* e = list->element[i];
        if (e == nullptr || e->type != REDIS_REPLY_ARRAY || e->elements < 2) continue;
        StreamEntry entry;
        entry.stream = stream;
        entry.id = std::string(reply_text(e->element[0]));
        const redisReply* f = e->element[1];
        if (f != nullptr && f->type == REDIS_REPLY_ARRAY)
            for (std::size_t j = 0; j + 1 < f->elements; j += 2)
                entry.fields.emplace_back(reply_text(f->element[j]), reply_text(f->element[j + 1]));
        // Whatever the format it was written in: the fields the consumer
        // applies.
        read_entry_format(entry);
        out.push_back(std::move(entry));
    }
    return out;
}

std::string Gap::range() const { return "(" + after.to_string() + " " + through.to_string() + "]"; }

std::vector<Gap> find_gaps(std::map<std::string, Position> delivered, const std::vector<StreamEntry>& entries) {
    std::vector<Gap> gaps;
    for (const auto& e : entries) {
        const auto last = delivered.find(e.stream);
        if (last == delivered.end()) continue;  // the group's position is unknown
        const auto prev = entry_prev(e);
        if (prev.kind == EntryPrev::Kind::valid && last->second < prev.prev)
            gaps.push_back(Gap{e.stream, last->second, prev.prev, e.id});
        if (const auto id = Position::parse(e.id))
            last->second = *id;
        else
            delivered.erase(last);
    }
    return gaps;
}

std::string Gap::reason() const {
    return "entries with ids after " + after.to_string() + " up to and including " + through.to_string() +
           " are missing from the stream (deleted, trimmed or lost before this consumer group read them): entry " +
           found + " names " + through.to_string() + " as the entry before it, and the group's last entry read was " +
           after.to_string();
}

std::string TrimmedRange::range() const { return "(" + last.to_string() + " " + first.to_string() + ")"; }

std::string TrimmedRange::reason() const {
    return std::to_string(lost) + " entries with ids after " + last.to_string() + " and before " + first.to_string() +
           " were trimmed from the stream before this consumer group read them";
}

StreamReader::StreamReader(const Config& config, Metrics& metrics, const std::atomic<bool>& stop)
    : config_(config), metrics_(metrics), stop_(stop) {}

void StreamReader::reset(RedisTarget* redis) {
    redis_ = redis;
    groups_ready_ = false;
}

RedisReply StreamReader::command(std::string_view stream, const std::vector<std::string_view>& argv,
                                 std::string_view context) {
    return redis_->command(stream, argv, context);
}

RedisReply StreamReader::command_raw(std::string_view stream, const std::vector<std::string_view>& argv) {
    return redis_->command_raw(stream, argv);
}

// Creates the consumer group on each stream (and the stream) if missing.
void StreamReader::ensure_groups() {
    if (groups_ready_) return;
    for (const auto& stream : config_.streams) {
        try {
            command(stream, {"XGROUP", "CREATE", stream, config_.consumer_group, config_.start_id, "MKSTREAM"},
                    "XGROUP CREATE " + stream);
            spdlog::info("created consumer group \"{}\" on stream \"{}\" from {}", config_.consumer_group, stream,
                         config_.start_id);
        } catch (const BusyGroupError&) {
            // The group exists: nothing to do.
        }
    }
    groups_ready_ = true;
}

namespace {

// The last id delivered to a consumer group, from XINFO GROUPS; nullopt
// when the reply does not show it.
std::optional<Position> group_last_delivered(const redisReply* groups, std::string_view group) {
    if (groups == nullptr || groups->type != REDIS_REPLY_ARRAY) return std::nullopt;
    for (std::size_t g = 0; g < groups->elements; ++g) {
        const redisReply* name = map_field(groups->element[g], "name");
        if (name == nullptr || reply_text(name) != group) continue;
        if (const redisReply* id = map_field(groups->element[g], "last-delivered-id"))
            return Position::parse(reply_text(id));
    }
    return std::nullopt;
}

}  // namespace

std::optional<Redirect> StreamReader::redirection(std::string_view text) const {
    if (!redis_->per_slot()) return std::nullopt;  // one server: an error like any other
    if (!error_is<RedirectionError>(make_error(text))) return std::nullopt;
    try {
        throw_error(text);
    } catch (const RedirectionError& e) {
        return e.redirect();
    }
}

StreamReader::GroupRead StreamReader::read_group(RedisConnection& redis,
                                                 const std::vector<std::string_view>& streams,
                                                 std::map<std::string, Position>& delivered) {
    GroupRead out;
    const auto count = std::to_string(config_.consume_batch_size);
    // The group's position in each stream and the read, in one
    // transaction: no other worker of the group reads in between, so the
    // first entry read of each stream follows the position read. XREADGROUP
    // does not block in a transaction; the caller waits with XREAD instead.
    const std::size_t looks = positions_refused_ ? 0 : streams.size();
    redis.append({"MULTI"});
    for (std::size_t i = 0; i < looks; ++i) redis.append({"XINFO", "GROUPS", streams[i]});
    std::vector<std::string_view> argv{"XREADGROUP", "GROUP", config_.consumer_group, config_.worker, "COUNT",
                                       count, "STREAMS"};
    argv.insert(argv.end(), streams.begin(), streams.end());
    for (std::size_t i = 0; i < streams.size(); ++i) argv.emplace_back(">");
    redis.append(argv);
    redis.append({"EXEC"});
    // Read every reply, whatever the first ones say: MULTI's, the queued
    // commands', EXEC's.
    const auto all = redis.read_replies(looks + 3);
    const redisReply& multi = all.raw(0);
    const redisReply& exec = all.raw(looks + 2);

    // The replies: EXEC's, or, when Redis refused MULTI (an ACL, a proxy),
    // the commands' own.
    std::vector<const redisReply*> replies;
    if (is_error(&multi)) {
        if (!multi_refused_warned_) {
            multi_refused_warned_ = true;
            spdlog::warn("Redis refused MULTI ({}); the group's position and the read are two commands: gaps are "
                         "reported exactly only while this worker reads the group alone",
                         reply_text(&multi));
        }
        for (std::size_t i = 1; i <= looks + 1; ++i) replies.push_back(&all.raw(i));
    } else if (exec.type == REDIS_REPLY_ARRAY && exec.elements == looks + 1) {
        for (std::size_t i = 0; i < exec.elements; ++i) replies.push_back(exec.element[i]);
    } else {
        // Nothing ran: a command was refused when queued; its error names
        // the cause (NOPERM, or in a cluster MOVED or ASK: the slot is
        // served by another node now).
        std::string why(reply_text(&exec));
        for (std::size_t i = 1; i <= looks + 1; ++i)
            if (is_error(&all.raw(i))) {
                why = std::string(reply_text(&all.raw(i)));
                break;
            }
        if (auto redirect = redirection(why)) {
            out.outcome = GroupRead::Outcome::redirected;
            out.redirect = redirect;
            return out;
        }
        if (looks > 0 && is_error(&all.raw(1)) && !is_error(&all.raw(looks + 1))) {
            // XINFO refused (an ACL): read without the group's position
            // from now on, and check no gaps.
            positions_refused_ = true;
            spdlog::warn("Redis refused XINFO GROUPS ({}); gaps in the streams are not checked", why);
            out.outcome = GroupRead::Outcome::refused;
            return out;
        }
        throw_error(why, "XREADGROUP");
    }
    const redisReply* read = replies.back();
    if (is_error(read)) {
        if (auto redirect = redirection(reply_text(read))) {  // MULTI refused, the commands ran alone
            out.outcome = GroupRead::Outcome::redirected;
            out.redirect = redirect;
            return out;
        }
        throw_error(*read, "XREADGROUP");
    }

    for (std::size_t i = 0; i < looks; ++i)
        if (auto last = group_last_delivered(replies[i], config_.consumer_group))
            delivered[std::string(streams[i])] = *last;
    if (read->type == REDIS_REPLY_ARRAY) {
        for (std::size_t i = 0; i < read->elements; ++i) {
            const redisReply* s = read->element[i];
            auto part = parse_entries(std::string(reply_text(s->element[0])), s->element[1]);
            out.entries.insert(out.entries.end(), std::make_move_iterator(part.begin()),
                               std::make_move_iterator(part.end()));
        }
    }
    return out;
}

// The XREAD that waits for an entry after the group's position in each
// stream ("$" where it is unknown), without reading it for the group.
std::vector<std::string> StreamReader::wait_argv(const std::vector<std::string_view>& streams,
                                                 const std::map<std::string, Position>& delivered,
                                                 std::chrono::milliseconds block) const {
    std::vector<std::string> wait{"XREAD", "COUNT", "1", "BLOCK", std::to_string(block.count()), "STREAMS"};
    wait.insert(wait.end(), streams.begin(), streams.end());
    for (const auto s : streams) {
        const auto d = delivered.find(std::string(s));
        wait.push_back(d == delivered.end() ? std::string("$") : d->second.to_string());
    }
    return wait;
}


// The streams are read in one transaction on one server. In a Redis
// Cluster one transaction names the keys of one slot only (CROSSSLOT
// otherwise): the streams are read slot by slot, each slot's in a
// transaction on its master with the group's position in each, which
// tells gaps as exactly as on one server. A MOVED reply (a reshard, a
// failover) reads the slot map again and the slot is read anew. An ASK
// reply (the slot is being migrated and its streams have left the node)
// reads them on the node named, after ASKING, without the group's
// position: gaps in them are not checked that once. When nothing was
// read, each slot's wait (XREAD after the group's position) lasts an
// equal share of --block, so that the wait for a new entry stays about
// --block.
std::vector<StreamEntry> StreamReader::read(const std::vector<std::string>& names,
                                            const std::function<void(const Gap&)>& gap, bool wait_for_entries) {
    std::map<int, std::vector<std::string_view>> by_slot;
    const bool per_slot = redis_->per_slot();
    for (const auto& s : names) by_slot[per_slot ? key_slot(s) : 0].emplace_back(s);
    std::vector<StreamEntry> entries;
    std::map<std::string, Position> delivered;
    try {
        for (const auto& [slot, streams] : by_slot) {
            for (int attempt = 0;; ++attempt) {
                auto read = read_group(redis_->node_for(streams.front()), streams, delivered);
                // XINFO refused: nothing ran; read again without the positions.
                if (read.outcome == GroupRead::Outcome::refused) continue;
                if (read.outcome == GroupRead::Outcome::read) {
                    entries.insert(entries.end(), std::make_move_iterator(read.entries.begin()),
                                   std::make_move_iterator(read.entries.end()));
                    break;
                }
                if (attempt >= kMaxClusterRedirects)
                    throw RedisError(RedisError::Kind::reply, "XREADGROUP: hash slot " + std::to_string(slot) +
                                                                  " keeps moving (" + read.redirect->host + ":" +
                                                                  std::to_string(read.redirect->port) + ")");
                if (read.redirect->kind == Redirect::Kind::moved) {
                    spdlog::debug("slot {} moved to {}:{}; reading the slot map again", slot, read.redirect->host,
                                  read.redirect->port);
                    redis_->refresh();
                    continue;
                }
                const auto count = std::to_string(config_.consume_batch_size);
                std::vector<std::string_view> argv{"XREADGROUP", "GROUP", config_.consumer_group, config_.worker,
                                                   "COUNT",      count,   "STREAMS"};
                argv.insert(argv.end(), streams.begin(), streams.end());
                for (std::size_t i = 0; i < streams.size(); ++i) argv.emplace_back(">");
                spdlog::debug("slot {} is being migrated to {}:{}; its streams read there without gap checks", slot,
                              read.redirect->host, read.redirect->port);
                auto r = redis_->command(streams.front(), argv, "XREADGROUP");
                for (const auto s : streams) delivered.erase(std::string(s));
                if (r->type == REDIS_REPLY_ARRAY)
                    for (std::size_t i = 0; i < r->elements; ++i) {
                        const redisReply* s = r->element[i];
                        auto part = parse_entries(std::string(reply_text(s->element[0])), s->element[1]);
                        entries.insert(entries.end(), std::make_move_iterator(part.begin()),
                                       std::make_move_iterator(part.end()));
                    }
                break;
            }
            if (stop_) break;
        }
    } catch (const RedisError&) {
        // A slot's read failed after others were read: their entries stay
        // pending for this worker (applied after --min-idle, as a dead
        // worker's), but the gaps they reveal are reported now, while the
        // group's positions read with them are known.
        if (!entries.empty()) report_gaps(std::move(delivered), entries, gap);
        throw;
    }
    if (!entries.empty()) {
        report_gaps(std::move(delivered), entries, gap);
        return entries;
    }
    if (stop_ || !wait_for_entries) return entries;
    const auto share = std::max(std::chrono::milliseconds(1),
                                config_.block / static_cast<std::chrono::milliseconds::rep>(by_slot.size()));
    for (const auto& [slot, streams] : by_slot) {
        const auto wait = wait_argv(streams, delivered, share);
        auto r = redis_->command(streams.front(), std::vector<std::string_view>(wait.begin(), wait.end()), "XREAD");
        if (r->type == REDIS_REPLY_ARRAY || stop_) break;  // an entry came: the next turn reads it
    }
    return entries;
}

void StreamReader::report_gaps(std::map<std::string, Position> delivered, const std::vector<StreamEntry>& entries,
                               const std::function<void(const Gap&)>& gap) {
    for (const auto& g : find_gaps(std::move(delivered), entries)) {
        metrics_.count_gap(g.stream);
        spdlog::warn("stream \"{}\": gap {}: {}", g.stream, g.range(), g.reason());
        gap(g);
    }
}

std::optional<ClaimPage> StreamReader::claim(const std::string& stream, const std::string& min_idle,
                                             const std::string& cursor) {
    const auto count = std::to_string(config_.consume_batch_size);
    auto r = command(stream,
                     {"XAUTOCLAIM", stream, config_.consumer_group, config_.worker, min_idle, cursor, "COUNT", count},
                     "XAUTOCLAIM " + stream);
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) return std::nullopt;
    ClaimPage page;
    page.cursor = std::string(reply_text(r->element[0]));
    page.entries = parse_entries(stream, r->element[1]);
    if (r->elements >= 3) {
        const redisReply* deleted = r->element[2];
        for (std::size_t i = 0; i < deleted->elements; ++i)
            page.deleted.emplace_back(reply_text(deleted->element[i]));
    }
    return page;
}

void StreamReader::count_deliveries(const std::string& stream, std::vector<StreamEntry>& entries) {
    // Delivery counts, XAUTOCLAIM's own included.
    auto p = command(stream, {"XPENDING", stream, config_.consumer_group, entries.front().id, entries.back().id,
                              std::to_string(entries.size()), config_.worker},
                     "XPENDING " + stream);
    std::map<std::string, long long> deliveries;
    for (std::size_t i = 0; i < p->elements; ++i)
        deliveries[std::string(reply_text(p->element[i]->element[0]))] = p->element[i]->element[3]->integer;
    for (auto& e : entries) e.deliveries = deliveries.count(e.id) ? deliveries[e.id] : 2;
    metrics_.entries_reclaimed += entries.size();
    spdlog::info("reclaimed {} pending entries of stream \"{}\"", entries.size(), stream);
}

double StreamReader::oldest_pending_idle(const std::string& stream) {
    // Best effort: an error reply leaves the gauge as it is.
    auto oldest = command_raw(stream, {"XPENDING", stream, config_.consumer_group, "-", "+", "1"});
    if (oldest->type == REDIS_REPLY_ARRAY && oldest->elements > 0)
        return oldest->element[0]->element[2]->integer / 1000.0;
    return 0;
}

// Entries trimmed from the stream before this group read them never reach
// XREADGROUP. Redis 7 counts them: the group's lag (entries added after
// its position) exceeds the entries the stream still holds after that
// position, and the first entry left is beyond it. They become one dead
// letter for the range of ids, so that a loss is reported, never silent
// (republish them from the producer's outbox with outbox_rewind if they
// matter), and the group moves to the first entry left (skip_trimmed()).
std::optional<TrimmedRange> StreamReader::trimmed_unread(const std::string& stream) {
    // An error reply (no such key, ...) leaves nothing to tell. The
    // stream's counts and the group's must be read in one command: read
    // apart, entries added in between would count as lost. FULL gives both
    // (COUNT 1 keeps the listed entries and pending entries short).
    auto info = command_raw(stream, {"XINFO", "STREAM", stream, "FULL", "COUNT", "1"});
    if (info->type != REDIS_REPLY_ARRAY) return std::nullopt;
    const redisReply* groups = map_field(info.get(), "groups");
    if (groups == nullptr || groups->type != REDIS_REPLY_ARRAY) return std::nullopt;
    const redisReply* length_field = map_field(info.get(), "length");
    const redisReply* added_field = map_field(info.get(), "entries-added");
    const redisReply* first_field = map_field(info.get(), "recorded-first-entry-id");
    const long long length = length_field ? length_field->integer : -1;
    const long long added = added_field ? added_field->integer : -1;
    const std::optional<Position> first = first_field ? Position::parse(reply_text(first_field)) : std::nullopt;
    std::optional<Position> last;
    long long lag = -1;
    for (std::size_t g = 0; g < groups->elements; ++g) {
        const redisReply* group = groups->element[g];
        const redisReply* name = map_field(group, "name");
        if (name == nullptr || reply_text(name) != config_.consumer_group) continue;
        if (const redisReply* id = map_field(group, "last-delivered-id")) last = Position::parse(reply_text(id));
        if (const redisReply* l = map_field(group, "lag"); l && l->type == REDIS_REPLY_INTEGER) lag = l->integer;
    }
    if (!first || !last || length < 0 || added < 0 || lag < 0) return std::nullopt;  // lag unknown: nothing to tell
    if (!(*last < *first) || lag <= length) return std::nullopt;
    TrimmedRange range{stream, *last, *first, lag - length, added - length};
    spdlog::error("stream \"{}\": {}", stream, range.reason());
    return range;
}

void StreamReader::skip_trimmed(const TrimmedRange& range) {
    // Move the group to just before the first entry left, with the count
    // of entries read made right, so that the range is reported once.
    const Position& first = range.first;
    const Position before = first.minor > 0 ? Position{first.major, first.minor - 1}
                                            : Position{first.major - 1, UINT64_MAX};
    command(range.stream, {"XGROUP", "SETID", range.stream, config_.consumer_group, before.to_string(), "ENTRIESREAD",
                           std::to_string(range.entries_read)},
            "XGROUP SETID " + range.stream);
}

void StreamReader::release(const StreamEntry& e) {
    // This delivery does not count: the entry's delivery counter goes back
    // to what it was before (and its idle time restarts, so that no other
    // worker reclaims it while this one retries).
    command(e.stream, {"XCLAIM", e.stream, config_.consumer_group, config_.worker, "0", e.id, "RETRYCOUNT",
                       std::to_string(std::max(0LL, e.deliveries - 1)), "JUSTID"},
            "XCLAIM " + e.stream);
}

void StreamReader::ack(const std::vector<const StreamEntry*>& entries) {
    std::map<std::string, std::vector<std::string_view>> by_stream;
    for (const auto* e : entries) by_stream[e->stream].push_back(e->id);
    for (auto& [stream, ids] : by_stream) {
        std::vector<std::string_view> argv{"XACK", stream, config_.consumer_group};
        argv.insert(argv.end(), ids.begin(), ids.end());
        // On one Redis, the reply is read with the next command's: the
        // entries are committed, and an acknowledgement that fails (the
        // group was deleted) leaves them pending for a reclaim that finds
        // them applied.
        redis_->send_unawaited(stream, argv, "XACK " + stream);
    }
}

}  // namespace pg_outbox
