#include "pg_outbox/publisher.hpp"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <thread>
#include <unordered_map>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/position.hpp"

namespace pg_outbox {

namespace {

// The relay's SQL: calls of the extension's API, with parameters.
constexpr const char* kLeadSql = "SELECT outbox_lead($1)";
constexpr const char* kResignSql = "SELECT outbox_resign($1)";
constexpr const char* kWaitingSql = "SELECT outbox_relay_waiting()";
// The age of the batch's first (oldest) event for the lag metric, computed
// for that row only: on every row it cost about 5% of the fetch.
// created_at as RFC 3339 in UTC with microseconds, whatever the session's
// DateStyle and TimeZone (which the relay pins as well).
constexpr const char* kFetchSql =
    "SELECT pos, event_id, topic, key, payload, headers,"
    "       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
    "       CASE WHEN ordinality = 1 THEN extract(epoch FROM clock_timestamp() - created_at) END"
    "  FROM outbox_fetch($1, $2, $3, $4::interval) WITH ORDINALITY";
constexpr const char* kAdvanceSql = "SELECT outbox_advance($1, $2, $3::jsonb)";
// The same without waiting for the commit's WAL flush. With explicit ids an
// advance lost in a PostgreSQL crash costs nothing but a replay that Redis
// refuses as already present: the cursor and the streams' last positions
// go back together, and anything durable that depends on them (retention)
// flushes the advance's commit record first.
constexpr const char* kAdvanceAsyncSql =
    "SELECT outbox_advance($1, $2, $3::jsonb) FROM set_config('synchronous_commit', 'off', true)";
constexpr const char* kStreamsSql =
    "SELECT streams::text, cursor FROM outbox.groups WHERE name = $1";
constexpr const char* kRewindSql = "SELECT outbox_rewind($1, $2)";
// Maintenance, unless something ran it within the interval ($1, in ms).
constexpr const char* kMaintainSql =
    "SELECT CASE WHEN coalesce(m.last_finished_at < now() - $1 * interval '1 millisecond', true)"
    "            THEN (SELECT count(*) FROM outbox_maintain() WHERE action <> 'skipped') END"
    "  FROM outbox.maintenance m";

// Raised when the session no longer leads its group (a standby took over).
struct LostLeadership {};

// Raised when outbox_rewind() moved the group's cursor while this session
// led it (SQLSTATE OB002): what was read ahead of the old cursor, and the
// positions not yet advanced to, no longer count.
struct GroupRewound {
    std::string message;
};

// Turns the server's refusals of a leader's fetch or advance into
// GroupRewound (OB002) and LostLeadership (OB003); rethrows the rest.
[[noreturn]] void rethrow_refusal(const PgError& e) {
    if (e.sqlstate() == "OB002" && !e.connection_lost()) throw GroupRewound{e.what()};
    // The leadership passed to another session (this relay's lease ran
    // out while it made no progress): stand by.
    if (e.sqlstate() == "OB003" && !e.connection_lost()) throw LostLeadership{};
    throw e;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The last id of a stream from its XINFO STREAM reply, as the append
// script reads it: 0-0 when the stream does not exist; nullopt for any
// other error (WRONGTYPE, ...).
std::optional<Position> stream_last_id(const redisReply* info) {
    if (info->type == REDIS_REPLY_ERROR) {
        if (reply_text(info).find("no such key") != std::string_view::npos) return Position{};
        return std::nullopt;
    }
    if (const redisReply* id = map_field(info, "last-generated-id"))
        return Position::parse(reply_text(id)).value_or(Position{});
    return Position{};
}

// How often the cursor moves while batches keep coming (explicit ids).
constexpr std::chrono::milliseconds kAdvanceInterval{100};

// The longest sleep in outbox_fetch(): a stop request waits for it.
constexpr std::chrono::milliseconds kFetchWaitSlice{100};

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

}  // namespace

Publisher::Publisher(const Config& config, Metrics& metrics, const std::atomic<bool>& stop)
    : Service(config, metrics, stop, "pg_outbox_relay publish " + config.group),
      maxlen_text_(std::to_string(config.maxlen)),
      next_maintain_(std::chrono::steady_clock::now()),
      lag_(config.pg_conninfo, config.group, config.stats_interval, metrics) {
    spdlog::info("publishing group \"{}\" to {} as {}", config_.group, config_.redis.to_string(),
                 config_.stream_template);
}

// Names of the statements prepared on each connection.
constexpr const char* kFetchStatement = "pg_outbox_fetch";
constexpr const char* kAdvanceStatement = "pg_outbox_advance";
constexpr const char* kWaitingStatement = "pg_outbox_relay_waiting";

void Publisher::on_pg_connected() {
    // The lease of this session's leadership (outbox.lead renews it with
    // each fetch and advance).
    pg_->exec("SELECT pg_catalog.set_config('pg_outbox.lease', $1, false)",
              {std::to_string(config_.lease.count()) + "ms"});
    if (config_.listen) pg_->listen("pg_outbox");
    // With pg_outbox preloaded (outbox_relay_waiting() says notifications
    // are sent on demand), the server can sleep in outbox_fetch() instead.
    sleeps_in_fetch_ = config_.listen && pg_->exec(kWaitingSql).get(0, 0) == "t";
    // The calls of every batch, and of every time the feed runs dry.
    pg_->prepare(kFetchStatement, kFetchSql);
    pg_->prepare(kWaitingStatement, kWaitingSql);
    pg_->prepare(kAdvanceStatement,
                 config_.id_mode == IdMode::explicit_position ? kAdvanceAsyncSql : kAdvanceSql);
    streams_checked_ = false;
}

void Publisher::on_redis_connected() {
    streams_checked_ = false;
    watched_.clear();
    load_script();
    check_transactions();
}

// Whether this connection takes MULTI (an ACL or a proxy may refuse it).
// Without it the XADDs of the fast path would run one by one, no longer
// guarded by WATCH, so the script writes every batch instead.
void Publisher::check_transactions() {
    transactions_refused_ = false;
    watched_.clear();
    if (config_.id_mode != IdMode::explicit_position) return;
    redis_->append({"MULTI"});
    redis_->append({"DISCARD"});
    auto multi = redis_->get_reply_raw();
    redis_->get_reply_raw();
    if (multi->type == REDIS_REPLY_ERROR) {
        transactions_refused_ = true;
        spdlog::warn("Redis refused MULTI ({}); every batch goes through the append script",
                     reply_text(multi.get()));
    }
}

void Publisher::load_script() {
    auto r = redis_->command({"SCRIPT", "LOAD", kAppendScript});
    script_sha_ = std::string(reply_text(r.get()));
}

void Publisher::on_pg_lost() {
    prefetched_.clear();
    unadvanced_.reset();
    advance_sent_ = false;
    metrics_.redis_oom = false;  // what Redis refuses says nothing while standing by
    if (metrics_.leader.exchange(false))
        spdlog::warn("lost the leadership of group \"{}\" with the connection", config_.group);
}

void Publisher::on_redis_fault() {
    // Unless the backlog is known to be empty, events wait from now on if
    // they did not already (a fault may come before any fetch, e.g. in the
    // check of the streams).
    if (metrics_.leader && metrics_.lag_events.load() != 0) metrics_.batch_waiting();
    watched_.clear();
    prefetched_.clear();
    unadvanced_.reset();
    streams_checked_ = false;
}

bool Publisher::take_leadership() {
    bool leads = false;
    try {
        leads = pg_->exec(kLeadSql, {config_.group}).get(0, 0) == "t";
    } catch (const PgError& e) {
        // Refused once (OB003) when the leadership this session held passed
        // to another meanwhile; the next call looks again.
        if (e.sqlstate() != "OB003" || e.connection_lost()) throw;
    }
    if (leads && !metrics_.leader.exchange(true)) {
        metrics_.caught_up();
        spdlog::info("leading group \"{}\"", config_.group);
        streams_checked_ = false;
    }
    if (leads) {
        standing_by_ = false;
    } else if (!standing_by_) {
        standing_by_ = true;
        spdlog::info("standing by: group \"{}\" is led by {}", config_.group, describe_leader(*pg_, config_.group));
    }
    return leads;
}

// Finds out whether Redis lost entries the group published: a stream
// whose last id is below the last position the group published to it
// (Redis flushed, restarted without its last writes, or failed over to a
// replica that was behind). The group then rewinds to the lowest such id
// and publishes again from the outbox; entries Redis still has are
// refused as already present. Runs when the relay starts leading, after
// each reconnect, when the append script reports a stream behind, and
// every --stats-interval.
void Publisher::check_streams() {
    next_check_ = std::chrono::steady_clock::now() + config_.stats_interval;
    if (config_.id_mode != IdMode::explicit_position) return;
    auto r = pg_->exec(kStreamsSql, {config_.group});
    if (r.rows() == 0) return;
    const auto published = nlohmann::json::parse(r.get(0, 0));
    const auto cursor = Position::parse(r.get(0, 1));
    std::optional<Position> rewind_to;
    known_.clear();
    for (const auto& [stream, value] : published.items()) {
        const auto expected = Position::parse(value.get<std::string>());
        if (!expected) continue;
        auto info = redis_->command_raw({"XINFO", "STREAM", stream});  // "no such key" is 0-0
        const auto last_id = stream_last_id(info.get());
        if (!last_id)
            throw RedisError(RedisError::Kind::reply,
                             "XINFO STREAM " + stream + ": " + std::string(reply_text(info.get())));
        const Position last = *last_id;
        if (last < *expected) {
            spdlog::error("stream \"{}\" is behind: Redis has entries up to {}, group \"{}\" published up to {}; "
                          "republishing from the outbox",
                          stream, last.to_string(), config_.group, expected->to_string());
            if (!rewind_to || last < *rewind_to) rewind_to = last;
            known_[stream] = last;
        } else {
            known_[stream] = *expected;
        }
    }
    if (rewind_to && cursor && *rewind_to < *cursor) {
        pg_->exec(kRewindSql, {config_.group, rewind_to->to_string()});
        metrics_.streams_rewound++;
        spdlog::error("group \"{}\" rewound from {} to {}", config_.group, cursor->to_string(), rewind_to->to_string());
    }
}

void Publisher::send_fetch(const std::string* after, std::chrono::milliseconds wait) {
    fetch_sent_ = std::chrono::steady_clock::now();
    fetch_waits_ = wait.count() > 0;
    pg_->send_prepared(kFetchStatement, {config_.group, std::to_string(config_.batch_size),
                                         after ? Param(*after) : std::nullopt,
                                         fetch_waits_ ? Param(std::to_string(wait.count()) + " ms") : std::nullopt});
}

std::vector<Event> Publisher::receive_fetch() {
    auto r = [this] {
        try {
            return pg_->receive();
        } catch (const PgError& e) {
            rethrow_refusal(e);
        }
    }();
    if (!fetch_waits_) metrics_.pg_rtt_seconds = seconds_since(fetch_sent_);
    std::vector<Event> batch;
    batch.reserve(r.rows());
    for (int i = 0; i < r.rows(); ++i) {
        Event e;
        e.position = r.get(i, 0);
        e.event_id = r.get(i, 1);
        e.topic = r.get(i, 2);
        if (auto k = r.get_optional(i, 3)) e.key = std::string(*k);
        e.payload = r.get(i, 4);
        if (auto h = r.get_optional(i, 5)) e.headers = std::string(*h);
        e.created_at = r.get(i, 6);
        const auto parsed = Position::parse(e.position);
        if (!parsed) throw PgError("outbox_fetch returned a malformed position \"" + e.position + "\"", "XX000", false);
        e.parsed = *parsed;
        batch.push_back(std::move(e));
    }
    if (r.rows() > 0) {
        metrics_.lag_seconds = std::stod(std::string(r.get(0, 7)));
        metrics_.batch_waiting();
    } else {
        metrics_.caught_up();
    }
    return batch;
}

Publisher::Shares Publisher::split(std::span<const Event> batch) const {
    Shares shares;
    // The stream of each topic, expanded once a batch; topics may share a
    // stream.
    std::unordered_map<std::string_view, std::size_t> slot_of_topic;
    for (const auto& e : batch) {
        auto slot = slot_of_topic.find(e.topic);
        if (slot == slot_of_topic.end()) {
            auto key = expand_stream_key(config_.stream_template, e.topic, config_.group);
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

// Redis refused a write for want of memory (maxmemory, noeviction).
static bool is_oom(const RedisError& e) { return e.kind() == RedisError::Kind::reply && e.code() == "OOM"; }

std::map<std::string, std::string> Publisher::publish(const std::vector<Event>& batch) {
    RttTimer rtt(metrics_.redis_rtt_seconds);
    std::map<std::string, std::string> last;
    const auto max_bytes = static_cast<std::size_t>(config_.batch_bytes);
    for (std::size_t from = 0; from < batch.size();) {
        // The next part: events until the next would exceed --batch-bytes,
        // fewer while Redis is short of memory, at least one.
        std::size_t to = from, bytes = 0;
        while (to < batch.size() && (oom_limit_ == 0 || to - from < oom_limit_)) {
            const auto b = entry_bytes(batch[to]);
            if (to > from && bytes + b > max_bytes) break;
            bytes += b;
            ++to;
        }
        const auto written_before = metrics_.events_published.load();
        try {
            for (auto& [stream, position] : write_part(std::span<const Event>(batch).subspan(from, to - from)))
                last[stream] = std::move(position);
        } catch (const RedisError& e) {
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
            pause(config_.retry_min);
            continue;
        }
        if (metrics_.redis_oom.exchange(false)) spdlog::info("Redis accepts writes again");
        if (oom_limit_ > 0) oom_limit_ = oom_limit_ * 2 >= batch.size() ? 0 : oom_limit_ * 2;
        from = to;
    }
    return last;
}

std::map<std::string, std::string> Publisher::write_part(std::span<const Event> events) {
    const auto shares = split(events);
    std::map<std::string, std::string> last;
    if (config_.id_mode == IdMode::explicit_position && !script_next_ && !transactions_refused_) {
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
void Publisher::format_look(std::string& out, const std::vector<std::string>& keys) {
    std::vector<std::string_view> watch{"WATCH"};
    watch.insert(watch.end(), keys.begin(), keys.end());
    format_command(out, watch);
    for (const auto& key : keys) format_command(out, {"XINFO", "STREAM", key});
}

// Reads the replies of a look at streams: each stream's last id, recorded
// in watched_ while the WATCH holds. WATCH may be refused for one batch
// (CROSSSLOT: streams in several slots of a cluster node) or for good (an
// ACL): the streams are then not watched, and the script writes the batch.
void Publisher::read_look(const std::vector<std::string>& keys) {
    auto watched = redis_->get_reply_raw();
    const bool ok = watched->type != REDIS_REPLY_ERROR;
    if (!ok) spdlog::debug("Redis refused WATCH ({}); appending with the script", reply_text(watched.get()));
    for (const auto& key : keys) {
        auto info = redis_->get_reply_raw();  // read every reply
        if (ok) watched_[key] = stream_last_id(info.get());
    }
}

// Whether every stream of the batch is watched and as this relay left it:
// its last id when watched is the last position the relay published there
// (0-0, or no stream at all, when it published none), and the batch's
// entries lie above it. The append script would then write every entry,
// and so do plain XADDs, as long as no stream changes before EXEC (WATCH
// sees to that). Anything else (Redis lost entries, another writer, a
// replay after a rewind or a crash, a stream of another type) is for the
// script to sort out.
bool Publisher::streams_as_known(const Shares& shares) const {
    for (std::size_t s = 0; s < shares.keys.size(); ++s) {
        const auto w = watched_.find(shares.keys[s]);
        const std::optional<Position> last = w == watched_.end() ? std::nullopt : w->second;
        const auto known = known_.find(shares.keys[s]);
        const Position expected = known == known_.end() ? Position{} : known->second;
        const Position first = shares.events[s].front()->parsed;
        if (!(last && *last == expected && expected < first)) {
            spdlog::debug("stream \"{}\": last id {}, expected {}, batch from {}; appending with the script",
                          shares.keys[s], last ? last->to_string() : std::string("unknown"), expected.to_string(),
                          shares.events[s].front()->position);
            return false;
        }
    }
    return true;
}

Publisher::Transaction Publisher::write_transaction(const Shares& shares, std::map<std::string, std::string>& last) {
    // Streams still watched since the last transaction (which looked at
    // its own streams again after EXEC) need no look; most batches go to
    // the streams of the one before, so most batches take one round trip.
    // Otherwise the transaction is formatted while the look makes its
    // round trip, and thrown away in the rare case the streams are not as
    // known.
    std::vector<std::string> unwatched;
    for (const auto& key : shares.keys)
        if (watched_.find(key) == watched_.end()) unwatched.push_back(key);
    if (!unwatched.empty()) {
        look_.clear();
        format_look(look_, unwatched);
        redis_->append_formatted(look_);
        redis_->flush();
    }
    transaction_.clear();
    format_command(transaction_, {"MULTI"});
    const std::string_view maxlen = config_.maxlen > 0 ? std::string_view(maxlen_text_) : std::string_view();
    std::vector<std::string_view> argv;
    std::size_t entries = 0;
    for (std::size_t s = 0; s < shares.keys.size(); ++s) {
        for (const Event* e : shares.events[s]) {
            xadd_argv(argv, shares.keys[s], *e, maxlen);
            format_command(transaction_, argv);
        }
        entries += shares.events[s].size();
    }
    format_command(transaction_, {"EXEC"});
    // EXEC ends every WATCH: look at the streams again for the next batch,
    // in the same round trip.
    format_look(transaction_, shares.keys);
    if (!unwatched.empty()) read_look(unwatched);
    if (!streams_as_known(shares)) return Transaction::declined;
    redis_->append_formatted(transaction_);

    // Read every reply before deciding, so that the connection is left
    // outside the transaction whatever happens.
    auto multi = redis_->get_reply_raw();
    std::optional<std::string> refused;  // the first command Redis would not queue
    for (std::size_t i = 0; i < entries; ++i) {
        auto r = redis_->get_reply_raw();
        if (r->type == REDIS_REPLY_ERROR && !refused) refused = std::string(reply_text(r.get()));
    }
    auto exec = redis_->get_reply_raw();
    watched_.clear();
    read_look(shares.keys);

    if (multi->type == REDIS_REPLY_ERROR) {
        // Refused since the connection was checked: the XADDs ran one by
        // one. The batch fails and the script looks at what they wrote.
        spdlog::warn("Redis refused MULTI ({}); appending with the script only until the next connection",
                     reply_text(multi.get()));
        transactions_refused_ = true;
        throw RedisError(RedisError::Kind::reply, "MULTI: " + std::string(reply_text(multi.get())));
    }
    if (exec->type == REDIS_REPLY_NIL) return Transaction::aborted;
    if (exec->type == REDIS_REPLY_ERROR) {
        // Nothing ran: a command was refused when queued (OOM, READONLY,
        // ...), or the whole transaction at EXEC. The error of the first
        // refused command names the cause for the metrics.
        script_next_ = true;
        std::string why = refused ? *refused : std::string(reply_text(exec.get()));
        if (constexpr std::string_view prefix = "EXECABORT Transaction discarded because of: ";
            why.rfind(prefix, 0) == 0)
            why.erase(0, prefix.size());
        throw RedisError(RedisError::Kind::reply, why);
    }
    if (exec->type != REDIS_REPLY_ARRAY || exec->elements != entries) {
        script_next_ = true;
        throw RedisError(RedisError::Kind::reply, "unexpected reply to EXEC");
    }
    return read_transaction_replies(shares, exec.get(), last);
}

// The replies of the XADDs of a transaction that ran. Each entry was
// checked to lie above its stream's last id, so none should fail; if one
// does, Redis went on with the next ones (a transaction has no rollback):
// the batch fails, the cursor stays, and the script looks at the streams
// next time, refusing loudly a later entry that got in before a failed one.
Publisher::Transaction Publisher::read_transaction_replies(const Shares& shares, const redisReply* exec,
                                                           std::map<std::string, std::string>& last) {
    std::optional<RedisError> failure;
    std::uint64_t written = 0;
    std::size_t i = 0;
    for (std::size_t s = 0; s < shares.keys.size(); ++s) {
        const Event* top = nullptr;
        for (const Event* e : shares.events[s]) {
            const redisReply* r = exec->element[i++];
            if (r->type == REDIS_REPLY_ERROR) {
                if (!failure)
                    failure.emplace(RedisError::Kind::reply, std::string(reply_text(r)) + " (event " + e->event_id +
                                                                 " at " + e->position + " to stream \"" +
                                                                 shares.keys[s] + "\")");
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
    if (failure) {
        script_next_ = true;
        throw *failure;
    }
    return Transaction::written;
}

// The script reports how many entries of a stream's share it found
// already present: the first "n" (once one is written, the rest lie above
// the stream's top). A batch that fails on another stream is retried
// whole, and finds them present again: each entry counts once.
std::size_t Publisher::count_already(const std::string& key, const std::vector<const Event*>& events, std::size_t n) {
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

std::map<std::string, std::string> Publisher::write_with_script(const Shares& shares) {
    const auto& keys = shares.keys;
    const auto& per_stream = shares.events;
    // The script's writes would abort the next transaction on a stream
    // still watched.
    const bool unwatch = !watched_.empty();
    if (unwatch) redis_->append({"UNWATCH"});
    watched_.clear();
    const bool explicit_ids = config_.id_mode == IdMode::explicit_position;
    std::vector<std::vector<std::string>> counts(keys.size());
    for (std::size_t s = 0; s < keys.size(); ++s) {
        std::string expected;
        if (explicit_ids) {
            const auto known = known_.find(keys[s]);
            if (known != known_.end()) expected = known->second.to_string();
        }
        redis_->append(
            append_script_argv(script_sha_, keys[s], per_stream[s], config_.id_mode, maxlen_text_, expected, counts[s]));
    }
    if (unwatch) redis_->get_reply_raw();  // OK; nothing to act on either way

    std::map<std::string, std::string> last;
    std::optional<RedisError> failure;
    std::uint64_t written = 0, already = 0;
    for (std::size_t s = 0; s < keys.size(); ++s) {
        auto r = redis_->get_reply_raw();  // read every reply, even after a failure
        if (r->type == REDIS_REPLY_ERROR) {
            if (!failure) failure.emplace(RedisError::Kind::reply, std::string(reply_text(r.get())));
            if (reply_text(r.get()).rfind("NOSCRIPT", 0) == 0) script_sha_.clear();
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
            streams_checked_ = false;
            if (!failure)
                failure.emplace(RedisError::Kind::reply, "stream \"" + keys[s] + "\" lost entries: its last id is " +
                                                             std::string(reply_text(r->element[2]).substr(kBehindError.size())));
        } else if (r->elements >= 3 && !failure) {
            const Event& bad = *per_stream[s][w + a];
            if (reply_text(r->element[2]).rfind("PGOUTBOX_FOREIGN", 0) == 0)
                spdlog::error("stream \"{}\" holds an entry this group did not write at or above {}: the event {} "
                              "cannot be appended at its position, and is not skipped; if this database was "
                              "restored into another cluster or failed over to one with an older history, run "
                              "outbox_reanchor('{}'); otherwise remove the foreign entries or publish to another "
                              "stream (--stream)",
                              keys[s], bad.position, bad.event_id, config_.group);
            failure.emplace(RedisError::Kind::reply,
                            std::string(reply_text(r->element[2])) + " (event " + bad.event_id + " at " +
                                bad.position + " to stream \"" + keys[s] + "\")");
        }
    }
    metrics_.events_published += written;
    metrics_.events_already_published += already;
    if (already > 0) spdlog::info("{} events were already in Redis (published before a crash or takeover)", already);
    if (failure) {
        if (script_sha_.empty()) load_script();
        throw *failure;
    }
    return last;
}

// With explicit ids the cursor moves at most every kAdvanceInterval (also
// when the feed runs dry: the relay wakes up for it) and when the relay
// stops: a batch's advance costs the server about what fetching a small
// batch costs, and a relay keeping up with a trickle of commits publishes
// hundreds of batches a second, running dry between most of them.
// An advance lost in a crash costs a replay of at most that interval,
// which Redis refuses as already present. With ids Redis generates, a
// replay would duplicate entries, so every batch advances.
bool Publisher::advance_due() const {
    return config_.id_mode != IdMode::explicit_position ||
           std::chrono::steady_clock::now() - advance_sent_at_ >= kAdvanceInterval;
}

// Adds a batch Redis acknowledged to what the next advance records.
void Publisher::record_published(const std::string& position, std::map<std::string, std::string> streams) {
    if (!unadvanced_) unadvanced_.emplace();
    unadvanced_->first = position;
    for (auto& [stream, last] : streams) unadvanced_->second[stream] = std::move(last);
}

void Publisher::send_advance() {
    if (!unadvanced_) return;
    nlohmann::json j(unadvanced_->second);
    pg_->send_prepared(kAdvanceStatement, {config_.group, unadvanced_->first, j.dump()});
    advance_sent_ = true;
    advance_sent_at_ = std::chrono::steady_clock::now();
}

void Publisher::receive_advance() {
    if (!advance_sent_) return;
    advance_sent_ = false;
    try {
        pg_->receive();
    } catch (const PgError& e) {
        unadvanced_.reset();
        rethrow_refusal(e);
    }
    unadvanced_.reset();
}

void Publisher::flush_advance() {
    send_advance();
    receive_advance();
}

// Runs partition maintenance when no background worker does (the
// extension's worker needs shared_preload_libraries). It takes the better
// part of a second on a large table, so while there is a backlog it waits
// for the feed to run dry ("idle"), for one more interval at most. A
// failure is logged and does not stop publishing.
void Publisher::maybe_maintain(bool idle) {
    if (config_.maintain_interval.count() == 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_maintain_) return;
    if (!idle && now < next_maintain_ + config_.maintain_interval) return;
    next_maintain_ = now + config_.maintain_interval;
    try {
        const auto t0 = std::chrono::steady_clock::now();
        auto r = pg_->exec(kMaintainSql, {std::to_string(config_.maintain_interval.count())});
        if (r.rows() > 0 && !r.is_null(0, 0) && r.get(0, 0) != "0")
            spdlog::info("partition maintenance: {} actions (see outbox.maintenance and the server log)", r.get(0, 0));
        else
            spdlog::debug("partition maintenance: nothing to do ({:.1f} ms)", seconds_since(t0) * 1000);
    } catch (const PgError& e) {
        if (e.connection_lost()) throw;
        metrics_.count_error("maintenance");
        spdlog::warn("partition maintenance failed, publishing goes on: {}", e.what());
    }
}

// Waits for a notification, the timeout or a stop request, whichever
// comes first.
void Publisher::wait(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!stop_) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
        if (left.count() <= 0) return;
        const auto slice = std::min(left, std::chrono::milliseconds(100));
        if (pg_) {
            if (pg_->wait_for_notification(slice) > 0) return;
        } else {
            std::this_thread::sleep_for(slice);
        }
    }
}

void Publisher::turn() {
    if (!metrics_.leader && !take_leadership()) {
        wait(config_.poll_interval);
        return;
    }
    try {
        if (!streams_checked_ || std::chrono::steady_clock::now() >= next_check_) {
            flush_advance();
            prefetched_.clear();
            check_streams();
            streams_checked_ = true;
        }
        maybe_maintain(false);
        auto batch = std::move(prefetched_);
        prefetched_.clear();
        if (batch.empty()) batch = fetch();
        if (batch.empty() && config_.listen && !sleeps_in_fetch_) {
            // About to sleep: ask for a notification (the next committing
            // emitter sends one), then look once more for what committed
            // before the request, in the same round trip.
            pg_->send_prepared(kWaitingStatement);
            send_next_fetch();
            pg_->receive();
            batch = receive_fetch();
        }
        if (batch.empty()) {
            // A relay keeping up with a trickle of commits runs dry many
            // times a second: the cursor still moves at most every
            // kAdvanceInterval, and the sleep ends when it is due.
            auto sleep = config_.poll_interval;
            if (advance_due())
                flush_advance();
            else if (unadvanced_)
                sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::milliseconds>(
                                            advance_sent_at_ + kAdvanceInterval - std::chrono::steady_clock::now()) +
                                            std::chrono::milliseconds(1));
            maybe_maintain(true);
            if (sleeps_in_fetch_) {
                // The server sleeps until a commit that emitted wakes it and
                // returns the batch then: one hop from the commit to the
                // rows, where a notification would wake this relay to send
                // a fetch. In slices, so that a stop request is seen.
                send_next_fetch(std::min(sleep, kFetchWaitSlice));
                prefetched_ = receive_fetch();
            } else {
                wait(sleep);
            }
            return;
        }
        const auto t0 = std::chrono::steady_clock::now();
        // While Redis writes this batch, PostgreSQL advances the cursor past
        // the previous ones (when an advance is due) and fetches the next.
        if (advance_due()) send_advance();
        send_fetch(&batch.back().position);
        std::map<std::string, std::string> streams;
        try {
            streams = publish(batch);
        } catch (...) {
            try {
                receive_advance();
                pg_->receive();
            } catch (const PgError&) {
                // The next turn finds the connection broken, if it is.
            } catch (const LostLeadership&) {
            } catch (const GroupRewound&) {
                // The next fetch, from the moved cursor, says so again.
            }
            throw;
        }
        const auto t1 = std::chrono::steady_clock::now();
        metrics_.batches_published++;
        metrics_.batch_published();
        receive_advance();
        prefetched_ = receive_fetch();
        record_published(batch.back().position, std::move(streams));
        spdlog::debug("published {} events up to {} (redis {:.2f} ms, overlapped with the advance and next fetch; "
                      "turn {:.2f} ms)",
                      batch.size(), batch.back().position, metrics_.redis_rtt_seconds * 1000,
                      std::chrono::duration<double, std::milli>(t1 - t0).count() + seconds_since(t1) * 1000);
    } catch (const LostLeadership&) {
        discard_queued();
        prefetched_.clear();
        metrics_.leader = false;
        metrics_.redis_oom = false;
        spdlog::warn("group \"{}\" is led by another session now; standing by", config_.group);
    } catch (const GroupRewound& e) {
        // Published entries stay (their ids make a replay harmless); the
        // next fetch starts at the moved cursor, and the streams are
        // looked at again before it.
        discard_queued();
        prefetched_.clear();
        unadvanced_.reset();
        streams_checked_ = false;
        metrics_.rewinds_noticed++;
        spdlog::warn("{}; publishing from the moved cursor", e.message);
    }
}

// Reads and drops the results still queued on the connection.
void Publisher::discard_queued() {
    while (pg_->queued() > 0) {
        try {
            pg_->receive();
        } catch (const PgError&) {
            // results of an abandoned turn: nothing to keep
        }
    }
}

void Publisher::on_stop() {
    if (!pg_ || !metrics_.leader) return;
    try {
        flush_advance();
        pg_->exec(kResignSql, {config_.group});
        spdlog::info("resigned the leadership of group \"{}\"", config_.group);
    } catch (const PgError&) {
        // The connection is going away anyway, and the lock with it.
    } catch (const LostLeadership&) {
    } catch (const GroupRewound&) {
    }
}

}  // namespace pg_outbox
