#include "pg_outbox/consumer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/event.hpp"
#include "pg_outbox/position.hpp"

namespace pg_outbox {

namespace {

// The consumer's SQL, qualified and typed as every statement of the
// relay's (see group_session.cpp): the session keeps the role's
// search_path for the handler, and these resolve the same whatever it is,
// even after a handler changed it.
constexpr const char* kConsumeSql =
    "SELECT ord, status, error_code, error_message "
    "FROM @extschema@.inbox_consume($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.bytea[], "
    "$4::pg_catalog.bytea[], $5::pg_catalog.bytea[], $6::pg_catalog.bytea[], $7::pg_catalog.bytea[], "
    "$8::pg_catalog.bool)";
constexpr const char* kDeadLetterSql =
    "SELECT @extschema@.inbox_dead_letter($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, "
    "$4::pg_catalog.bytea[], $5::pg_catalog.text, $6::pg_catalog.text, $7::pg_catalog.int4)";
constexpr const char* kConsumerCheckSql = "SELECT @extschema@.inbox_consumer_check($1::pg_catalog.text)";
constexpr const char* kTextCheckSql = "SELECT $1::pg_catalog.text";
constexpr const char* kHandlerCheck = "pg_outbox_handler_check";
constexpr const char* kConsumeStatement = "pg_outbox_consume";

// The OIDs of the handler's parameters: topic text, key text, payload
// jsonb, headers jsonb, event id uuid (as inbox_consume() passes them).
const std::vector<Oid> kHandlerTypes{25, 25, 3802, 3802, 2950};

void put_int32(std::string& out, std::uint32_t v) {
    const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                       static_cast<char>(v)};
    out.append(b, 4);
}

// A size for a log line or a reason.
std::string human_bytes(std::size_t n) {
    if (n >= (1u << 20)) return std::to_string(n >> 20) + " MiB";
    if (n >= 1024) return std::to_string(n >> 10) + " KiB";
    return std::to_string(n) + " bytes";
}

// The first line of a PostgreSQL error, without libpq's prefixes.
std::string first_line(const std::string& message) {
    std::string line = message.substr(0, message.find('\n'));
    for (const std::string_view prefix : {"query failed: ", "ERROR:  "})
        if (line.compare(0, prefix.size(), prefix) == 0) line.erase(0, prefix.size());
    return line;
}

}  // namespace

namespace {

// The words of a SQL statement, upper-cased, for handler_refusal(): key
// words and unquoted identifiers; a quoted identifier, a string or a
// parenthesis is a token of its own that no key word matches ("\"", "'",
// "(", ")"). Comments and white space are skipped, as the server's lexer
// skips them.
std::vector<std::string> sql_words(std::string_view sql) {
    std::vector<std::string> out;
    auto is_word_start = [](unsigned char c) { return std::isalpha(c) || c == '_' || c >= 0x80; };
    auto is_word = [&](unsigned char c) { return is_word_start(c) || std::isdigit(c) || c == '$'; };
    std::size_t i = 0;
    const std::size_t n = sql.size();
    while (i < n) {
        const unsigned char c = static_cast<unsigned char>(sql[i]);
        if (std::isspace(c)) {
            ++i;
        } else if (sql.compare(i, 2, "--") == 0) {
            while (i < n && sql[i] != '\n') ++i;
        } else if (sql.compare(i, 2, "/*") == 0) {
            // Nested, as the server's lexer reads them.
            int depth = 0;
            do {
                if (sql.compare(i, 2, "/*") == 0) {
                    ++depth;
                    i += 2;
                } else if (sql.compare(i, 2, "*/") == 0) {
                    --depth;
                    i += 2;
                } else {
                    ++i;
                }
            } while (i < n && depth > 0);
        } else if (c == '\'' || c == '"') {
            // A string ('' inside) or a quoted identifier ("" inside);
            // E'..' strings take backslash escapes.
            const bool escapes =
                c == '\'' && i > 0 && (sql[i - 1] == 'E' || sql[i - 1] == 'e') && !out.empty() && out.back() == "E";
            if (escapes) out.pop_back();
            ++i;
            while (i < n) {
                if (escapes && sql[i] == '\\') {
                    i += 2;
                } else if (static_cast<unsigned char>(sql[i]) == c) {
                    if (i + 1 < n && static_cast<unsigned char>(sql[i + 1]) == c) {
                        i += 2;
                    } else {
                        ++i;
                        break;
                    }
                } else {
                    ++i;
                }
            }
            out.emplace_back(1, static_cast<char>(c));
        } else if (c == '$') {
            // A dollar-quoted string ($tag$ ... $tag$), or a parameter.
            std::size_t end = i + 1;
            while (end < n && is_word(static_cast<unsigned char>(sql[end])) && sql[end] != '$') ++end;
            if (end < n && sql[end] == '$' && (end == i + 1 || !std::isdigit(static_cast<unsigned char>(sql[i + 1])))) {
                const std::string_view tag = sql.substr(i, end - i + 1);
                const auto close = sql.find(tag, end + 1);
                i = close == std::string_view::npos ? n : close + tag.size();
                out.emplace_back("'");
            } else {
                i = end;
                out.emplace_back("$");
            }
        } else if (is_word_start(c)) {
            std::string word;
            while (i < n && is_word(static_cast<unsigned char>(sql[i])))
                word += static_cast<char>(std::toupper(static_cast<unsigned char>(sql[i++])));
            out.push_back(std::move(word));
        } else {
            out.emplace_back(1, static_cast<char>(c));
            ++i;
        }
    }
    return out;
}

}  // namespace

