// The PostgreSQL side of publishing a group. Everything here is a call of
// the extension's API on the leader's connection: the leadership (with
// the refusals OB003 and OB002 turned into LostLeadership and
// GroupRewound), the fetch pipelined with the advance, and maintenance.
// A cursor only moves past what Redis acknowledged (record_published()).
#include "pg_outbox/group_session.hpp"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include <regex>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/lag.hpp"
#include "pg_outbox/sqlstates.hpp"

namespace pg_outbox {

namespace {

// The relay's SQL: calls of the extension's API, with parameters. Every
// function, operator and type is named with its schema ("@extschema@" is
// the extension's, Extension::sql()) and every parameter has the type of
// the function's argument: no overload that another role planted in a
// schema on the search_path can match better (DESIGN.md, I-17).
constexpr const char* kLeadSql = "SELECT @extschema@.outbox_lead($1::pg_catalog.text)";
constexpr const char* kResignSql = "SELECT @extschema@.outbox_resign($1::pg_catalog.text)";
constexpr const char* kWaitingSql = "SELECT @extschema@.outbox_relay_waiting()";
constexpr const char* kLeaseSql =
    "SELECT pg_catalog.set_config('pg_outbox.lease'::pg_catalog.text, $1::pg_catalog.text, false)";
// The group's next batch, packed in one bytea: the fields the relay writes
// to its streams, as text, each with its length (extension/pack.c). The
// relay refuses any other version of the extension (extension.cpp), so
// every database it serves has it.
constexpr const char* kFetchPackedSql =
    "SELECT @extschema@.outbox_fetch_packed($1::pg_catalog.text, $2::pg_catalog.int4, $3::pg_catalog.text,"
    "                                       $4::pg_catalog.interval)";
constexpr const char* kAdvanceSql =
    "SELECT @extschema@.outbox_advance($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.jsonb)";
// The same without waiting for the commit's WAL flush. With explicit ids an
// advance lost in a PostgreSQL crash costs nothing but a replay that Redis
// refuses as already present: the cursor and the streams' last positions
// go back together, and anything durable that depends on them (retention)
// flushes the advance's commit record first.
constexpr const char* kAdvanceAsyncSql =
    "SELECT @extschema@.outbox_advance($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.jsonb)"
    "  FROM pg_catalog.set_config('synchronous_commit'::pg_catalog.text, 'off'::pg_catalog.text, true)";
// The group's or shard's row ($1 the group's name, $2 the shard), read
// through the extension's API, as everything the relay reads.
constexpr const char* kStreamsSql =
    "SELECT streams::pg_catalog.text, cursor_position FROM @extschema@.outbox_groups($1::pg_catalog.text)"
    " WHERE shard OPERATOR(pg_catalog.=) $2::pg_catalog.int4";
constexpr const char* kShardsSql =
    "SELECT shards, stream_template FROM @extschema@.outbox_groups($1::pg_catalog.text)"
    " WHERE shard OPERATOR(pg_catalog.=) $2::pg_catalog.int4";
// Records this relay's --stream template for the group when it has none
// (the leader only, before it publishes); returns the group's.
constexpr const char* kStreamTemplateSql =
    "SELECT @extschema@.outbox_stream_template($1::pg_catalog.text, $2::pg_catalog.text)";
constexpr const char* kRewindSql = "SELECT @extschema@.outbox_rewind($1::pg_catalog.text, $2::pg_catalog.text)";
// Maintenance, unless something ran it within the interval ($1): what it
// did, an action and its object a line ("moved outbox.event_..."), or null
// when it did not run.
constexpr const char* kMaintainSql =
    "SELECT CASE WHEN coalesce(m.last_finished_at OPERATOR(pg_catalog.<)"
    "                          (pg_catalog.now() OPERATOR(pg_catalog.-) $1::pg_catalog.interval), true)"
    "            THEN (SELECT coalesce(pg_catalog.string_agg(pg_catalog.concat_ws(' '::pg_catalog.text, a.action,"
    "                                                                              a.object, a.detail),"
    "                                                        ', '::pg_catalog.text), '')"
    "                    FROM @extschema@.outbox_maintain() a"
    "                   WHERE a.action OPERATOR(pg_catalog.<>) 'skipped'::pg_catalog.text) END"
    "  FROM @extschema@.outbox_maintenance_status() m";

// Names of the statements prepared on each connection.
constexpr const char* kFetchStatement = "pg_outbox_fetch";
constexpr const char* kAdvanceStatement = "pg_outbox_advance";
constexpr const char* kWaitingStatement = "pg_outbox_relay_waiting";

// A batch grows to this many times --batch-size while batches come back
// full, and never beyond what outbox_fetch() takes.
constexpr int kBatchGrowth = 4;
constexpr int kMaxBatchSize = 100000;

// How often the cursor moves while batches keep coming (explicit ids).
constexpr std::chrono::milliseconds kAdvanceInterval{100};

// Turns the server's refusals of a leader's fetch or advance into
// GroupRewound (OB002), LostLeadership (OB003) and EventTooLarge (OB004);
// rethrows the rest.
[[noreturn]] void rethrow_refusal(const PgError& e) {
    if (e.sqlstate() == sqlstate::kRewound && !e.connection_lost()) throw GroupRewound{e.what()};
    if (e.sqlstate() == sqlstate::kEventTooLarge && !e.connection_lost()) throw EventTooLarge{too_large_position(e.what()), e.what()};
    // The leadership passed to another session (this relay's lease ran
    // out while it made no progress): stand by.
    if (e.sqlstate() == sqlstate::kNotLeader && !e.connection_lost()) throw LostLeadership{};
    throw e;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string too_large_position(const std::string& message) {
    static const std::regex kPosition("event at position ([0-9]{1,20}-[0-9]{1,19}) of group");
    std::smatch m;
    return std::regex_search(message, m, kPosition) ? m[1].str() : std::string();
}

GroupSession::GroupSession(const Config& config, Metrics& metrics)
    : config_(config),
      metrics_(metrics),
      fetch_size_(config.batch_size),
      next_maintain_(std::chrono::steady_clock::now()) {}

void GroupSession::connected(PgConnection& pg, const Extension& extension) {
    pg_ = &pg;
    extension_ = &extension;
    check_shards();
    // The lease of this session's leadership (outbox.lead renews it with
    // each fetch and advance).
    pg_->exec(kLeaseSql, {std::to_string(config_.lease.count()) + "ms"});
    if (config_.listen) pg_->listen("pg_outbox");
    // With pg_outbox preloaded (outbox_relay_waiting() says notifications
    // are sent on demand), the server can sleep in outbox_fetch() instead.
    sleeps_in_fetch_ = config_.listen && pg_->exec(sql(kWaitingSql)).get(0, 0) == "t";
    // The calls of every batch, and of every time the feed runs dry.
    pg_->prepare(kFetchStatement, sql(kFetchPackedSql));
    pg_->prepare(kWaitingStatement, sql(kWaitingSql));
    pg_->prepare(kAdvanceStatement,
                 sql(config_.id_mode == IdMode::explicit_position ? kAdvanceAsyncSql : kAdvanceSql));
}

std::string GroupSession::sql(const char* statement) const { return extension_->sql(statement); }

// A sharded group is published a shard per publisher (a relay each, or a
// thread each of one relay), each to streams of its own: shards writing
// the same stream would refuse each other's entries as
// already present (positions of one shard are below the other's).
// A standby whose --stream is not the group's template is refused here,
// at once, rather than when it takes the group over.
void GroupSession::check_shards() {
    const auto name = config_.group_name();
    const int shard = config_.group_shard();
    const auto r = pg_->exec(sql(kShardsSql), {name, std::to_string(std::max(shard, 0))});
    if (r.rows() == 0) return;  // the fetch says what is wrong
    const int shards = std::stoi(std::string(r.get(0, 0)));
    if (shards > 1) {
        if (shard < 0) throw sharded_group_without_shard(config_.group, shards);
        if (config_.stream_template.find("{shard}") == std::string::npos)
            throw template_without_shard(config_.stream_template, name, shards);
    }
    if (const auto recorded = r.get_optional(0, 1)) check_template(*recorded);
}

// Two templates would split the group between two sets of streams, each
// missing what the other relay published.
void GroupSession::check_template(std::string_view recorded) const {
    if (recorded == config_.stream_template) return;
    throw ConfigError("--stream \"" + config_.stream_template + "\": group \"" + config_.group_name() +
                      "\" publishes with the stream template \"" + std::string(recorded) +
                      "\"; every relay of a group must write the same streams. Start this relay with --stream \"" +
                      std::string(recorded) +
                      "\", or change the group's template with outbox_group_set_stream_template() once every "
                      "relay of the group is stopped (docs/operations.md, Changing a group's stream template)");
}

// The group's template, recorded by its first leader before it publishes.
// Refused once (OB003) when the leadership passed to another session
// meanwhile: false, as a lead() that found another leader.
bool GroupSession::record_template() {
    std::string recorded;
    try {
        recorded = std::string(pg_->exec(sql(kStreamTemplateSql), {config_.group, config_.stream_template}).get(0, 0));
    } catch (const PgError& e) {
        if (e.sqlstate() != sqlstate::kNotLeader || e.connection_lost()) throw;
        return false;
    }
    check_template(recorded);
    return true;
}

ConfigError sharded_group_without_shard(const std::string& group, int shards) {
    return ConfigError("--group \"" + group + "\": the group has " + std::to_string(shards) + " shards; name one, " +
                       "--group " + group + "/0 to " + group + "/" + std::to_string(shards - 1) +
                       ", or every shard with --group '" + group + "/*'");
}

ConfigError template_without_shard(const std::string& stream_template, const std::string& name, int shards) {
    return ConfigError("--stream \"" + stream_template + "\": group \"" + name + "\" has " + std::to_string(shards) +
                       " shards, each with streams of its own: put {shard} in the template, as in "
                       "outbox:{topic}:{shard}");
}

void GroupSession::reset() {
    pg_ = nullptr;
    extension_ = nullptr;
    drop_prefetched();
    unadvanced_.reset();
    advance_sent_ = false;
    if (metrics_.leader.exchange(false))
        spdlog::warn("lost the leadership of group \"{}\" with the connection", config_.group);
}

bool GroupSession::lead() {
    bool leads = false;
    const auto sent = std::chrono::steady_clock::now();
    try {
        leads = pg_->exec(sql(kLeadSql), {config_.group}).get(0, 0) == "t";
    } catch (const PgError& e) {
        // Refused once (OB003) when the leadership this session held passed
        // to another meanwhile; the next call looks again.
        if (e.sqlstate() != sqlstate::kNotLeader || e.connection_lost()) throw;
    }
    if (leads) metrics_.lease_renewed(sent);
    // Before its first batch, a new leader records its template, or finds
    // the group's and is refused when it is another one.
    if (leads && !metrics_.leader.load()) leads = record_template();
    if (leads && !metrics_.leader.exchange(true)) {
        metrics_.caught_up();
        spdlog::info("leading group \"{}\"", config_.group);
    }
    if (leads) {
        standing_by_ = false;
    } else if (!standing_by_) {
        standing_by_ = true;
        spdlog::info("standing by: group \"{}\" is led by {}", config_.group, describe_leader(*pg_, *extension_, config_.group));
    }
    return leads;
}

void GroupSession::stand_by() {
    discard_queued();
    drop_prefetched();
    metrics_.leader = false;
}

void GroupSession::rewound() {
    discard_queued();
    drop_prefetched();
    unadvanced_.reset();
}

void GroupSession::resign() {
    flush_advance();
    pg_->exec(sql(kResignSql), {config_.group});
    spdlog::info("resigned the leadership of group \"{}\"", config_.group);
}

void GroupSession::send_fetch(const std::string* after, std::chrono::milliseconds wait) {
    fetch_sent_ = std::chrono::steady_clock::now();
    fetch_waits_ = wait.count() > 0;
    fetch_size_sent_ = fetch_size_;
    pg_->send_prepared(kFetchStatement, {config_.group, std::to_string(fetch_size_),
                                         after ? Param(*after) : std::nullopt,
                                         fetch_waits_ ? Param(std::to_string(wait.count()) + " ms") : std::nullopt},
                      /*binary_result=*/true);
}

// While batches come back full (a backlog), each next one asks for twice
// as many events, up to kBatchGrowth times --batch-size: the server's and
// the relay's cost per batch (a round trip, the call, the wake-ups) is
// then spread over more events. The first batch that is not full goes
// back to --batch-size. Writes to Redis keep their parts (--batch-bytes).
void GroupSession::size_next_fetch(std::size_t received) {
    if (received >= static_cast<std::size_t>(fetch_size_sent_))
        fetch_size_ = std::min({fetch_size_ * 2, config_.batch_size * kBatchGrowth, kMaxBatchSize});
    else
        fetch_size_ = config_.batch_size;
}

PackedBatch GroupSession::receive_batch() {
    auto r = [this] {
        try {
            return pg_->receive();
        } catch (const PgError& e) {
            rethrow_refusal(e);
        }
    }();
    metrics_.lease_renewed(fetch_sent_);  // a leader's fetch renews the lease
    if (!fetch_waits_) metrics_.pg_rtt_seconds = seconds_since(fetch_sent_);
    auto batch = unpack_fetch(r);
    size_next_fetch(batch.events.size());
    return batch;
}

void GroupSession::note_lag(const PackedBatch& batch) {
    if (batch.first_age_seconds) {
        metrics_.lag_seconds = *batch.first_age_seconds;
        metrics_.batch_waiting();
    } else {
        metrics_.caught_up();
    }
}

std::vector<Event> GroupSession::receive_fetch() {
    auto batch = receive_batch();
    note_lag(batch);
    return std::move(batch.events);
}

std::vector<Event> GroupSession::take_prefetched() {
    // Read during the write of the batch before it: what it says of the
    // lag counts now that the write succeeded.
    if (prefetched_unnoted_) note_lag(prefetched_);
    prefetched_unnoted_ = false;
    auto events = std::move(prefetched_.events);
    prefetched_ = {};
    return events;
}

void GroupSession::recycle(std::vector<Event> events) {
    // A batch of large payloads would otherwise keep its memory for as
    // long as the relay runs.
    constexpr std::size_t kRecycledFieldBytes = 64 * 1024;
    for (auto& e : events) {
        if (e.payload.capacity() > kRecycledFieldBytes) std::string().swap(e.payload);
        if (e.headers && e.headers->capacity() > kRecycledFieldBytes) e.headers.reset();
        if (e.key && e.key->capacity() > kRecycledFieldBytes) e.key.reset();
    }
    spare_ = std::move(events);
}

void GroupSession::receive_prefetch() {
    try {
        prefetched_ = receive_batch();
    } catch (const EventTooLarge&) {
        // Read ahead while the batch before the event is written: that
        // write goes on, and the next fetch, after it, reports the event.
        drop_prefetched();
        return;
    }
    prefetched_unnoted_ = !prefetched_.events.empty();
}

void GroupSession::drop_prefetched() {
    prefetched_ = {};
    prefetched_unnoted_ = false;
}

// The batch from outbox_fetch_packed()'s value.
PackedBatch GroupSession::unpack_fetch(const PgResult& r) {
    try {
        if (r.rows() != 1 || r.is_null(0, 0)) throw std::invalid_argument("no packed batch returned");
        PackedBatch out;
        out.events = std::move(spare_);
        unpack_batch(r.get(0, 0), out);
        return out;
    } catch (const std::invalid_argument& e) {
        throw PgError(std::string("outbox_fetch_packed returned a malformed batch: ") + e.what(), "XX000", false,
                      kFetchStatement);
    }
}

std::vector<Event> GroupSession::fetch_asking_for_wakeup() {
    pg_->send_prepared(kWaitingStatement);
    send_next_fetch();
    pg_->receive();
    return receive_fetch();
}

// With explicit ids the cursor moves at most every kAdvanceInterval (also
// when the feed runs dry: the relay wakes up for it) and when the relay
// stops: a batch's advance costs the server about what fetching a small
// batch costs, and a relay keeping up with a trickle of commits publishes
// hundreds of batches a second, running dry between most of them.
// An advance lost in a crash costs a replay of at most that interval,
// which Redis refuses as already present. With ids Redis generates, a
// replay would duplicate entries, so every batch advances.
bool GroupSession::advance_due() const {
    return config_.id_mode != IdMode::explicit_position ||
           std::chrono::steady_clock::now() - advance_sent_at_ >= kAdvanceInterval;
}

std::chrono::steady_clock::time_point GroupSession::next_advance_at() const {
    return advance_sent_at_ + kAdvanceInterval;
}

// Adds a batch Redis acknowledged to what the next advance records.
void GroupSession::record_published(const std::string& position, std::map<std::string, std::string> streams) {
    if (!unadvanced_) unadvanced_.emplace();
    unadvanced_->first = position;
    for (auto& [stream, last] : streams) unadvanced_->second[stream] = std::move(last);
}

void GroupSession::send_advance() {
    if (!unadvanced_) return;
    nlohmann::json j(unadvanced_->second);
    pg_->send_prepared(kAdvanceStatement, {config_.group, unadvanced_->first, j.dump()});
    advance_sent_ = true;
    advance_sent_at_ = std::chrono::steady_clock::now();
}

void GroupSession::receive_advance() {
    if (!advance_sent_) return;
    advance_sent_ = false;
    try {
        pg_->receive();
    } catch (const PgError& e) {
        unadvanced_.reset();
        rethrow_refusal(e);
    }
    metrics_.lease_renewed(advance_sent_at_);  // an advance renews the lease
    unadvanced_.reset();
}

void GroupSession::settle_pipeline() {
    try {
        receive_advance();
    } catch (const PgError&) {
        // The next turn finds the connection broken, if it is.
    } catch (const LostLeadership&) {
    } catch (const GroupRewound&) {
        // The next fetch, from the moved cursor, says so again.
    }
    // The fetch read ahead, unless it was received before the failure:
    // dropped either way.
    discard_queued();
    drop_prefetched();
}

void GroupSession::discard_queued() {
    while (pg_->queued() > 0) {
        try {
            pg_->receive();
        } catch (const PgError&) {
            // results of an abandoned turn: nothing to keep
        }
    }
}

std::optional<PublishedStreams> GroupSession::published_streams() {
    auto r = pg_->exec(sql(kStreamsSql), {config_.group_name(), std::to_string(std::max(config_.group_shard(), 0))});
    if (r.rows() == 0) return std::nullopt;
    PublishedStreams out;
    out.cursor = Position::parse(r.get(0, 1));
    const auto streams = nlohmann::json::parse(r.get(0, 0));
    for (const auto& [stream, value] : streams.items())
        if (const auto expected = Position::parse(value.get<std::string>())) out.streams.emplace(stream, *expected);
    return out;
}

void GroupSession::rewind(const Position& cursor, const Position& to) {
    pg_->exec(sql(kRewindSql), {config_.group, to.to_string()});
    metrics_.streams_rewound++;
    spdlog::error("group \"{}\" rewound from {} to {}", config_.group, cursor.to_string(), to.to_string());
}

// Runs partition maintenance when no background worker does (the
// extension's worker needs shared_preload_libraries). It takes the better
// part of a second on a large table, so while there is a backlog it waits
// for the feed to run dry ("idle"), for one more interval at most. A
// failure is logged and does not stop publishing.
void GroupSession::maybe_maintain(bool idle) {
    if (config_.maintain_interval.count() == 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_maintain_) return;
    if (!idle && now < next_maintain_ + config_.maintain_interval) return;
    next_maintain_ = now + config_.maintain_interval;
    // A run may take the better part of a second, or more on a large
    // table, without a fetch: the lease is renewed first, so that it lasts
    // a whole --lease from here (and a leader that lost it stands by).
    if (!lead()) throw LostLeadership{};
    try {
        const auto t0 = std::chrono::steady_clock::now();
        auto r = pg_->exec(sql(kMaintainSql), {std::to_string(config_.maintain_interval.count()) + " ms"});
        if (r.rows() > 0 && !r.is_null(0, 0) && !r.get(0, 0).empty())
            spdlog::info("partition maintenance: {}", r.get(0, 0));
        else
            spdlog::debug("partition maintenance: nothing to do ({:.1f} ms)", seconds_since(t0) * 1000);
    } catch (const PgError& e) {
        if (e.connection_lost()) throw;
        metrics_.count_error("maintenance");
        spdlog::warn("partition maintenance failed, publishing goes on: {}", e.what());
    }
}

}  // namespace pg_outbox
