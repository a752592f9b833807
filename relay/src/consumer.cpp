#include "pg_outbox/consumer.hpp"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/position.hpp"

namespace pg_outbox {

namespace {

constexpr const char* kConsumeSql =
    "SELECT ord, status, error_code, error_message FROM inbox_consume($1, $2, $3, $4, $5, $6, $7)";
constexpr const char* kDeadLetterSql =
    "SELECT inbox_dead_letter($1, $2, $3, $4::uuid, $5, $6, $7::jsonb, $8::jsonb, $9, $10, $11)";

const std::string* field(const StreamEntry& e, const char* name) {
    const auto it = e.fields.find(name);
    return it == e.fields.end() ? nullptr : &it->second;
}

bool looks_like_uuid(const std::string& s) {
    if (s.size() != 36) return false;
    for (std::size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? c != '-' : !std::isxdigit(static_cast<unsigned char>(c))) return false;
    }
    return true;
}

void check_reply(const RedisReply& r, const std::string& what) {
    if (r->type == REDIS_REPLY_ERROR)
        throw RedisError(RedisError::Kind::reply, what + ": " + std::string(reply_text(r.get())));
}

}  // namespace

std::string pg_text_array(const std::vector<const std::string*>& values) {
    std::string out = "{";
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) out += ',';
        if (values[i] == nullptr) {
            out += "NULL";
            continue;
        }
        out += '"';
        for (char c : *values[i]) {
            if (c == '"' || c == '\\') out += '\\';
            out += c;
        }
        out += '"';
    }
    out += '}';
    return out;
}

std::vector<StreamEntry> parse_entries(const std::string& stream, const redisReply* list) {
    std::vector<StreamEntry> out;
    if (list == nullptr || list->type != REDIS_REPLY_ARRAY) return out;
    for (std::size_t i = 0; i < list->elements; ++i) {
        const redisReply* e = list->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 2) continue;
        StreamEntry entry;
        entry.stream = stream;
        entry.id = std::string(reply_text(e->element[0]));
        const redisReply* f = e->element[1];
        if (f->type == REDIS_REPLY_ARRAY)
            for (std::size_t j = 0; j + 1 < f->elements; j += 2)
                entry.fields[std::string(reply_text(f->element[j]))] = std::string(reply_text(f->element[j + 1]));
        out.push_back(std::move(entry));
    }
    return out;
}

Consumer::Consumer(const Config& config, Metrics& metrics, const std::atomic<bool>& stop)
    : Service(config, metrics, stop, "pg_outbox_relay consume " + config.consumer) {
    spdlog::info("consumer \"{}\" (worker \"{}\", group \"{}\") reading {} stream(s) from {}", config_.consumer,
                 config_.worker, config_.consumer_group, config_.streams.size(), config_.redis.to_string());
}

// Creates the consumer group on each stream (and the stream) if missing.
void Consumer::ensure_groups() {
    for (const auto& stream : config_.streams) {
        auto r = redis_->command({"XGROUP", "CREATE", stream, config_.consumer_group, config_.start_id, "MKSTREAM"});
        if (r->type == REDIS_REPLY_ERROR) {
            const auto msg = reply_text(r.get());
            if (msg.rfind("BUSYGROUP", 0) != 0)
                throw RedisError(RedisError::Kind::reply, "XGROUP CREATE " + stream + ": " + std::string(msg));
        } else {
            spdlog::info("created consumer group \"{}\" on stream \"{}\" from {}", config_.consumer_group, stream,
                         config_.start_id);
        }
    }
    groups_ready_ = true;
}

