// Consume mode's PostgreSQL side: the consumer's settings checked once,
// the inbox_consume_keyed() call prepared on each session, a batch applied
// as one transaction and, when it fails as one, again entry by entry with
// isolate, the dead letters of entries that cannot be applied, and with
// --on-failure park-key the parks of the keys whose entries fail, so that
// no later entry of a key applies before an earlier one (I-20).
#include "pg_outbox/inbox_session.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/log.hpp"

namespace pg_outbox {

namespace {

// The consumer's SQL, qualified and typed as every statement of the
// relay's (see group_session.cpp): the session keeps the role's
// search_path for the handler, and these resolve the same whatever it is,
// even after a handler changed it.
constexpr const char* kConsumeSql =
    "SELECT ord, status, error_code, error_message "
    "FROM @extschema@.inbox_consume_keyed($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text[], "
    "$4::pg_catalog.text[], $5::pg_catalog.bytea[], $6::pg_catalog.bytea[], $7::pg_catalog.bytea[], "
    "$8::pg_catalog.bytea[], $9::pg_catalog.bytea[], $10::pg_catalog.bool, $11::pg_catalog.bool)";
constexpr const char* kParkKeySql =
    "SELECT state, dead_letter_id FROM @extschema@.inbox_park_key($1::pg_catalog.text, $2::pg_catalog.text, "
    "$3::pg_catalog.text, $4::pg_catalog.bytea[], $5::pg_catalog.text, $6::pg_catalog.text, $7::pg_catalog.int4, "
    "$8::pg_catalog.bool)";
constexpr const char* kDeadLetterSql =
    "SELECT @extschema@.inbox_dead_letter($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, "
    "$4::pg_catalog.bytea[], $5::pg_catalog.text, $6::pg_catalog.text, $7::pg_catalog.int4)";
constexpr const char* kConsumerCheckSql = "SELECT @extschema@.inbox_consumer_check($1::pg_catalog.text)";
constexpr const char* kTextCheckSql = "SELECT $1::pg_catalog.text";
constexpr const char* kHandlerCheck = "pg_outbox_handler_check";
constexpr const char* kConsumeStatement = "pg_outbox_consume";

// The OIDs of the handler's parameters: topic text, key text, payload
// jsonb, headers jsonb, event id uuid, traceparent text (as
// inbox_consume() passes them; a handler may use the first five only).
const std::vector<Oid> kHandlerTypes{25, 25, 3802, 3802, 2950, 25};

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

}  // namespace

std::string log_key(std::string_view key) {
    constexpr std::size_t kShown = 64;
    std::string out = "\"" + escape_control(key.substr(0, kShown)) + "\"";
    if (key.size() > kShown) out += " (" + human_bytes(key.size()) + ")";
    return out;
}

std::string pg_error_line(const std::string& message) {
    std::string line = message.substr(0, message.find('\n'));
    for (const std::string_view prefix : {"query failed: ", "ERROR:  "})
        if (line.compare(0, prefix.size(), prefix) == 0) line.erase(0, prefix.size());
    return line;
}

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

namespace {

// A one-dimensional array of a type whose binary form is its bytes
// (bytea, text), in the array binary format.
std::string pg_binary_array(const std::vector<const std::string*>& values, std::uint32_t element_oid) {
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
    put_int32(out, element_oid);
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

}  // namespace

std::string pg_bytea_array(const std::vector<const std::string*>& values) { return pg_binary_array(values, 17); }

std::string pg_text_array(const std::vector<const std::string*>& values) { return pg_binary_array(values, 25); }

std::optional<std::string> pg_bytea_from_hex(std::string_view text) {
    if (text.size() < 2 || text[0] != '\\' || text[1] != 'x' || text.size() % 2 != 0) return std::nullopt;
    auto nibble = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    std::string out;
    out.reserve(text.size() / 2 - 1);
    for (std::size_t i = 2; i < text.size(); i += 2) {
        const int hi = nibble(text[i]), lo = nibble(text[i + 1]);
        if (hi < 0 || lo < 0) return std::nullopt;
        out.push_back(static_cast<char>(hi << 4 | lo));
    }
    return out;
}

std::optional<std::pair<std::string, std::string>> framing_fault(const StreamEntry& entry) {
    if (entry.format_fault) return entry.format_fault;
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

InboxSession::InboxSession(const Config& config, Metrics& metrics, EntrySink& sink)
    : config_(config), metrics_(metrics), sink_(sink) {}

void InboxSession::connected(PgConnection& pg, const Extension& extension) {
    pg_ = &pg;
    extension_ = &extension;
    // Only at start-up: a fault that appears later is held and retried.
    if (!validated_) {
        validate_settings();
        validated_ = true;
    }
    // Made once a session: its planning is the same for every batch.
    pg_->prepare(kConsumeStatement, extension_->sql(kConsumeSql));
}

void InboxSession::validate_settings() {
    // A transient error is retried like any other; everything else means
    // the setting cannot work.
    auto refuse = [](const std::string& setting, const PgError& e) {
        if (e.retryable()) throw e;
        return ConfigError(setting + ": " + e.what() + " (SQLSTATE " + e.sqlstate() + ")");
    };
    try {
        pg_->exec(extension_->sql(kConsumerCheckSql), {config_.consumer});
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
    // The handler as inbox_consume() runs it: one statement with the six
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
        pg_->exec(std::string("EXPLAIN (COSTS OFF) EXECUTE ") + kHandlerCheck + "(NULL, NULL, NULL, NULL, NULL, NULL)");
        pg_->exec("RESET plan_cache_mode");
        pg_->exec(std::string("DEALLOCATE ") + kHandlerCheck);
    } catch (const PgError& e) {
        throw refuse("--handler", e);
    }
    spdlog::info("consumer \"{}\" and the handler checked", config_.consumer);
}

void InboxSession::reset() {
    pg_ = nullptr;
    extension_ = nullptr;
}

void InboxSession::apply(const std::vector<const StreamEntry*>& call, std::vector<const StreamEntry*>& done) {
    apply_call(call, done, false);
}

void InboxSession::apply_call(const std::vector<const StreamEntry*>& call_in, std::vector<const StreamEntry*>& done,
                              bool isolate) {
    // With park-key, the later entries of a key held in this batch are
    // held behind it, never applied before it.
    std::vector<const StreamEntry*> kept;
    const std::vector<const StreamEntry*>* call_ptr = &call_in;
    if (!held_keys_.empty()) {
        kept.reserve(call_in.size());
        for (const auto* e : call_in) {
            const auto* key = e->field("key");
            const auto held = key ? held_keys_.find({e->stream, *key}) : held_keys_.end();
            if (held == held_keys_.end())
                kept.push_back(e);
            else
                sink_.held(*e, held->second.first, held->second.second);
        }
        if (kept.empty()) return;
        call_ptr = &kept;
    }
    const auto& call = *call_ptr;
    std::vector<const std::string*> streams, entry_ids, ids, topics, keys, payloads, headers;
    for (const auto* e : call) {
        streams.push_back(&e->stream);
        entry_ids.push_back(&e->id);
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
                                          {config_.consumer, config_.handler, pg_text_array(streams),
                                           pg_text_array(entry_ids), pg_bytea_array(ids), pg_bytea_array(topics),
                                           pg_bytea_array(keys), pg_bytea_array(payloads), pg_bytea_array(headers),
                                           isolate ? "true" : "false", parking() ? "true" : "false"},
                                          {0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0}));
        metrics_.pg_rtt_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } catch (const PgError& e) {
        // The whole call failed. A lost connection or a transient error is
        // retried by the service loop, with the entries held (see
        // Consumer::apply).
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
                         call.size(), pg_error_line(e.what()), e.sqlstate());
            for (std::size_t from = 0; from < call.size(); from += kMaxIsolatedEntries) {
                const auto to = std::min(call.size(), from + kMaxIsolatedEntries);
                std::vector<const StreamEntry*> part(call.begin() + from, call.begin() + to);
                std::vector<const StreamEntry*> part_done;
                apply_call(part, part_done, true);
                sink_.settled(part_done);
            }
            return;
        }
        if (classify_sqlstate(e.sqlstate()) == Fault::configuration) {
            for (const auto* entry : call) hold(*entry, e.sqlstate(), pg_error_line(e.what()));
            return;
        }
        // Something one entry did outside its subtransaction (a statement
        // timeout, a deferred constraint at commit): each alone finds it.
        if (call.size() > 1) {
            spdlog::warn("a batch of {} entries failed as a whole, applying them one by one: {} (SQLSTATE {})",
                         call.size(), pg_error_line(e.what()), e.sqlstate());
            for (const auto* entry : call) {
                std::vector<const StreamEntry*> one{entry};
                std::vector<const StreamEntry*> one_done;
                apply_call(one, one_done, true);
                sink_.settled(one_done);
            }
            return;
        }
        entry_failed(*call.front(), e.sqlstate(), pg_error_line(e.what()), done);
        return;
    }
    // Committed: what follows may be acknowledged.
    const auto& r = *result;
    // Entries the server did not touch because an earlier entry of their
    // key failed in this call (isolate with park-key).
    std::vector<const StreamEntry*> blocked;
    for (int i = 0; i < r.rows(); ++i) {
        const auto ord = std::stoul(std::string(r.get(i, 0)));
        const StreamEntry& e = *call.at(ord - 1);
        const auto status = r.get(i, 1);
        const std::string code(r.get(i, 2));
        const std::string message(r.get(i, 3));
        if (status == "applied") {
            metrics_.events_applied++;
            done.push_back(&e);
        } else if (status == "parked") {
            // Stored behind its key's failed entry, in this transaction.
            metrics_.entries_parked++;
            done.push_back(&e);
        } else if (status == "blocked") {
            blocked.push_back(&e);
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
    if (blocked.empty()) return;
    // Their key is parked now (they park when submitted again), or held
    // (they are held behind it).
    std::vector<const StreamEntry*> again;
    for (const auto* e : blocked) {
        const auto held = held_keys_.find({e->stream, *e->field("key")});
        if (held != held_keys_.end())
            sink_.held(*e, held->second.first, held->second.second);
        else
            again.push_back(e);
    }
    if (!again.empty()) apply_call(again, done, false);
}

void InboxSession::hold(const StreamEntry& e, std::string_view sqlstate, std::string_view message) {
    if (parking())
        if (const auto* key = e.field("key"))
            held_keys_.try_emplace({e.stream, *key}, std::string(sqlstate), std::string(message));
    sink_.held(e, sqlstate, message);
}

void InboxSession::entry_failed(const StreamEntry& e, std::string_view sqlstate, std::string_view message,
                                std::vector<const StreamEntry*>& done) {
    if (parking() && e.field("key") != nullptr) {
        key_failed(e, sqlstate, message, done);
        return;
    }
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

void InboxSession::key_failed(const StreamEntry& e, std::string_view sqlstate, std::string_view message,
                              std::vector<const StreamEntry*>& done) {
    metrics_.events_failed++;
    const bool dead = e.deliveries >= config_.max_deliveries;
    const auto record = park_key(e, std::string(message), std::string(sqlstate), dead);
    if (record.fault) {
        // Nothing recorded: held with its key, so that its later entries
        // wait behind it.
        spdlog::error("entry {} of \"{}\" failed ({}; SQLSTATE {}) and its key could not be parked: {} (SQLSTATE "
                      "{})",
                      e.id, e.stream, message, sqlstate, record.fault->second, record.fault->first);
        hold(e, record.fault->first, record.fault->second);
        return;
    }
    const auto key = log_key(*e.field("key"));
    if (dead) {
        spdlog::error("entry {} of \"{}\" failed {} times, dead-lettered; its key {} is parked ({}) until "
                      "inbox_redrive or inbox_skip: {} (SQLSTATE {})",
                      e.id, e.stream, e.deliveries, key, record.state.value_or("not parked"), message, sqlstate);
        done.push_back(&e);
    } else {
        spdlog::warn("entry {} of \"{}\" failed (delivery {} of {}), stays pending; its key {} is parked "
                     "behind it: {} (SQLSTATE {})",
                     e.id, e.stream, e.deliveries, config_.max_deliveries, key, message, sqlstate);
    }
}

void InboxSession::malformed(const StreamEntry& e, const std::string& reason, const std::string& sqlstate,
                             std::vector<const StreamEntry*>& done) {
    spdlog::error("entry {} of \"{}\" is malformed, dead-lettered and acknowledged: {} (SQLSTATE {})", e.id,
                  e.stream, reason, sqlstate);
    if (auto fault = dead_letter(e, "malformed entry: " + reason, sqlstate)) {
        sink_.held(e, fault->first, fault->second);
    } else {
        metrics_.entries_malformed++;
        done.push_back(&e);
    }
}


std::optional<std::pair<std::string, std::string>> InboxSession::with_fields(
    const StreamEntry& e, const std::string& reason,
    const std::function<void(const std::string& why, const Param& fields)>& record) {
    // The raw fields, names and values in turn; NULL for an entry gone
    // from the stream (no fields).
    auto run = [&](const std::string& why, std::size_t cut) {
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
        record(why, e.fields.empty() ? Param(std::nullopt) : Param(pg_bytea_array(raw)));
    };
    const auto bytes = e.bytes();
    std::size_t cut = bytes > kMaxDeadLetterBytes ? kTruncatedValueBytes : SIZE_MAX;
    for (;;) {
        try {
            run(cut == SIZE_MAX ? reason
                                : reason + " (fields cut to " + human_bytes(cut) + " each: the entry is " +
                                      human_bytes(bytes) + ")",
                cut);
            return std::nullopt;
        } catch (const PgError& e2) {
            if (e2.retryable()) throw;
            if (classify_sqlstate(e2.sqlstate()) != Fault::configuration && cut == SIZE_MAX && !e.fields.empty()) {
                // Too large for the server after all (54000, 53200, XX000).
                spdlog::warn("entry {} of \"{}\": its fields could not be recorded in full ({}); cutting them",
                             e.id, e.stream, pg_error_line(e2.what()));
                cut = kTruncatedValueBytes;
                continue;
            }
            return std::pair{e2.sqlstate(), pg_error_line(e2.what())};
        }
    }
}

std::optional<std::pair<std::string, std::string>> InboxSession::dead_letter(
    const StreamEntry& e, const std::string& reason, const std::optional<std::string>& sqlstate) {
    auto fault = with_fields(e, reason, [&](const std::string& why, const Param& fields) {
        pg_->exec(extension_->sql(kDeadLetterSql),
                  {config_.consumer, e.stream, e.id, fields, why, sqlstate ? Param(*sqlstate) : std::nullopt,
                   std::to_string(std::max(1LL, e.deliveries))},
                  {0, 0, 0, 1, 0, 0, 0});
    });
    if (!fault) metrics_.dead_letters++;
    return fault;
}

ParkRecord InboxSession::park_key(const StreamEntry& e, const std::string& reason,
                                  const std::optional<std::string>& sqlstate, bool dead) {
    ParkRecord out;
    out.fault = with_fields(e, reason, [&](const std::string& why, const Param& fields) {
        const auto r = pg_->exec(extension_->sql(kParkKeySql),
                                 {config_.consumer, e.stream, e.id, fields, why,
                                  sqlstate ? Param(*sqlstate) : std::nullopt,
                                  std::to_string(std::max(1LL, e.deliveries)), dead ? "true" : "false"},
                                 {0, 0, 0, 1, 0, 0, 0, 0});
        out.state.reset();
        bool dead_lettered = false;
        if (r.rows() > 0) {
            if (!r.is_null(0, 0)) out.state = std::string(r.get(0, 0));
            dead_lettered = !r.is_null(0, 1);
        }
        // A dead letter recorded now (an entry given up), not one kept
        // from before (a retrying head failing again).
        if (dead && dead_lettered) metrics_.dead_letters++;
    });
    return out;
}

}  // namespace pg_outbox