std::optional<std::string> handler_refusal(std::string_view handler) {
    const auto words = sql_words(handler);
    auto word = [&](std::size_t i) -> std::string_view { return i < words.size() ? words[i] : std::string_view(); };
    auto has = [&](std::string_view w) { return std::find(words.begin(), words.end(), w) != words.end(); };
    const auto first = word(0);
    const std::string name(first);
    auto transaction_control = [&](const std::string& statement) {
        return statement + " is transaction control: inbox_consume() runs the handler inside the worker's "
                           "transaction, which a handler can neither end nor begin (for a savepoint of its own, "
                           "call a function with an EXCEPTION block)";
    };
    auto no_transaction_block = [&](const std::string& statement) {
        return statement + " cannot run inside a transaction block or a function, where inbox_consume() runs the "
                           "handler; run it outside the consumer";
    };
    auto changes_session = [&](const std::string& statement, const std::string& instead) {
        return statement + " changes the worker's session for every entry and statement that follows, not only "
                           "for this entry's transaction" + instead;
    };
    if (first == "BEGIN" || first == "START" || first == "COMMIT" || first == "END" || first == "ROLLBACK" ||
        first == "ABORT" || first == "SAVEPOINT" || first == "RELEASE")
        return transaction_control(name);
    if (first == "PREPARE")
        return word(1) == "TRANSACTION" ? transaction_control("PREPARE TRANSACTION")
                                        : changes_session("PREPARE", " (the next entry's PREPARE fails)");
    if (first == "DEALLOCATE")
        return changes_session("DEALLOCATE", " (it removes the session's prepared statements)");
    if (first == "DISCARD") return changes_session("DISCARD", " (it resets the session's state)");
    if (first == "RESET") return changes_session("RESET", "; use SET LOCAL, which ends with the transaction");
    if (first == "SET") {
        if (word(1) == "LOCAL" || word(1) == "CONSTRAINTS") return std::nullopt;
        if (word(1) == "TRANSACTION")
            return std::string("SET TRANSACTION must come before any query of the transaction, and inbox_consume() "
                               "runs the handler after its own; set it with --pg's options or the role instead");
        return changes_session("SET", "; use SET LOCAL, which ends with the transaction");
    }
    if (first == "LISTEN")
        return std::string("LISTEN subscribes the worker's session to notifications that it never reads: they "
                           "would pile up in its memory");
    if (first == "VACUUM") return no_transaction_block("VACUUM");
    if (first == "ALTER" && word(1) == "SYSTEM") return no_transaction_block("ALTER SYSTEM");
    if ((first == "CREATE" || first == "DROP") && (word(1) == "DATABASE" || word(1) == "TABLESPACE"))
        return no_transaction_block(name + " " + std::string(word(1)));
    if (first == "CREATE" && (word(1) == "INDEX" || (word(1) == "UNIQUE" && word(2) == "INDEX")) &&
        word(word(1) == "UNIQUE" ? 3 : 2) == "CONCURRENTLY")
        return no_transaction_block("CREATE INDEX CONCURRENTLY");
    if (first == "DROP" && word(1) == "INDEX" && word(2) == "CONCURRENTLY")
        return no_transaction_block("DROP INDEX CONCURRENTLY");
    if (first == "REINDEX" && (has("CONCURRENTLY") || word(1) == "SYSTEM" || word(1) == "DATABASE" ||
                               word(1) == "SCHEMA"))
        return no_transaction_block("REINDEX " + std::string(has("CONCURRENTLY") ? "CONCURRENTLY" : word(1)));
    if (first == "CLUSTER") {
        // Without a table (all the tables clustered before): only outside a
        // transaction block.
        std::size_t i = 1;
        if (word(i) == "VERBOSE") ++i;
        if (word(i) == "(") {
            while (i < words.size() && words[i] != ")") ++i;
            ++i;
        }
        if (word(i).empty() || word(i) == ";") return no_transaction_block("CLUSTER without a table");
    }
    if (first == "COPY" && (has("STDIN") || has("STDOUT")))
        return std::string("COPY from or to the client cannot run in a function, where inbox_consume() runs the "
                           "handler; use INSERT, or COPY from or to a file");
    return std::nullopt;
}

const std::string* StreamEntry::field(std::string_view name) const {
    for (const auto& [k, v] : fields)
        if (k == name) return &v;
    return nullptr;
}

std::size_t StreamEntry::count(std::string_view name) const {
    std::size_t n = 0;
    for (const auto& f : fields) n += f.first == name;
    return n;
}

std::size_t StreamEntry::bytes() const {
    std::size_t n = 0;
    for (const auto& [k, v] : fields) n += k.size() + v.size();
    return n;
}

std::string pg_bytea_array(const std::vector<const std::string*>& values) {
    constexpr std::uint32_t kByteaOid = 17;
    std::size_t size = 20;
    bool has_null = false;
    for (const auto* v : values) {
        size += 4 + (v ? v->size() : 0);
        has_null = has_null || v == nullptr;
    }
    std::string out;
    out.reserve(size);
    put_int32(out, values.empty() ? 0 : 1);  // dimensions
    put_int32(out, has_null ? 1 : 0);
    put_int32(out, kByteaOid);
    if (values.empty()) return out;
    put_int32(out, static_cast<std::uint32_t>(values.size()));
    put_int32(out, 1);  // lower bound
    for (const auto* v : values) {
        if (v == nullptr) {
            put_int32(out, 0xFFFFFFFFu);
            continue;
        }
        put_int32(out, static_cast<std::uint32_t>(v->size()));
        out.append(*v);
    }
    return out;
}

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
        out.push_back(std::move(entry));
    }
    return out;
}