std::vector<StreamEntry> Consumer::read_new() {
    const auto count = std::to_string(config_.consume_batch_size);
    const auto block = std::to_string(config_.block.count());
    std::vector<std::string_view> argv{"XREADGROUP", "GROUP", config_.consumer_group, config_.worker, "COUNT",
                                       count, "BLOCK", block, "STREAMS"};
    for (const auto& s : config_.streams) argv.emplace_back(s);
    for (std::size_t i = 0; i < config_.streams.size(); ++i) argv.emplace_back(">");
    auto r = redis_->command(argv);
    check_reply(r, "XREADGROUP");
    std::vector<StreamEntry> entries;
    if (r->type != REDIS_REPLY_ARRAY) return entries;  // timeout
    for (std::size_t i = 0; i < r->elements; ++i) {
        const redisReply* s = r->element[i];
        auto part = parse_entries(std::string(reply_text(s->element[0])), s->element[1]);
        entries.insert(entries.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
    }
    return entries;
}

// Claims the pending entries of workers that died or hang (idle longer
// than --min-idle; this worker's own failed entries included), looping on
// XAUTOCLAIM's cursor, and applies them. Entries trimmed from the stream
// while pending come back as deleted ids and become dead letters.
void Consumer::reclaim() {
    const auto min_idle = std::to_string(config_.min_idle.count());
    const auto count = std::to_string(config_.consume_batch_size);
    double oldest_idle = 0;
    for (const auto& stream : config_.streams) {
        std::string cursor = "0-0";
        do {
            auto r = redis_->command(
                {"XAUTOCLAIM", stream, config_.consumer_group, config_.worker, min_idle, cursor, "COUNT", count});
            check_reply(r, "XAUTOCLAIM " + stream);
            if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) break;
            cursor = std::string(reply_text(r->element[0]));
            auto entries = parse_entries(stream, r->element[1]);
            if (r->elements >= 3) {
                const redisReply* deleted = r->element[2];
                for (std::size_t i = 0; i < deleted->elements; ++i) {
                    StreamEntry gone;
                    gone.stream = stream;
                    gone.id = std::string(reply_text(deleted->element[i]));
                    spdlog::error("entry {} of stream \"{}\" was deleted from the stream before it was applied",
                                  gone.id, stream);
                    dead_letter(gone, "entry was deleted from the stream (trimmed) before it was applied", std::nullopt);
                }
            }
            if (entries.empty()) continue;
            // Delivery counts, XAUTOCLAIM's own included.
            auto p = redis_->command({"XPENDING", stream, config_.consumer_group, entries.front().id,
                                      entries.back().id, std::to_string(entries.size()), config_.worker});
            check_reply(p, "XPENDING " + stream);
            std::map<std::string, long long> deliveries;
            for (std::size_t i = 0; i < p->elements; ++i)
                deliveries[std::string(reply_text(p->element[i]->element[0]))] = p->element[i]->element[3]->integer;
            for (auto& e : entries) e.deliveries = deliveries.count(e.id) ? deliveries[e.id] : 2;
            metrics_.entries_reclaimed += entries.size();
            spdlog::info("reclaimed {} pending entries of stream \"{}\"", entries.size(), stream);
            apply(entries);
        } while (cursor != "0-0" && !stop_);
        report_trimmed_unread(stream);
        auto oldest = redis_->command({"XPENDING", stream, config_.consumer_group, "-", "+", "1"});
        if (oldest->type == REDIS_REPLY_ARRAY && oldest->elements > 0)
            oldest_idle = std::max(oldest_idle, oldest->element[0]->element[2]->integer / 1000.0);
    }
    metrics_.pending_oldest_idle_seconds = oldest_idle;
}

// Entries trimmed from the stream before this group read them never reach
// XREADGROUP. Redis 7 counts them: the group's lag (entries added after
// its position) exceeds the entries the stream still holds after that
// position, and the first entry left is beyond it. They become one dead
// letter for the range of ids, so that a loss is reported, never silent
// (republish them from the producer's outbox with outbox_rewind if they
// matter), and the group moves to the first entry left.
void Consumer::report_trimmed_unread(const std::string& stream) {
    auto info = redis_->command({"XINFO", "STREAM", stream});
    auto groups = redis_->command({"XINFO", "GROUPS", stream});
    if (info->type != REDIS_REPLY_ARRAY || groups->type != REDIS_REPLY_ARRAY) return;
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
    if (!first || !last || length < 0 || added < 0 || lag < 0) return;  // lag unknown: nothing to tell
    if (!(*last < *first) || lag <= length) return;
    const auto lost = lag - length;
    StreamEntry range;
    range.stream = stream;
    range.id = "(" + last->to_string() + " " + first->to_string() + ")";
    const std::string reason = std::to_string(lost) + " entries with ids after " + last->to_string() +
                               " and before " + first->to_string() +
                               " were trimmed from the stream before this consumer group read them";
    spdlog::error("stream \"{}\": {}", stream, reason);
    dead_letter(range, reason, std::nullopt);
    // Move the group to just before the first entry left, with the count
    // of entries read made right, so that the range is reported once.
    const Position before = first->minor > 0 ? Position{first->major, first->minor - 1}
                                             : Position{first->major - 1, UINT64_MAX};
    auto r = redis_->command({"XGROUP", "SETID", stream, config_.consumer_group, before.to_string(), "ENTRIESREAD",
                              std::to_string(added - length)});
    check_reply(r, "XGROUP SETID " + stream);
}

