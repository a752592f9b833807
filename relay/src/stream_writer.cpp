// The Redis side of publishing. Invariant: a stream's entries are written
// in feed order, each once: a later entry of a stream never gets in before
// an earlier one that failed (Redis refuses ids below a stream's top, so
// the earlier one could never be written), an entry already present is
// skipped only when it is this group's (same id, same event id), and
// nothing is written to a stream that lost entries until the group
// rewinds. The fast path keeps this by writing only when WATCH and a look
// show each stream as this writer left it; anything else goes through the
// append script (append.lua), which checks entry by entry. In a Redis
// Cluster the same holds per hash slot: a transaction, its WATCH and its
// look name the streams of one slot, on the connection to its master.
#include "pg_outbox/stream_writer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <numeric>
#include <unordered_map>

#include "pg_outbox/backoff.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/redis_cluster.hpp"
#include "pg_outbox/redis_error.hpp"
#include "pg_outbox/redis_target.hpp"

namespace pg_outbox {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The last id of a stream from its XINFO STREAM reply, as the append
// script reads it: 0-0 when the stream does not exist; nullopt for any
// other error (WRONGTYPE, ...).
std::optional<Position> stream_last_id(const redisReply* info) {
    if (is_error(info)) {
        if (reply_text(info).find("no such key") != std::string_view::npos) return Position{};
        return std::nullopt;
    }
    if (const redisReply* id = map_field(info, "last-generated-id"))
        return Position::parse(reply_text(id)).value_or(Position{});
    return Position{};
}

// Records how long a batch's Redis round trips took, however they end.
class RttTimer {
public:
    explicit RttTimer(std::atomic<double>& gauge) : gauge_(gauge) {}
    ~RttTimer() { gauge_ = seconds_since(t0_); }
    RttTimer(const RttTimer&) = delete;
    RttTimer& operator=(const RttTimer&) = delete;

private:
    std::atomic<double>& gauge_;
    std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

// A transaction is sent in pieces of about this many bytes as it is
// formatted.
constexpr std::size_t kSendPieceBytes = 64 * 1024;

// How many times a stream's share follows a MOVED or ASK within one part
// before the part fails (and is retried after a backoff).
constexpr int kMaxRedirectRounds = 5;

// Redis refused a write for want of memory (maxmemory, noeviction).
bool is_oom(const RedisError& e) { return dynamic_cast<const OomError*>(&e) != nullptr; }

// A cluster node refused a command because its slot is elsewhere (MOVED),
// being migrated (ASK), or has its keys split by a migration (TRYAGAIN):
// the command did not run.
bool slot_elsewhere(const std::exception_ptr& error) {
    return error_is<RedirectionError>(error) || error_is<TryAgainError>(error);
}

// The first of the "entries" commands queued after MULTI (replies 1 to
// entries) that Redis refused; nullopt when it queued them all.
std::optional<std::string> first_refused(const Replies& replies, std::size_t entries) {
    for (std::size_t i = 1; i <= entries; ++i)
        if (const auto& r = replies.raw(i); is_error(&r)) return std::string(reply_text(&r));
    return std::nullopt;
}

// The error of a transaction that did not run: the first command Redis
// refused when queued, else EXEC's own, without EXECABORT's preamble.
std::string transaction_error(const std::optional<std::string>& refused, const redisReply* exec) {
    std::string why = refused ? *refused : std::string(reply_text(exec));
    if (constexpr std::string_view prefix = "EXECABORT Transaction discarded because of: "; why.rfind(prefix, 0) == 0)
        why.erase(0, prefix.size());
    return why;
}

}  // namespace

std::string expand_stream_key(const std::string& tmpl, const std::string& topic, const std::string& group,
                              int shard) {
    std::string out;
    out.reserve(tmpl.size() + topic.size());
    for (std::size_t i = 0; i < tmpl.size();) {
        if (tmpl.compare(i, 7, "{topic}") == 0) {
            out += topic;
            i += 7;
        } else if (tmpl.compare(i, 7, "{group}") == 0) {
            out += group;
            i += 7;
        } else if (tmpl.compare(i, 7, "{shard}") == 0) {
            out += std::to_string(shard);
            i += 7;
        } else {
            out += tmpl[i++];
        }
    }
    return out;
}

StreamWriter::StreamWriter(const Config& config, Metrics& metrics, const std::atomic<bool>& stop)
    : config_(config),
      metrics_(metrics),
      stop_(stop),
      maxlen_text_(std::to_string(config.maxlen)),
      group_name_(config.group_name()),
      shard_(std::max(config.group_shard(), 0)),
      fields_(config.entry_format, expand_ce_source(config.ce_source, "", group_name_)) {}

void StreamWriter::set_database(const std::string& database) {
    fields_.set_source(expand_ce_source(config_.ce_source, database, group_name_));
}

void StreamWriter::reset(RedisTarget& target) {
    target_ = &target;
    watched_.clear();
    node_watched_.clear();
    transactions_refused_ = false;
    // Each server loads the script when first connected to (in a cluster,
    // after a failover, a restart or a reshard the node may be new), and is
    // checked for MULTI: without it the XADDs of the fast path would run
    // one by one, no longer guarded by WATCH, so the script writes every
    // batch instead (an ACL or a proxy may refuse it). Nothing is watched
    // on a new connection, and it may take the address of one dropped.
    target.on_connect([this](RedisConnection& node) {
        watched_.clear();
        node_watched_.clear();
        load_script(node);
        if (config_.id_mode != IdMode::explicit_position || transactions_refused_) return;
        node.append({"MULTI"});
        node.append({"DISCARD"});
        const auto replies = node.read_replies(2);
        if (const auto& multi = replies.raw(0); is_error(&multi)) {
            transactions_refused_ = true;
            spdlog::warn("Redis refused MULTI on {} ({}); every batch goes through the append script",
                         node.server().to_string(), reply_text(&multi));
        }
    });
}

std::optional<Position> StreamWriter::check_streams(const std::map<std::string, Position>& published, bool every) {
    std::optional<Position> rewind_to;
    if (every) known_.clear();
    for (const auto& [stream, expected] : published) {
        // "no such key" is 0-0; in a cluster, asked of the stream's master.
        auto info = target_->command_raw(stream, {"XINFO", "STREAM", stream});
        const auto last_id = stream_last_id(info.get());
        if (!last_id) throw_error(*info, "XINFO STREAM " + stream);
        const Position last = *last_id;
        if (last < expected) {
            spdlog::error("stream \"{}\" is behind: Redis has entries up to {}, group \"{}\" published up to {}; "
                          "republishing from the outbox",
                          stream, last.to_string(), config_.group, expected.to_string());
            if (!rewind_to || last < *rewind_to) rewind_to = last;
            known_[stream] = last;
        } else {
            known_[stream] = expected;
        }
    }
    return rewind_to;
}

void StreamWriter::load_script(RedisConnection& node) {
    auto r = node.command({"SCRIPT", "LOAD", kAppendScript});
    script_sha_ = std::string(reply_text(r.get()));
}

RedisConnection& StreamWriter::server() { return target_->node_for({}); }

StreamWriter::Shares StreamWriter::split(std::span<const Event> batch) const {
    Shares shares;
    // The stream of each topic, expanded once a batch; topics may share a
    // stream.
    std::unordered_map<std::string_view, std::size_t> slot_of_topic;
    for (const auto& e : batch) {
        auto slot = slot_of_topic.find(e.topic);
        if (slot == slot_of_topic.end()) {
            auto key = expand_stream_key(config_.stream_template, e.topic, group_name_, shard_);
            const auto s = static_cast<std::size_t>(std::find(shares.keys.begin(), shares.keys.end(), key) -
                                                    shares.keys.begin());
            if (s == shares.keys.size()) {
                shares.keys.push_back(std::move(key));
                shares.events.emplace_back();
            }
            slot = slot_of_topic.emplace(e.topic, s).first;
        }
        shares.events[slot->second].push_back(&e);
    }
    return shares;
}

StreamWriter::Written StreamWriter::write(std::span<const Event> batch, const std::function<void()>& while_waiting) {
    RttTimer rtt(metrics_.redis_rtt_seconds);
    while_waiting_ = while_waiting ? &while_waiting : nullptr;
    deferred_ = nullptr;
    // Whatever way the write ends, the caller's function is not run later.
    struct Forget {
        const std::function<void()>*& pointer;
        ~Forget() { pointer = nullptr; }
    } forget{while_waiting_};
    Written last;
    const auto max_bytes = static_cast<std::size_t>(config_.batch_bytes);
    for (std::size_t from = 0; from < batch.size();) {
        // The next part: events until the next would exceed --batch-bytes,
        // fewer while Redis is short of memory, at least one.
        std::size_t to = from, bytes = 0;
        while (to < batch.size() && (oom_limit_ == 0 || to - from < oom_limit_)) {
            const auto b = fields_.entry_bytes(batch[to]);
            if (to > from && bytes + b > max_bytes) break;
            bytes += b;
            ++to;
        }
        const auto written_before = metrics_.events_published.load();
        try {
            for (auto& [stream, position] : write_part(batch.subspan(from, to - from)))
                last[stream] = std::move(position);
        } catch (const RedisError& e) {
            // The caller's reading ahead failed too: that is for it to
            // see first, the batch is retried whole anyway.
            rethrow_deferred();
            // Nothing of a refused transaction ran, and the script stops
            // at an entry refused, so the same positions can be written
            // again in smaller parts: entries that got in are refused as
            // present (explicit ids), and no later entry of a stream gets
            // in before an earlier one. Ids Redis generates would append
            // those entries again: the batch is retried whole instead, as
            // after any other error.
            const bool wrote_some = metrics_.events_published.load() != written_before;
            if (!is_oom(e) || to - from == 1 || (wrote_some && config_.id_mode != IdMode::explicit_position)) {
                if (is_oom(e)) {
                    if (!metrics_.redis_oom.exchange(true))
                        spdlog::error("Redis refuses writes for want of memory ({}): not even one entry fits; "
                                      "the backlog waits in PostgreSQL (retained) until Redis has room",
                                      e.what());
                }
                throw;
            }
            oom_limit_ = (to - from) / 2;
            spdlog::info("Redis is short of memory ({}); writing {} events at {} in parts of {}", e.what(),
                         batch.size() - from, batch[from].position, oom_limit_);
            // Redis holds the refused write's query buffer until its cron
            // shrinks it (10 times a second by default): a smaller part
            // sent at once would be refused for the memory of the last.
            pause_unless_stopped(config_.retry_min, stop_);
            continue;
        }
        if (metrics_.redis_oom.exchange(false)) spdlog::info("Redis accepts writes again");
        if (oom_limit_ > 0) oom_limit_ = oom_limit_ * 2 >= batch.size() ? 0 : oom_limit_ * 2;
        from = to;
        // The caller's reading ahead failed: the rest of the batch waits.
        rethrow_deferred();
    }
    run_while_waiting();
    rethrow_deferred();
    return last;
}

void StreamWriter::run_while_waiting() {
    const auto* f = std::exchange(while_waiting_, nullptr);
    if (f == nullptr) return;
    try {
        (*f)();
    } catch (...) {
        deferred_ = std::current_exception();
    }
}

void StreamWriter::rethrow_deferred() {
    if (deferred_) std::rethrow_exception(std::exchange(deferred_, nullptr));
}

StreamWriter::Written StreamWriter::write_part(std::span<const Event> events) {
    const auto shares = split(events);
    Written last;
    if (config_.id_mode == IdMode::explicit_position && !script_next_ && !transactions_refused_ && target_->per_slot()) {
        // Per slot: what the transactions left goes through the script.
        const auto to_script = write_cluster_transactions(shares, last);
        if (to_script.empty()) {
            metrics_.transaction_batches++;
            return last;
        }
        Shares rest;
        for (const auto s : to_script) {
            rest.keys.push_back(shares.keys[s]);
            rest.events.push_back(shares.events[s]);
        }
        for (auto& [stream, position] : write_with_script(rest)) last[stream] = std::move(position);
        metrics_.script_batches++;
        return last;
    }
    if (config_.id_mode == IdMode::explicit_position && !script_next_ && !transactions_refused_ && !target_->per_slot()) {
        switch (write_transaction(shares, last)) {
            case Transaction::written:
                metrics_.transaction_batches++;
                return last;
            case Transaction::declined:
                break;
            case Transaction::aborted:
                spdlog::debug("a stream of the batch changed before EXEC; appending with the script");
                break;
        }
    }
    last = write_with_script(shares);
    metrics_.script_batches++;
    script_next_ = false;
    return last;
}

// Watches streams and asks for their last ids, formatted into "out"; the
// replies are for read_look().
void StreamWriter::format_look(std::string& out, const std::vector<std::string>& keys) {
    std::vector<std::string_view> watch{"WATCH"};
    watch.insert(watch.end(), keys.begin(), keys.end());
    format_command(out, watch);
    for (const auto& key : keys) format_command(out, {"XINFO", "STREAM", key});
}

// Reads the replies of a look at streams: each stream's last id, recorded
// in watched_ while the WATCH holds. WATCH may be refused for one batch
// (CROSSSLOT: streams in several slots of a cluster node) or for good (an
// ACL): the streams are then not watched, and the script writes the batch.
void StreamWriter::read_look(const std::vector<std::string>& keys) {
    const auto replies = server().read_replies(keys.size() + 1);  // read every reply
    const auto& watched = replies.raw(0);
    if (is_error(&watched)) {
        spdlog::debug("Redis refused WATCH ({}); appending with the script", reply_text(&watched));
        return;
    }
    for (std::size_t k = 0; k < keys.size(); ++k) watched_[keys[k]] = stream_last_id(&replies.raw(k + 1));
}

// Whether every stream of the batch is watched and as this relay left it:
// its last id when watched is the last position the relay published there
// (0-0, or no stream at all, when it published none), and the batch's
// entries lie above it. The append script would then write every entry,
// and so do plain XADDs, as long as no stream changes before EXEC (WATCH
// sees to that). Anything else (Redis lost entries, another writer, a
// replay after a rewind or a crash, a stream of another type) is for the
// script to sort out.
bool StreamWriter::streams_as_known(const Shares& shares) const {
    for (std::size_t s = 0; s < shares.keys.size(); ++s)
        if (!stream_as_known(watched_, shares.keys[s], shares.events[s])) return false;
    return true;
}

bool StreamWriter::stream_as_known(const std::map<std::string, std::optional<Position>>& watched,
                                   const std::string& key, const std::vector<const Event*>& events) const {
    const auto w = watched.find(key);
    const std::optional<Position> last = w == watched.end() ? std::nullopt : w->second;
    const auto known = known_.find(key);
    const Position expected = known == known_.end() ? Position{} : known->second;
    const Position first = events.front()->parsed;
    if (last && *last == expected && expected < first) return true;
    spdlog::debug("stream \"{}\": last id {}, expected {}, batch from {}; appending with the script", key,
                  last ? last->to_string() : std::string("unknown"), expected.to_string(), events.front()->position);
    return false;
}

void StreamWriter::format_share(std::string& out, const std::string& key, const std::vector<const Event*>& events,
                                RedisConnection* sent) {
    const std::string_view maxlen = config_.maxlen > 0 ? std::string_view(maxlen_text_) : std::string_view();
    // Each entry's prev: the stream's last id before it. The look must
    // find the stream's last id at what this relay knows (known_), or
    // nothing of this is sent.
    const auto known = known_.find(key);
    const std::string first_prev = (known == known_.end() ? Position{} : known->second).to_string();
    std::string_view prev = first_prev;
    std::vector<std::string_view> argv;
    for (const Event* e : events) {
        fields_.clear();  // the last entry is formatted: its buffers are free
        xadd_argv(argv, key, *e, prev, maxlen, fields_);
        format_command(out, argv);
        prev = e->position;
        if (sent && out.size() >= kSendPieceBytes) {
            sent->append_formatted(out);
            sent->flush();
            out.clear();
        }
    }
}

StreamWriter::Transaction StreamWriter::write_transaction(const Shares& shares, Written& last) {
    // Streams still watched since the last transaction (which looked at
    // its own streams again after EXEC) need no look; most batches go to
    // the streams of the one before, so most batches take one round trip,
    // and the transaction goes out in pieces as it is formatted: Redis
    // queues the first commands while the next are formatted. Otherwise
    // the transaction is formatted while the look makes its round trip,
    // and thrown away in the rare case the streams are not as known.
    std::vector<std::string> unwatched;
    for (const auto& key : shares.keys)
        if (watched_.find(key) == watched_.end()) unwatched.push_back(key);
    const bool looking = !unwatched.empty();
    if (looking) {
        look_.clear();
        format_look(look_, unwatched);
        server().append_formatted(look_);
        server().flush();
    } else if (!streams_as_known(shares)) {
        return Transaction::declined;
    }
    transaction_.clear();
    format_command(transaction_, {"MULTI"});
    std::size_t entries = 0;
    for (std::size_t s = 0; s < shares.keys.size(); ++s) {
        // What is formatted so far goes out, unless a look is still to be
        // read.
        format_share(transaction_, shares.keys[s], shares.events[s], looking ? nullptr : &server());
        entries += shares.events[s].size();
    }
    format_command(transaction_, {"EXEC"});
    // EXEC ends every WATCH: look at the streams again for the next batch,
    // in the same round trip.
    format_look(transaction_, shares.keys);
    if (looking) {
        read_look(unwatched);
        if (!streams_as_known(shares)) return Transaction::declined;
    }
    server().append_formatted(transaction_);
    server().flush();
    // Redis works on the transaction; the caller meanwhile does its part.
    run_while_waiting();

    // Read every reply before deciding (MULTI, the XADDs, EXEC), so that
    // the connection is left outside the transaction whatever happens.
    const auto replies = server().read_replies(entries + 2);
    const auto refused = first_refused(replies, entries);
    const redisReply& multi = replies.raw(0);
    const redisReply& exec = replies.raw(entries + 1);
    watched_.clear();
    read_look(shares.keys);

    if (is_error(&multi)) {
        // Refused since the connection was checked: the XADDs ran one by
        // one. The batch fails and the script looks at what they wrote.
        spdlog::warn("Redis refused MULTI ({}); appending with the script only until the next connection",
                     reply_text(&multi));
        transactions_refused_ = true;
        throw_error(multi, "MULTI");
    }
    if (exec.type == REDIS_REPLY_NIL) return Transaction::aborted;
    if (is_error(&exec)) {
        // Nothing ran: a command was refused when queued (OOM, READONLY,
        // ...), or the whole transaction at EXEC. The error of the first
        // refused command names the cause for the metrics.
        script_next_ = true;
        throw_error(transaction_error(refused, &exec));
    }
    if (exec.type != REDIS_REPLY_ARRAY || exec.elements != entries) {
        script_next_ = true;
        throw RedisError(RedisError::Kind::reply, "unexpected reply to EXEC");
    }
    return read_transaction_replies(shares, &exec, last);
}

// The replies of the XADDs of a transaction that ran. Each entry was
// checked to lie above its stream's last id, so none should fail; if one
// does, Redis went on with the next ones (a transaction has no rollback):
// the batch fails, the cursor stays, and the script looks at the streams
// next time, refusing loudly a later entry that got in before a failed one.
StreamWriter::Transaction StreamWriter::read_transaction_replies(const Shares& shares, const redisReply* exec,
                                                           Written& last) {
    std::vector<std::size_t> streams(shares.keys.size());
    std::iota(streams.begin(), streams.end(), std::size_t{0});
    std::exception_ptr failure;
    read_exec_replies(shares, streams, exec, last, failure);
    if (failure) std::rethrow_exception(failure);  // and the script looks next time
    return Transaction::written;
}

// Per slot on each node: [WATCH, XINFO STREAM of the slot's streams] when
// they are not watched yet, read before anything is written; then MULTI,
// the XADDs, EXEC, and the look at the node's next slot (or, after its
// last, at its first, for the next batch) in the same round trip, since
// EXEC ends every WATCH of the connection. Every node takes its steps at
// once, so a batch takes as many round trips as the busiest node has
// slots in it (plus one for a look), the first one overlapped with the
// caller's "while_waiting". A transaction runs only under WATCH, after a
// look found each of its streams as this relay left it, exactly as on one
// server; a queued command or EXEC that meets MOVED, ASK or TRYAGAIN
// discards the transaction (nothing ran), and that slot's shares go to the
// script, which follows the redirection entry by entry as it checks.
std::vector<std::size_t> StreamWriter::write_cluster_transactions(const Shares& shares, Written& last) {
    struct Node {
        RedisConnection* connection = nullptr;
        std::vector<std::vector<std::size_t>> slots;  // each slot's shares
        std::size_t current = 0;                      // the slot being written
        bool looked = false;                          // the current slot's look was read
        enum class Sent { nothing, look, transaction } sent = Sent::nothing;
        std::size_t entries = 0;             // the XADDs of the transaction sent
        std::vector<std::string> look_keys;  // the streams of the look sent
    };
    std::vector<Node> nodes;
    std::map<int, std::pair<std::size_t, std::size_t>> where;  // slot: node, index in its slots
    for (std::size_t s = 0; s < shares.keys.size(); ++s) {
        const int slot = key_slot(shares.keys[s]);
        auto it = where.find(slot);
        if (it == where.end()) {
            RedisConnection* c = &target_->node_for(shares.keys[s]);
            auto n = std::find_if(nodes.begin(), nodes.end(), [&](const Node& x) { return x.connection == c; });
            if (n == nodes.end()) {
                n = nodes.insert(nodes.end(), Node{});
                n->connection = c;
            }
            n->slots.emplace_back();
            it = where.emplace(slot, std::pair(static_cast<std::size_t>(n - nodes.begin()), n->slots.size() - 1))
                     .first;
        }
        nodes[it->second.first].slots[it->second.second].push_back(s);
    }
    // A node connected to just now refused MULTI: the script only.
    if (transactions_refused_) {
        std::vector<std::size_t> all(shares.keys.size());
        for (std::size_t s = 0; s < all.size(); ++s) all[s] = s;
        return all;
    }
    const auto covers = [&](const std::map<std::string, std::optional<Position>>& watched,
                            const std::vector<std::size_t>& slot) {
        return std::all_of(slot.begin(), slot.end(),
                           [&](std::size_t s) { return watched.find(shares.keys[s]) != watched.end(); });
    };
    // The slot still watched on a node since the last batch goes first:
    // it needs no look.
    for (auto& n : nodes) {
        const auto& watched = node_watched_[n.connection];
        const auto first = std::find_if(n.slots.begin(), n.slots.end(),
                                        [&](const std::vector<std::size_t>& slot) { return covers(watched, slot); });
        if (first != n.slots.end()) std::rotate(n.slots.begin(), first, first + 1);
    }
    const auto format_look_at = [&](Node& n, const std::vector<std::size_t>& slot) {
        n.look_keys.clear();
        for (const auto s : slot) n.look_keys.push_back(shares.keys[s]);
        format_look(transaction_, n.look_keys);
    };
    // Reads a look's replies; the streams are watched when WATCH was
    // taken (a WATCH refused for MOVED asks for the slot map again).
    bool moved = false;
    const auto read_look_of = [&](Node& n) {
        auto& watched = node_watched_[n.connection];
        const auto replies = n.connection->read_replies(n.look_keys.size() + 1);  // read every reply
        const auto& watch = replies.raw(0);
        if (is_error(&watch)) {
            spdlog::debug("Redis refused WATCH ({}); appending with the script", reply_text(&watch));
            if (error_is<MovedError>(make_error(watch))) moved = true;
            return;
        }
        for (std::size_t k = 0; k < n.look_keys.size(); ++k)
            watched[n.look_keys[k]] = stream_last_id(&replies.raw(k + 1));
    };

    std::vector<std::size_t> to_script;
    std::exception_ptr failure;
    for (bool first_round = true;; first_round = false) {
        std::vector<Node*> sent;
        for (auto& n : nodes) {
            n.sent = Node::Sent::nothing;
            if (failure) continue;  // the batch fails: nothing more is written
            const auto& watched = node_watched_[n.connection];
            transaction_.clear();
            while (n.current < n.slots.size()) {
                const auto& slot = n.slots[n.current];
                if (covers(watched, slot)) {
                    if (std::all_of(slot.begin(), slot.end(), [&](std::size_t s) {
                            return stream_as_known(watched, shares.keys[s], shares.events[s]);
                        })) {
                        format_command(transaction_, {"MULTI"});
                        n.entries = 0;
                        for (const auto s : slot) {
                            format_share(transaction_, shares.keys[s], shares.events[s], n.connection);
                            n.entries += shares.events[s].size();
                        }
                        format_command(transaction_, {"EXEC"});
                        format_look_at(n, n.current + 1 < n.slots.size() ? n.slots[n.current + 1] : n.slots[0]);
                        n.sent = Node::Sent::transaction;
                        break;
                    }
                } else if (!n.looked) {
                    format_look_at(n, slot);
                    n.sent = Node::Sent::look;
                    break;
                }
                // Not as this relay left it, or not watched (WATCH
                // refused): for the script.
                to_script.insert(to_script.end(), slot.begin(), slot.end());
                ++n.current;
                n.looked = false;
            }
            if (n.sent == Node::Sent::nothing) continue;
            n.connection->append_formatted(transaction_);
            n.connection->flush();
            sent.push_back(&n);
        }
        if (sent.empty()) break;
        // Redis works on the transactions; the caller meanwhile does its
        // part.
        if (first_round) run_while_waiting();
        for (Node* n : sent) {
            if (n->sent == Node::Sent::look) {
                read_look_of(*n);
                n->looked = true;
                continue;
            }
            // Every reply is read before deciding, so that the connection
            // is left outside the transaction whatever happened.
            const auto replies = n->connection->read_replies(n->entries + 2);  // MULTI, the XADDs, EXEC
            const auto refused = first_refused(replies, n->entries);
            const redisReply& multi = replies.raw(0);
            const redisReply& exec = replies.raw(n->entries + 1);
            node_watched_[n->connection].clear();
            read_look_of(*n);
            const auto& slot = n->slots[n->current];
            ++n->current;
            n->looked = n->current < n->slots.size();  // the look just read was at it
            if (is_error(&multi)) {
                spdlog::warn("Redis refused MULTI on {} ({}); appending with the script only until the next "
                             "connection",
                             n->connection->server().to_string(), reply_text(&multi));
                transactions_refused_ = true;
                if (!failure) failure = make_error(multi, "MULTI");
                continue;
            }
            if (exec.type == REDIS_REPLY_NIL) {
                spdlog::debug("a stream of the batch changed before EXEC; appending with the script");
                to_script.insert(to_script.end(), slot.begin(), slot.end());
                continue;
            }
            if (is_error(&exec)) {
                const auto why = transaction_error(refused, &exec);
                auto error = make_error(why);
                if (slot_elsewhere(error)) {
                    spdlog::debug("stream \"{}\": {}; appending with the script", shares.keys[slot.front()], why);
                    if (error_is<MovedError>(error)) moved = true;
                    to_script.insert(to_script.end(), slot.begin(), slot.end());
                    continue;
                }
                script_next_ = true;
                if (!failure) failure = std::move(error);
                continue;
            }
            if (exec.type != REDIS_REPLY_ARRAY || exec.elements != n->entries) {
                script_next_ = true;
                if (!failure)
                    failure = std::make_exception_ptr(RedisError(RedisError::Kind::reply, "unexpected reply to EXEC"));
                continue;
            }
            read_exec_replies(shares, slot, &exec, last, failure);
        }
        // A slot moved (a reshard finished, a failover): the map is read
        // again before the script or the next batch routes a stream.
        if (moved) {
            target_->refresh();
            moved = false;
        }
    }
    if (failure) std::rethrow_exception(failure);
    return to_script;
}

// The replies of the XADDs of a transaction, for the shares of some
// streams (a slot's in a cluster); a failure sends the next batch through
// the script.
void StreamWriter::read_exec_replies(const Shares& shares, const std::vector<std::size_t>& streams,
                                     const redisReply* exec, Written& last, std::exception_ptr& failure) {
    std::uint64_t written = 0;
    std::size_t i = 0;
    for (const auto s : streams) {
        const Event* top = nullptr;
        for (const Event* e : shares.events[s]) {
            const redisReply* r = exec->element[i++];
            if (is_error(r)) {
                if (!failure)
                    failure = make_error(*r, {},
                                         "event " + e->event_id + " at " + e->position + " to stream \"" +
                                             shares.keys[s] + "\"");
                script_next_ = true;
                continue;
            }
            ++written;
            top = e;
        }
        if (top) {
            last[shares.keys[s]] = top->position;
            known_[shares.keys[s]] = top->parsed;
        }
    }
    metrics_.events_published += written;
}

// The script reports how many entries of a stream's share it found
// already present: the first "n" (once one is written, the rest lie above
// the stream's top). A batch that fails on another stream is retried
// whole, and finds them present again: each entry counts once.
std::size_t StreamWriter::count_already(const std::string& key, const std::vector<const Event*>& events, std::size_t n) {
    auto& counted = already_counted_[key];
    std::size_t fresh = 0;
    for (std::size_t i = 0; i < n && i < events.size(); ++i) {
        if (counted < events[i]->parsed) {
            ++fresh;
            counted = events[i]->parsed;
        }
    }
    return fresh;
}

StreamWriter::Written StreamWriter::write_with_script(const Shares& shares) {
    const auto& keys = shares.keys;
    const auto& per_stream = shares.events;
    // The script's writes would abort the next transaction on a stream
    // still watched.
    // On one server that is watched_, in a cluster each node's
    // node_watched_.
    const bool unwatch = !watched_.empty();
    RedisConnection* unwatched = unwatch ? &server() : nullptr;
    if (unwatch) unwatched->append({"UNWATCH"});
    watched_.clear();
    const bool explicit_ids = config_.id_mode == IdMode::explicit_position;
    std::vector<std::vector<std::string>> counts(keys.size());
    // Where each stream's script goes: the connection, or in a cluster the
    // master of the stream's slot (the node an ASK named, after ASKING).
    // A stream redirected (MOVED, ASK: the script did not run) is sent
    // again in the next round; the replies are read in full first.
    std::vector<RedisReply> replies(keys.size());
    std::vector<RedisConnection*> to(keys.size(), nullptr);
    std::vector<char> asking(keys.size(), 0);
    // In a cluster, UNWATCH before the first script on a node connection
    // that watches streams.
    std::vector<char> unwatching(keys.size(), 0);
    std::vector<std::size_t> pending(keys.size());
    for (std::size_t s = 0; s < keys.size(); ++s) pending[s] = s;
    for (int round = 0; !pending.empty(); ++round) {
        for (const auto s : pending) {
            if (!asking[s]) to[s] = &target_->node_for(keys[s]);
            if (round == 0) {
                if (const auto w = node_watched_.find(to[s]); w != node_watched_.end()) {
                    if (!w->second.empty()) {
                        to[s]->append({"UNWATCH"});
                        unwatching[s] = 1;
                    }
                    node_watched_.erase(w);
                }
            }
            if (asking[s]) to[s]->append({"ASKING"});
            std::string expected;
            if (explicit_ids) {
                const auto known = known_.find(keys[s]);
                if (known != known_.end()) expected = known->second.to_string();
            }
            counts[s].clear();
            fields_.clear();  // append() copies the command: the buffers are free after it
            to[s]->append(append_script_argv(script_sha_, keys[s], per_stream[s], config_.id_mode, maxlen_text_,
                                             expected, counts[s], fields_));
        }
        // Every node works on its share while the replies are read.
        std::vector<RedisConnection*> nodes;
        for (const auto s : pending)
            if (std::find(nodes.begin(), nodes.end(), to[s]) == nodes.end()) nodes.push_back(to[s]);
        for (auto* node : nodes) node->flush();
        // Redis runs the scripts; the caller meanwhile does its part.
        if (round == 0) run_while_waiting();
        if (unwatch && round == 0) unwatched->get_reply_raw();  // OK; nothing to act on either way
        std::vector<std::size_t> redirected;
        bool moved = false;
        for (const auto s : pending) {
            if (unwatching[s]) to[s]->get_reply_raw();  // UNWATCH: OK
            unwatching[s] = 0;
            if (asking[s]) to[s]->get_reply_raw();  // ASKING: OK
            asking[s] = 0;
            replies[s] = to[s]->get_reply_raw();  // read every reply, even after a failure
            const redisReply* r = replies[s].get();
            // Followed by a target whose keys spread over slots; one
            // server's MOVED is an error like any other.
            const auto redirect = target_->per_slot() && is_error(r) ? parse_redirect(reply_text(r)) : std::nullopt;
            if (!redirect || round >= kMaxRedirectRounds) continue;
            spdlog::debug("stream \"{}\": {}; sending its share again", keys[s], reply_text(r));
            if (redirect->kind == Redirect::Kind::ask) {
                RedisConnection* node = target_->redirected(*redirect, keys[s]);
                if (node == nullptr) continue;
                to[s] = node;
                asking[s] = 1;
            } else {
                moved = true;  // the slot map changed: a reshard, a failover
            }
            redirected.push_back(s);
        }
        if (moved) target_->refresh();
        pending = std::move(redirected);
    }

    Written last;
    std::exception_ptr failure;
    // The servers that no longer hold the script (restarted, flushed).
    std::vector<RedisConnection*> reload;
    std::uint64_t written = 0, already = 0;
    for (std::size_t s = 0; s < keys.size(); ++s) {
        auto r = std::move(replies[s]);
        if (is_error(r.get())) {
            auto error = make_error(*r);
            if (error_is<NoScriptError>(error) && std::find(reload.begin(), reload.end(), to[s]) == reload.end())
                reload.push_back(to[s]);
            if (!failure) failure = std::move(error);
            continue;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 2)
            throw RedisError(RedisError::Kind::reply, "unexpected reply from the append script");
        const auto w = static_cast<std::size_t>(r->element[0]->integer);
        const auto a = static_cast<std::size_t>(r->element[1]->integer);
        written += w;
        already += count_already(keys[s], per_stream[s], a);
        if (w + a > 0) {
            const Event& top = *per_stream[s][w + a - 1];
            last[keys[s]] = top.position;
            if (explicit_ids) known_[keys[s]] = top.parsed;
        }
        if (r->elements >= 3 && reply_text(r->element[2]).rfind(kBehindError, 0) == 0) {
            // Redis lost entries of this stream; nothing of the batch was
            // written to it. Check every stream and rewind before retrying.
            stream_behind_ = true;
            if (!failure)
                failure = std::make_exception_ptr(
                    RedisError(RedisError::Kind::reply,
                               "stream \"" + keys[s] + "\" lost entries: its last id is " +
                                   std::string(reply_text(r->element[2]).substr(kBehindError.size()))));
        } else if (r->elements >= 3 && !failure) {
            const Event& bad = *per_stream[s][w + a];
            if (reply_text(r->element[2]).rfind("PGOUTBOX_FOREIGN", 0) == 0)
                spdlog::error("stream \"{}\" holds an entry this group did not write at or above {}: the event {} "
                              "cannot be appended at its position, and is not skipped; if this database was "
                              "restored into another cluster or failed over to one with an older history, run "
                              "outbox_reanchor('{}'); otherwise remove the foreign entries or publish to another "
                              "stream (--stream)",
                              keys[s], bad.position, bad.event_id, config_.group);
            // The error of the entry's XADD, as the script caught it (OOM,
            // READONLY, ...), or the script's own (PGOUTBOX_FOREIGN).
            failure = make_error(reply_text(r->element[2]), {},
                                 "event " + bad.event_id + " at " + bad.position + " to stream \"" + keys[s] + "\"");
        }
    }
    metrics_.events_published += written;
    metrics_.events_already_published += already;
    if (already > 0) spdlog::info("{} events were already in Redis (published before a crash or takeover)", already);
    if (failure) {
        for (auto* node : reload) load_script(*node);
        std::rethrow_exception(failure);
    }
    return last;
}

}  // namespace pg_outbox