std::optional<std::pair<std::string, std::string>> framing_fault(const StreamEntry& entry) {
    for (const auto name : kEntryFields)
        if (const auto n = entry.count(name); n > 1)
            return std::pair{"field \"" + std::string(name) + "\" appears " + std::to_string(n) +
                                 " times in the entry",
                             std::string("22023")};
    std::size_t bytes = 0;
    for (const auto name : kEntryFields)
        if (const auto* v = entry.field(name)) bytes += v->size();
    if (bytes > kMaxEntryBytes)
        return std::pair{"the entry is " + human_bytes(bytes) + "; the consumer applies entries of up to " +
                             human_bytes(kMaxEntryBytes),
                         std::string("54000")};
    if (auto prev = entry_prev(entry); prev.kind == EntryPrev::Kind::malformed)
        return std::pair{std::move(prev.fault), std::move(prev.sqlstate)};
    return std::nullopt;
}

EntryPrev entry_prev(const StreamEntry& entry) {
    EntryPrev out;
    const std::string* value = entry.field(kPrevField);
    if (value == nullptr) return out;
    out.kind = EntryPrev::Kind::malformed;
    if (const auto n = entry.count(kPrevField); n > 1) {
        out.fault = "field \"prev\" appears " + std::to_string(n) + " times in the entry";
        out.sqlstate = "22023";
        return out;
    }
    // "<u64>-<u64>": at most 41 bytes. Anything else is not quoted (it
    // may be huge or hold any bytes); the dead letter keeps it.
    const auto parsed = value->size() <= 41 ? Position::parse(*value) : std::nullopt;
    if (!parsed || !std::all_of(value->begin(), value->end(), [](char c) { return c == '-' || (c >= '0' && c <= '9'); })) {
        out.fault = "field \"prev\" is not a stream entry id (" + std::to_string(value->size()) + " bytes)";
        out.sqlstate = "22P02";
        return out;
    }
    const auto own = Position::parse(entry.id);
    if (own && !(*parsed < *own)) {
        out.fault = "field \"prev\" names " + parsed->to_string() + ", not an entry before the entry itself";
        out.sqlstate = "22023";
        return out;
    }
    out.kind = EntryPrev::Kind::valid;
    out.prev = *parsed;
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

Consumer::Consumer(const Config& config, Metrics& metrics, const std::atomic<bool>& stop)
    : Service(config, metrics, stop, "pg_outbox_relay consume " + config.consumer),
      hold_backoff_(config.retry_min, config.retry_max) {
    for (const auto& stream : config_.streams) metrics_.add_gap_stream(stream);
    spdlog::info("consumer \"{}\" (worker \"{}\", group \"{}\") reading {} stream(s) from {}", config_.consumer,
                 config_.worker, config_.consumer_group, config_.streams.size(), config_.redis.to_string());
    if (config_.pool) {
        pool_.emplace(config_, metrics_, [this](std::string_view key, const std::vector<std::string_view>& argv) {
            return command(key, argv, "pool");
        });
        spdlog::info("pool: each stream read by one live worker at a time (lease {} ms, renewed every {} ms)",
                     config_.pool_lease.count(), config_.pool_renew.count());
    }
}

std::vector<std::string> Consumer::reading() const {
    if (!pool_) return config_.streams;
    std::vector<std::string> out;
    for (auto& s : pool_->held())
        if (!unsettled_.count(s)) out.push_back(std::move(s));
    return out;
}

void Consumer::keep_pool() {
    if (!pool_ || !pool_->due()) return;
    for (auto& s : pool_->maintain()) unsettled_.insert(std::move(s));
}

void Consumer::wait(std::chrono::milliseconds d) {
    if (!pool_) return pause(d);
    // In steps of --pool-renew at most, renewing in between.
    while (d.count() > 0 && !stop_) {
        const auto step = std::min(d, config_.pool_renew);
        pause(step);
        d -= step;
        keep_pool();
    }
}

void Consumer::on_stop() {
    // Without a connection the holds run out after --pool-lease.
    if (pool_ && redis_) pool_->leave();
}

void Consumer::on_redis_connected() {
    groups_ready_ = false;
}

void Consumer::on_redis_fault() {
    groups_ready_ = false;
    // A cluster's nodes are connected to again; a failover under a
    // Sentinel address: the next connection is to the new master.
    reset_redis_after_fault();
}

RedisReply Consumer::command(std::string_view stream, const std::vector<std::string_view>& argv,
                             std::string_view context) {
    return redis_->command(stream, argv, context);
}

RedisReply Consumer::command_raw(std::string_view stream, const std::vector<std::string_view>& argv) {
    return redis_->command_raw(stream, argv);
}

void Consumer::on_pg_connected() {
    // Only at start-up: a fault that appears later is held and retried.
    if (!validated_) {
        validate_settings();
        validated_ = true;
    }
    // Made once a session: its planning is the same for every batch.
    pg_->prepare(kConsumeStatement, extension_.sql(kConsumeSql));
}

void Consumer::validate_settings() {
    // A transient error is retried like any other; everything else means
    // the setting cannot work.
    auto refuse = [](const std::string& setting, const PgError& e) {
        if (e.retryable()) throw e;
        return ConfigError(setting + ": " + e.what() + " (SQLSTATE " + e.sqlstate() + ")");
    };
    try {
        pg_->exec(extension_.sql(kConsumerCheckSql), {config_.consumer});
    } catch (const PgError& e) {
        throw refuse("--consumer \"" + config_.consumer + "\"", e);
    }
    for (const auto& stream : config_.streams) {
        try {
            pg_->exec(kTextCheckSql, {stream});
        } catch (const PgError& e) {
            throw refuse("--stream", e);
        }
    }
    // The handler as inbox_consume() runs it: one statement with the five
    // parameter types. EXPLAIN of its generic plan checks the privileges
    // on what it names (tables, the functions it calls) without running it.
    try {
        pg_->prepare(kHandlerCheck, config_.handler, kHandlerTypes);
        // One statement the server parsed: its words are those of a
        // statement, whatever they look like.
        if (auto why = handler_refusal(config_.handler)) {
            pg_->exec(std::string("DEALLOCATE ") + kHandlerCheck);
            throw ConfigError("--handler: " + *why);
        }
        pg_->exec("SET plan_cache_mode = force_generic_plan");
        pg_->exec(std::string("EXPLAIN (COSTS OFF) EXECUTE ") + kHandlerCheck + "(NULL, NULL, NULL, NULL, NULL)");
        pg_->exec("RESET plan_cache_mode");
        pg_->exec(std::string("DEALLOCATE ") + kHandlerCheck);
    } catch (const PgError& e) {
        throw refuse("--handler", e);
    }
    spdlog::info("consumer \"{}\" and the handler checked", config_.consumer);
}

// Creates the consumer group on each stream (and the stream) if missing.
void Consumer::ensure_groups() {
    for (const auto& stream : config_.streams) {
        // An existing group (BUSYGROUP) is fine: the reply is looked at.
        auto r =
            command_raw(stream, {"XGROUP", "CREATE", stream, config_.consumer_group, config_.start_id, "MKSTREAM"});
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

Consumer::GroupRead Consumer::read_group(RedisConnection& redis, const std::vector<std::string_view>& streams,
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
    // Read every reply, whatever the first ones say.
    auto multi = redis.get_reply_raw();
    std::vector<RedisReply> queued;
    for (std::size_t i = 0; i <= looks; ++i) queued.push_back(redis.get_reply_raw());
    auto exec = redis.get_reply_raw();

    // The replies: EXEC's, or, when Redis refused MULTI (an ACL, a proxy),
    // the commands' own.
    std::vector<const redisReply*> replies;
    if (multi->type == REDIS_REPLY_ERROR) {
        if (!multi_refused_warned_) {
            multi_refused_warned_ = true;
            spdlog::warn("Redis refused MULTI ({}); the group's position and the read are two commands: gaps are "
                         "reported exactly only while this worker reads the group alone",
                         reply_text(multi.get()));
        }
        for (const auto& r : queued) replies.push_back(r.get());
    } else if (exec->type == REDIS_REPLY_ARRAY && exec->elements == looks + 1) {
        for (std::size_t i = 0; i < exec->elements; ++i) replies.push_back(exec->element[i]);
    } else {
        // Nothing ran: a command was refused when queued; its error names
        // the cause (NOPERM, or in a cluster MOVED or ASK: the slot is
        // served by another node now).
        std::string why(reply_text(exec.get()));
        for (const auto& r : queued)
            if (r->type == REDIS_REPLY_ERROR) {
                why = std::string(reply_text(r.get()));
                break;
            }
        if (cluster())
            if (auto redirect = parse_redirect(why)) {
                out.outcome = GroupRead::Outcome::redirected;
                out.redirect = redirect;
                return out;
            }
        if (looks > 0 && queued[0]->type == REDIS_REPLY_ERROR && queued.back()->type != REDIS_REPLY_ERROR) {
            // XINFO refused (an ACL): read without the group's position
            // from now on, and check no gaps.
            positions_refused_ = true;
            spdlog::warn("Redis refused XINFO GROUPS ({}); gaps in the streams are not checked", why);
            out.outcome = GroupRead::Outcome::refused;
            return out;
        }
        throw RedisError(RedisError::Kind::reply, "XREADGROUP: " + why);
    }
    const redisReply* read = replies.back();
    if (read->type == REDIS_REPLY_ERROR) {
        if (cluster())
            if (auto redirect = parse_redirect(reply_text(read))) {  // MULTI refused, the commands ran alone
                out.outcome = GroupRead::Outcome::redirected;
                out.redirect = redirect;
                return out;
            }
        throw RedisError(RedisError::Kind::reply, "XREADGROUP: " + std::string(reply_text(read)));
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
std::vector<std::string> Consumer::wait_argv(const std::vector<std::string_view>& streams,
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

std::vector<StreamEntry> Consumer::read_new() {
    const auto names = reading();
    if (names.empty()) {
        // A pool's worker holding no stream (the others hold their share).
        pause(config_.block);
        return {};
    }
    if (cluster()) return read_new_cluster();
    const std::vector<std::string_view> streams(names.begin(), names.end());
    std::map<std::string, Position> delivered;
    auto read = read_group(redis_->node_for(streams.front()), streams, delivered);
    if (read.outcome != GroupRead::Outcome::read) return {};
    if (read.entries.empty()) {
        // Nothing new: wait for an entry after the group's position (or
        // --block); the next turn reads it.
        const auto wait = wait_argv(streams, delivered, config_.block);
        redis_->command(streams.front(), std::vector<std::string_view>(wait.begin(), wait.end()), "XREAD");
        return {};
    }
    for (const auto& gap : find_gaps(std::move(delivered), read.entries)) report_gap(gap);
    return std::move(read.entries);
}

// In a Redis Cluster one transaction names the keys of one slot only
// (CROSSSLOT otherwise): the streams are read slot by slot, each slot's in
// a transaction on its master with the group's position in each, which
// tells gaps as exactly as on one server. A MOVED reply (a reshard, a
// failover) reads the slot map again and the slot is read anew. An ASK
// reply (the slot is being migrated and its streams have left the node)
// reads them on the node named, after ASKING, without the group's
// position: gaps in them are not checked that once. When no slot had
// anything, each slot's wait (XREAD after the group's position) lasts an
// equal share of --block, so that the wait for a new entry stays about
// --block.
std::vector<StreamEntry> Consumer::read_new_cluster() {
    const auto names = reading();
    std::map<int, std::vector<std::string_view>> by_slot;
    for (const auto& s : names) by_slot[key_slot(s)].emplace_back(s);
    std::vector<StreamEntry> entries;
    std::map<std::string, Position> delivered;
    try {
        for (const auto& [slot, streams] : by_slot) {
            for (int attempt = 0;; ++attempt) {
                auto read = read_group(cluster()->node_for(streams.front()), streams, delivered);
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
                    cluster()->refresh();
                    continue;
                }
                const auto count = std::to_string(config_.consume_batch_size);
                std::vector<std::string_view> argv{"XREADGROUP", "GROUP", config_.consumer_group, config_.worker,
                                                   "COUNT",      count,   "STREAMS"};
                argv.insert(argv.end(), streams.begin(), streams.end());
                for (std::size_t i = 0; i < streams.size(); ++i) argv.emplace_back(">");
                spdlog::debug("slot {} is being migrated to {}:{}; its streams read there without gap checks", slot,
                              read.redirect->host, read.redirect->port);
                auto r = cluster()->command(streams.front(), argv, "XREADGROUP");
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
        if (!entries.empty())
            for (const auto& gap : find_gaps(std::move(delivered), entries)) report_gap(gap);
        throw;
    }
    if (!entries.empty()) {
        for (const auto& gap : find_gaps(std::move(delivered), entries)) report_gap(gap);
        return entries;
    }
    if (stop_) return entries;
    const auto share = std::max(std::chrono::milliseconds(1),
                                config_.block / static_cast<std::chrono::milliseconds::rep>(by_slot.size()));
    for (const auto& [slot, streams] : by_slot) {
        const auto wait = wait_argv(streams, delivered, share);
        auto r = cluster()->command(streams.front(), std::vector<std::string_view>(wait.begin(), wait.end()), "XREAD");
        if (r->type == REDIS_REPLY_ARRAY || stop_) break;  // an entry came: the next turn reads it
    }
    return entries;
}

void Consumer::report_gap(const Gap& gap) {
    metrics_.count_gap(gap.stream);
    const std::string reason = "entries with ids after " + gap.after.to_string() + " up to and including " +
                               gap.through.to_string() +
                               " are missing from the stream (deleted, trimmed or lost before this consumer group "
                               "read them): entry " + gap.found + " names " + gap.through.to_string() +
                               " as the entry before it, and the group's last entry read was " +
                               gap.after.to_string();
    spdlog::warn("stream \"{}\": gap {}: {}", gap.stream, gap.range(), reason);
    StreamEntry range;
    range.stream = gap.stream;
    range.id = gap.range();
    if (auto fault = dead_letter(range, reason, std::nullopt))
        spdlog::error("stream \"{}\": the gap {} could not be dead-lettered: {} (SQLSTATE {})", gap.stream,
                      gap.range(), fault->second, fault->first);
}

// Claims the pending entries of workers that died or hang (idle longer
// than --min-idle; this worker's own failed entries included), looping on
// XAUTOCLAIM's cursor, and applies them. Entries trimmed from the stream
// while pending come back as deleted ids and become dead letters.
void Consumer::reclaim() {
    const auto min_idle = std::to_string(config_.min_idle.count());
    double oldest_idle = 0;
    for (const auto& stream : reading()) oldest_idle = std::max(oldest_idle, reclaim_stream(stream, min_idle));
    metrics_.pending_oldest_idle_seconds = oldest_idle;
}

double Consumer::reclaim_stream(const std::string& stream, const std::string& min_idle) {
    const auto count = std::to_string(config_.consume_batch_size);
    double oldest_idle = 0;
    {
        std::string cursor = "0-0";
        do {
            auto r = command(
                stream, {"XAUTOCLAIM", stream, config_.consumer_group, config_.worker, min_idle, cursor, "COUNT", count},
                "XAUTOCLAIM " + stream);
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
                    if (auto fault = dead_letter(gone, "entry was deleted from the stream (trimmed) before it was applied",
                                                 std::nullopt))
                        spdlog::error("entry {} of stream \"{}\" could not be dead-lettered: {} (SQLSTATE {})",
                                      gone.id, stream, fault->second, fault->first);
                }
            }
            if (entries.empty()) continue;
            // Delivery counts, XAUTOCLAIM's own included.
            auto p = command(stream, {"XPENDING", stream, config_.consumer_group, entries.front().id,
                                      entries.back().id, std::to_string(entries.size()), config_.worker},
                                     "XPENDING " + stream);
            std::map<std::string, long long> deliveries;
            for (std::size_t i = 0; i < p->elements; ++i)
                deliveries[std::string(reply_text(p->element[i]->element[0]))] = p->element[i]->element[3]->integer;
            for (auto& e : entries) e.deliveries = deliveries.count(e.id) ? deliveries[e.id] : 2;
            metrics_.entries_reclaimed += entries.size();
            spdlog::info("reclaimed {} pending entries of stream \"{}\"", entries.size(), stream);
            apply(entries);
        } while (cursor != "0-0" && !stop_ && !lost(stream));
        report_trimmed_unread(stream);
        // Best effort: an error reply leaves the gauge as it is.
        auto oldest = command_raw(stream, {"XPENDING", stream, config_.consumer_group, "-", "+", "1"});
        if (oldest->type == REDIS_REPLY_ARRAY && oldest->elements > 0)
            oldest_idle = oldest->element[0]->element[2]->integer / 1000.0;
    }
    return oldest_idle;
}

// Entries trimmed from the stream before this group read them never reach
// XREADGROUP. Redis 7 counts them: the group's lag (entries added after
// its position) exceeds the entries the stream still holds after that
// position, and the first entry left is beyond it. They become one dead
// letter for the range of ids, so that a loss is reported, never silent
// (republish them from the producer's outbox with outbox_rewind if they
// matter), and the group moves to the first entry left.
void Consumer::report_trimmed_unread(const std::string& stream) {
    // An error reply (no such key, ...) leaves nothing to tell. The
    // stream's counts and the group's must be read in one command: read
    // apart, entries added in between would count as lost. FULL gives both
    // (COUNT 1 keeps the listed entries and pending entries short).
    auto info = command_raw(stream, {"XINFO", "STREAM", stream, "FULL", "COUNT", "1"});
    if (info->type != REDIS_REPLY_ARRAY) return;
    const redisReply* groups = map_field(info.get(), "groups");
    if (groups == nullptr || groups->type != REDIS_REPLY_ARRAY) return;
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
    if (auto fault = dead_letter(range, reason, std::nullopt)) {
        spdlog::error("stream \"{}\": the trimmed range could not be dead-lettered, reported again at the next "
                      "reclaim: {} (SQLSTATE {})",
                      stream, fault->second, fault->first);
        return;
    }
    // Move the group to just before the first entry left, with the count
    // of entries read made right, so that the range is reported once.
    const Position before = first->minor > 0 ? Position{first->major, first->minor - 1}
                                             : Position{first->major - 1, UINT64_MAX};
    command(stream, {"XGROUP", "SETID", stream, config_.consumer_group, before.to_string(), "ENTRIESREAD",
                     std::to_string(added - length)},
                    "XGROUP SETID " + stream);
}

void Consumer::apply(const std::vector<StreamEntry>& entries) {
    // Calls of at most kMaxCallBytes, each acknowledged after its commit.
    std::vector<const StreamEntry*> call;
    std::size_t call_bytes = 0;
    // With --pool, checked before each call: a stream lost meanwhile (the
    // worker was paused past its lease) is applied no further.
    auto drop_lost = [&](std::vector<const StreamEntry*>& list) {
        const auto kept =
            std::remove_if(list.begin(), list.end(), [&](const StreamEntry* e) { return lost(e->stream); });
        if (kept == list.end()) return;
        spdlog::warn("pool: {} entries of streams this worker lost are left to their next owner",
                     std::distance(kept, list.end()));
        list.erase(kept, list.end());
    };
    auto flush = [&] {
        keep_pool();  // a long batch keeps its holds
        drop_lost(call);
        if (call.empty()) return;
        std::vector<const StreamEntry*> done;
        apply_call(call, done);
        ack(done);
        call.clear();
        call_bytes = 0;
    };
    std::vector<const StreamEntry*> done;
    std::size_t next = 0;
    try {
        for (; next < entries.size(); ++next) {
            const auto& e = entries[next];
            if (lost(e.stream)) continue;
            if (auto fault = framing_fault(e)) {
                malformed(e, fault->first, fault->second, done);
                continue;
            }
            const auto bytes = e.bytes();
            if (!call.empty() && call_bytes + bytes > kMaxCallBytes) flush();
            call.push_back(&e);
            call_bytes += bytes;
        }
        flush();
    } catch (const PgError& e) {
        // The connection was lost or the server is restarting: the call
        // that failed and every entry after it are held, and applied
        // first, in their order, once the connection is back. Left
        // pending, they would be reclaimed only after --min-idle, behind
        // newer entries of the same keys.
        if (!e.retryable()) throw;
        const std::string sqlstate = classify_sqlstate(e.sqlstate()) == Fault::transient ? e.sqlstate() : "08006";
        for (const auto* entry : call) hold(*entry, sqlstate, first_line(e.what()));
        for (std::size_t i = next; i < entries.size(); ++i)
            if (!lost(entries[i].stream)) hold(entries[i], sqlstate, first_line(e.what()));
        ack(done);
        throw;
    }
    ack(done);
}

void Consumer::apply_call(const std::vector<const StreamEntry*>& call, std::vector<const StreamEntry*>& done,
                          bool isolate) {
    std::vector<const std::string*> ids, topics, keys, payloads, headers;
    for (const auto* e : call) {
        ids.push_back(e->field("event_id"));
        topics.push_back(e->field("topic"));
        keys.push_back(e->field("key"));
        payloads.push_back(e->field("payload"));
        headers.push_back(e->field("headers"));
    }
    std::optional<PgResult> result;
    try {
        const auto t0 = std::chrono::steady_clock::now();
        result.emplace(pg_->exec_prepared(kConsumeStatement,
                                          {config_.consumer, config_.handler, pg_bytea_array(ids),
                                           pg_bytea_array(topics), pg_bytea_array(keys), pg_bytea_array(payloads),
                                           pg_bytea_array(headers), isolate ? "true" : "false"},
                                          {0, 0, 1, 1, 1, 1, 1, 0}));
        metrics_.pg_rtt_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } catch (const PgError& e) {
        // The whole call failed. A lost connection or a transient error is
        // retried by the service loop, with the entries held (see apply).
        if (e.retryable()) throw;
        if (!isolate) {
            // The batch applied as one, and something raised: an entry's
            // handler or conversion. Nothing of it committed. Again, each
            // entry in a subtransaction of its own, so that the one that
            // raises fails alone; in parts of at most kMaxIsolatedEntries,
            // each a transaction, so that none overflows its backend's
            // subtransaction cache. The parts go in the entries' order.
            metrics_.batches_isolated++;
            spdlog::info("a batch of {} entries failed as one, applying it again entry by entry: {} (SQLSTATE {})",
                         call.size(), first_line(e.what()), e.sqlstate());
            for (std::size_t from = 0; from < call.size(); from += kMaxIsolatedEntries) {
                const auto to = std::min(call.size(), from + kMaxIsolatedEntries);
                std::vector<const StreamEntry*> part(call.begin() + from, call.begin() + to);
                std::vector<const StreamEntry*> part_done;
                apply_call(part, part_done, true);
                ack(part_done);
            }
            return;
        }
        if (classify_sqlstate(e.sqlstate()) == Fault::configuration) {
            for (const auto* entry : call) hold(*entry, e.sqlstate(), first_line(e.what()));
            return;
        }
        // Something one entry did outside its subtransaction (a statement
        // timeout, a deferred constraint at commit): each alone finds it.
        if (call.size() > 1) {
            spdlog::warn("a batch of {} entries failed as a whole, applying them one by one: {} (SQLSTATE {})",
                         call.size(), first_line(e.what()), e.sqlstate());
            for (const auto* entry : call) {
                std::vector<const StreamEntry*> one{entry};
                std::vector<const StreamEntry*> one_done;
                apply_call(one, one_done, true);
                ack(one_done);
            }
            return;
        }
        entry_failed(*call.front(), e.sqlstate(), first_line(e.what()), done);
        return;
    }
    // Committed: what follows may be acknowledged.
    const auto& r = *result;
    for (int i = 0; i < r.rows(); ++i) {
        const auto ord = std::stoul(std::string(r.get(i, 0)));
        const StreamEntry& e = *call.at(ord - 1);
        const auto status = r.get(i, 1);
        const std::string code(r.get(i, 2));
        const std::string message(r.get(i, 3));
        if (status == "applied") {
            metrics_.events_applied++;
            done.push_back(&e);
        } else if (status == "duplicate") {
            metrics_.events_duplicate++;
            spdlog::info("entry {} of \"{}\": event {} was applied before; acknowledged", e.id, e.stream,
                         *e.field("event_id"));
            done.push_back(&e);
        } else if (status == "conflict") {
            metrics_.events_conflict++;
            spdlog::error("entry {} of \"{}\": {}", e.id, e.stream, message);
            if (auto fault = dead_letter(e, message, code))
                hold(e, fault->first, fault->second);
            else
                done.push_back(&e);
        } else if (status == "malformed") {
            malformed(e, message, code, done);
        } else if (classify_sqlstate(code) != Fault::entry) {
            hold(e, code, message);
        } else {
            entry_failed(e, code, message, done);
        }
    }
}

void Consumer::entry_failed(const StreamEntry& e, std::string_view sqlstate, std::string_view message,
                            std::vector<const StreamEntry*>& done) {
    metrics_.events_failed++;
    if (e.deliveries >= config_.max_deliveries) {
        spdlog::error("entry {} of \"{}\" failed {} times, dead-lettered: {} (SQLSTATE {})", e.id, e.stream,
                      e.deliveries, message, sqlstate);
        if (auto fault = dead_letter(e, std::string(message), std::string(sqlstate)))
            hold(e, fault->first, fault->second);
        else
            done.push_back(&e);
    } else {
        spdlog::warn("entry {} of \"{}\" failed (delivery {} of {}), stays pending: {} (SQLSTATE {})", e.id,
                     e.stream, e.deliveries, config_.max_deliveries, message, sqlstate);
    }
}

void Consumer::malformed(const StreamEntry& e, const std::string& reason, const std::string& sqlstate,
                         std::vector<const StreamEntry*>& done) {
    spdlog::error("entry {} of \"{}\" is malformed, dead-lettered and acknowledged: {} (SQLSTATE {})", e.id,
                  e.stream, reason, sqlstate);
    if (auto fault = dead_letter(e, "malformed entry: " + reason, sqlstate)) {
        hold(e, fault->first, fault->second);
    } else {
        metrics_.entries_malformed++;
        done.push_back(&e);
    }
}

void Consumer::hold(const StreamEntry& e, std::string_view sqlstate, std::string_view message) {
    // A lost stream's entry is its next owner's: claiming it back would
    // let that owner read past it.
    if (lost(e.stream)) return;
    // This delivery does not count: the entry's delivery counter goes back
    // to what it was before (and its idle time restarts, so that no other
    // worker reclaims it while this one retries).
    command(e.stream, {"XCLAIM", e.stream, config_.consumer_group, config_.worker, "0", e.id, "RETRYCOUNT",
                     std::to_string(std::max(0LL, e.deliveries - 1)), "JUSTID"},
                    "XCLAIM " + e.stream);
    if (held_.entries.empty()) {
        held_.sqlstate = std::string(sqlstate);
        held_.message = std::string(message);
        held_.fault = classify_sqlstate(sqlstate) == Fault::transient ? Fault::transient : Fault::configuration;
    }
    held_.entries.push_back(e);
}

std::optional<std::pair<std::string, std::string>> Consumer::dead_letter(
    const StreamEntry& e, const std::string& reason, const std::optional<std::string>& sqlstate) {
    // The raw fields, names and values in turn; NULL for an entry gone
    // from the stream (no fields).
    auto record = [&](const std::string& why, std::size_t cut) {
        std::vector<std::string> cut_values;
        std::vector<const std::string*> raw;
        cut_values.reserve(e.fields.size() * 2);
        for (const auto& [k, v] : e.fields) {
            for (const std::string* s : {&k, &v}) {
                if (s->size() > cut) {
                    cut_values.push_back(s->substr(0, cut));
                    raw.push_back(&cut_values.back());
                } else {
                    raw.push_back(s);
                }
            }
        }
        pg_->exec(extension_.sql(kDeadLetterSql),
                  {config_.consumer, e.stream, e.id,
                   e.fields.empty() ? Param(std::nullopt) : Param(pg_bytea_array(raw)), why,
                   sqlstate ? Param(*sqlstate) : std::nullopt, std::to_string(std::max(1LL, e.deliveries))},
                  {0, 0, 0, 1, 0, 0, 0});
    };
    const auto bytes = e.bytes();
    std::size_t cut = bytes > kMaxDeadLetterBytes ? kTruncatedValueBytes : SIZE_MAX;
    for (;;) {
        try {
            record(cut == SIZE_MAX ? reason
                                   : reason + " (fields cut to " + human_bytes(cut) + " each: the entry is " +
                                         human_bytes(bytes) + ")",
                   cut);
            metrics_.dead_letters++;
            return std::nullopt;
        } catch (const PgError& e2) {
            if (e2.retryable()) throw;
            if (classify_sqlstate(e2.sqlstate()) != Fault::configuration && cut == SIZE_MAX) {
                // Too large for the server after all (54000, 53200, XX000).
                spdlog::warn("entry {} of \"{}\": its dead letter could not be recorded in full ({}); cutting its "
                             "fields",
                             e.id, e.stream, first_line(e2.what()));
                cut = kTruncatedValueBytes;
                continue;
            }
            return std::pair{e2.sqlstate(), first_line(e2.what())};
        }
    }
}

void Consumer::ack(const std::vector<const StreamEntry*>& entries) {
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

void Consumer::turn() {
    keep_pool();
    if (!held_.entries.empty()) {
        // Entries held after a configuration or transient fault: nothing
        // else is read until they apply, dead-letter or stay pending.
        if (!held_on_new_session_) {
            const auto delay = hold_backoff_.next();
            const bool first = hold_backoff_.attempt() == 1;
            metrics_.count_error(held_.fault == Fault::transient ? "pg_transient" : "pg_configuration");
            if (first || held_.fault == Fault::configuration)
                spdlog::log(first ? spdlog::level::err : spdlog::level::warn,
                            "{} fault: {} (SQLSTATE {}); {} entries held, nothing dead-lettered or acknowledged; "
                            "retrying in {} ms{}",
                            to_string(held_.fault), held_.message, held_.sqlstate, held_.entries.size(),
                            delay.count(), held_.fault == Fault::configuration ? " on a new session" : "");
            wait(delay);
            if (stop_) return;
            if (held_.fault == Fault::configuration) {
                // The handler may have changed the session it failed on (a
                // search_path, a role, a prepared statement, a transaction
                // state): the retry runs on a new one, made before the
                // next turn.
                held_on_new_session_ = true;
                drop_pg();
                return;
            }
        }
        held_on_new_session_ = false;
        auto retry = std::move(held_.entries);
        held_ = Held{};
        apply(retry);
        if (held_.entries.empty()) {
            hold_backoff_.reset();
            spdlog::info("the fault is gone: the {} held entries went through", retry.size());
        }
        return;
    }
    if (!groups_ready_) ensure_groups();
    // A stream just taken: what its previous owner read and left pending
    // is applied first, in id order, whatever its idle time, so that each
    // key's events keep their order across the handover.
    for (auto it = unsettled_.begin(); it != unsettled_.end() && held_.entries.empty() && !stop_;) {
        if (pool_->holds(*it)) {
            reclaim_stream(*it, "0");
            if (!held_.entries.empty()) break;  // retried first; the stream stays unsettled
        }
        it = unsettled_.erase(it);
    }
    if (!held_.entries.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_claim_) {
        reclaim();
        next_claim_ = now + config_.claim_interval;
    }
    auto entries = read_new();
    if (!entries.empty()) apply(entries);
}

}  // namespace pg_outbox