void Consumer::apply(const std::vector<StreamEntry>& entries) {
    std::vector<const StreamEntry*> ready;
    std::vector<const StreamEntry*> done;
    for (const auto& e : entries) {
        if (field(e, "event_id") == nullptr || field(e, "payload") == nullptr || field(e, "topic") == nullptr) {
            dead_letter(e, "malformed entry: it lacks an event_id, topic or payload field", std::nullopt);
            done.push_back(&e);
        } else {
            ready.push_back(&e);
        }
    }
    if (!ready.empty()) {
        std::vector<const std::string*> ids, topics, keys, payloads, headers;
        for (const auto* e : ready) {
            ids.push_back(field(*e, "event_id"));
            topics.push_back(field(*e, "topic"));
            keys.push_back(field(*e, "key"));
            payloads.push_back(field(*e, "payload"));
            headers.push_back(field(*e, "headers"));
        }
        const auto t0 = std::chrono::steady_clock::now();
        auto r = pg_->exec(kConsumeSql, {config_.consumer, config_.handler, pg_text_array(ids), pg_text_array(topics),
                                         pg_text_array(keys), pg_text_array(payloads), pg_text_array(headers)});
        metrics_.pg_rtt_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // Committed: what follows may be acknowledged.
        for (int i = 0; i < r.rows(); ++i) {
            const auto ord = std::stoul(std::string(r.get(i, 0)));
            const StreamEntry& e = *ready.at(ord - 1);
            const auto status = r.get(i, 1);
            if (status == "applied") {
                metrics_.events_applied++;
                done.push_back(&e);
            } else if (status == "duplicate") {
                metrics_.events_duplicate++;
                spdlog::info("entry {} of \"{}\": event {} was applied before; acknowledged", e.id, e.stream,
                              *field(e, "event_id"));
                done.push_back(&e);
            } else if (status == "conflict") {
                metrics_.events_conflict++;
                spdlog::error("entry {} of \"{}\": {}", e.id, e.stream, r.get(i, 3));
                dead_letter(e, std::string(r.get(i, 3)), std::string(r.get(i, 2)));
                done.push_back(&e);
            } else {
                metrics_.events_failed++;
                if (e.deliveries >= config_.max_deliveries) {
                    spdlog::error("entry {} of \"{}\" failed {} times, dead-lettered: {} (SQLSTATE {})", e.id,
                                  e.stream, e.deliveries, r.get(i, 3), r.get(i, 2));
                    dead_letter(e, std::string(r.get(i, 3)), std::string(r.get(i, 2)));
                    done.push_back(&e);
                } else {
                    spdlog::warn("entry {} of \"{}\" failed (delivery {} of {}), stays pending: {} (SQLSTATE {})",
                                 e.id, e.stream, e.deliveries, config_.max_deliveries, r.get(i, 3), r.get(i, 2));
                }
            }
        }
    }
    ack(done);
}

void Consumer::dead_letter(const StreamEntry& e, const std::string& reason, const std::optional<std::string>& sqlstate) {
    auto optional_field = [&](const char* name) -> Param {
        const auto* v = field(e, name);
        return v ? Param(*v) : std::nullopt;
    };
    auto json_field = [&](const char* name) -> Param {
        const auto* v = field(e, name);
        return v && nlohmann::json::accept(*v) ? Param(*v) : std::nullopt;
    };
    const auto* id = field(e, "event_id");
    std::string why = reason;
    if (const auto* p = field(e, "payload"); p && !nlohmann::json::accept(*p)) why += " (payload is not JSON: " + *p + ")";
    pg_->exec(kDeadLetterSql,
              {config_.consumer, e.stream, e.id, id && looks_like_uuid(*id) ? Param(*id) : std::nullopt,
               optional_field("topic"), optional_field("key"), json_field("payload"), json_field("headers"), why,
               sqlstate ? Param(*sqlstate) : std::nullopt, std::to_string(e.deliveries)});
    metrics_.dead_letters++;
}

void Consumer::ack(const std::vector<const StreamEntry*>& entries) {
    std::map<std::string, std::vector<std::string_view>> by_stream;
    for (const auto* e : entries) by_stream[e->stream].push_back(e->id);
    for (auto& [stream, ids] : by_stream) {
        std::vector<std::string_view> argv{"XACK", stream, config_.consumer_group};
        argv.insert(argv.end(), ids.begin(), ids.end());
        auto r = redis_->command(argv);
        check_reply(r, "XACK " + stream);
    }
}

void Consumer::turn() {
    if (!groups_ready_) ensure_groups();
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_claim_) {
        reclaim();
        next_claim_ = now + config_.claim_interval;
    }
    auto entries = read_new();
    if (!entries.empty()) apply(entries);
}

}  // namespace pg_outbox
