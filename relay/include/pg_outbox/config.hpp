// The relay's configuration: flags, each with an environment variable.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pg_outbox {

// One Sentinel of a sentinel:// address.
struct SentinelAddress {
    std::string host;
    int port = 26379;

    bool operator==(const SentinelAddress&) const = default;
    // "host:port" or "[v6]:port".
    std::string to_string() const;
};

// Where Redis listens: a TCP host and port, or a unix socket path; a
// redis:// URL may also carry credentials and a database number. A
// sentinel:// URL names no server: the sentinels it lists are asked where
// the master of "master_name" is, at each connection. A redis+cluster://
// URL names the seed nodes of a Redis Cluster, where the relay reads which
// master serves each key. One of the three, never two.
struct RedisAddress {
    std::string host = "127.0.0.1";
    int port = 6379;
    std::string unix_path;  // when not empty, used instead of host and port
    std::string user;       // from a URL: AUTH user password (Redis 6 ACL)
    std::string password;   // from a URL
    std::optional<int> db;  // from a URL's path
    // sentinel://: the sentinels, asked in this order, and the name of the
    // master they monitor (not empty: this address is a Sentinel one).
    std::vector<SentinelAddress> sentinels;
    std::string master_name;
    // AUTH for the sentinels themselves (--sentinel-password); the URL's
    // user and password are the data nodes'.
    std::string sentinel_password;
    // redis+cluster://: the seed nodes of a Redis Cluster, this address
    // being the first (not empty: this address is a cluster one).
    std::vector<RedisAddress> cluster_seeds;

    // At most this many sentinels in a sentinel:// URL.
    static constexpr std::size_t kMaxSentinels = 16;

    // "host:port", "[v6addr]:port", "host", a bare IPv6 address ("::1":
    // more than one colon is an address with the default port),
    // "unix:/path", "/path", "redis://[user:password@]host[:port][/db]",
    // "sentinel://[user:password@]host[:port][,host[:port]...]/master-name"
    // (sentinel port 26379 by default) or
    // "redis+cluster://[user:password@]host[:port][,host[:port]...]" (see
    // parse_cluster_url()). Throws ConfigError; its message never holds the
    // password.
    static RedisAddress parse(const std::string& text);
    bool is_sentinel() const { return !master_name.empty(); }
    bool is_cluster() const { return !cluster_seeds.empty(); }
    // Where it is, without credentials: "host:port", "[v6]:port",
    // "unix:/path", "sentinel://host:port,.../master-name" or
    // "redis+cluster://host:port,...".
    std::string to_string() const;
};

// Where the metrics endpoint listens: "host:port", "[v6addr]:port", or
// ":port" (every interface, IPv4 and IPv6).
struct ListenAddress {
    std::string host;  // empty: every interface
    int port = 0;

    static ListenAddress parse(const std::string& text);
    std::string to_string() const;
};

// A port number 1-65535, digits only; throws ConfigError.
int parse_port(const std::string& text);

// How stream entry ids are chosen.
enum class IdMode {
    explicit_position,  // "<txid>-<seq>": Redis refuses a replay; no duplicates
    redis_generated,    // "*": Redis picks; a replay after a crash duplicates
};

enum class LogFormat { text, json };

// How an event becomes a stream entry's fields (--format): the relay's
// own fields ("default"), a CloudEvent in binary content mode (ce_*
// fields and data) or in structured content mode (one JSON "event"
// field). Consume mode reads all three, entry by entry.
enum class EntryFormat { plain, cloudevents, cloudevents_structured };

// "default", "cloudevents" or "cloudevents-structured".
const char* to_string(EntryFormat format) noexcept;

// What consume mode does after an entry of a key fails for its own reasons
// (--on-failure): "skip" retries it until --max-deliveries, dead-letters it
// and goes on with the key's later entries; "park-key" parks the key at
// the failure, so that none of its later entries applies before it (they
// are stored in the consumer's database and applied in order once it
// applies, or after inbox_redrive / inbox_skip). Both honour the keys
// parked already.
enum class OnFailure { skip, park_key };

// "skip" or "park-key".
const char* to_string(OnFailure mode) noexcept;

struct Config {
    enum class Mode { publish, consume };

    Mode mode = Mode::publish;

    // Connections.
    std::string pg_conninfo;
    RedisAddress redis;
    std::string redis_password;
    int redis_db = 0;

    // Publish mode.
    // The groups or shards to publish, as given (--group, repeatable; a
    // value may list several, comma-separated): "<group>", "<group>/<shard>"
    // or "<group>/*" (every shard, expanded from the database at start; see
    // publish_groups.hpp). Checked when parsed: none empty, none twice.
    std::vector<std::string> groups;
    // The one group or shard a publisher serves: the first of "groups"
    // after parsing; each publisher's copy of the Config names its own.
    std::string group;
    // The group's name and the shard that "group" names ("<group>/<shard>";
    // -1 when it names none), read from "group" (checked when parsed).
    std::string group_name() const;
    int group_shard() const;
    std::string stream_template = "outbox:{topic}";
    int batch_size = 1000;
    // Bytes of entry fields per write to Redis (at least one event).
    std::int64_t batch_bytes = 1 << 20;
    std::chrono::milliseconds poll_interval{500};
    bool listen = true;  // wake on NOTIFY; else poll only
    std::int64_t maxlen = 0;  // 0: no trimming
    IdMode id_mode = IdMode::explicit_position;
    EntryFormat entry_format = EntryFormat::plain;
    // --ce-source: the CloudEvents source attribute, "{database}" and
    // "{group}" replaced (percent-encoded) by the database's and the
    // group's names (checked when parsed: see ce_source_fault()).
    std::string ce_source = "/pg_outbox/{database}/{group}";
    std::chrono::milliseconds maintain_interval{60000};  // 0: never
    // /health fails when the leader has had events waiting this long
    // without publishing any; 0: never.
    std::chrono::milliseconds stuck_after{60000};
    // How long the leadership lasts without a fetch or advance: a standby
    // takes the group over from a leader that stopped making progress
    // (pg_outbox.lease for this relay's session).
    std::chrono::milliseconds lease{15000};

    // Consume mode.
    std::string consumer;              // the inbox identity
    std::vector<std::string> streams;  // stream keys to read
    std::string consumer_group;        // Redis consumer group; default: the consumer
    std::string worker;                // Redis consumer name; default: host:pid
    std::string handler;               // SQL run for each new event, with $1..$5
    int consume_batch_size = 100;
    std::chrono::milliseconds block{1000};
    std::string start_id = "0";
    std::chrono::milliseconds min_idle{30000};
    std::chrono::milliseconds claim_interval{5000};
    int max_deliveries = 5;
    // --on-failure: park-key by default with --pool (each stream read by
    // one worker, which the full order guarantee needs), skip otherwise.
    OnFailure on_failure = OnFailure::skip;
    // --shards N: each --stream holding "{shard}" stands for N streams,
    // {shard} replaced by 0 to N-1 (0: no expansion).
    int shards = 0;
    // --pool: the workers of the consumer group share the streams out,
    // each stream read by one live worker at a time (see stream_pool.hpp).
    bool pool = false;
    // How long a worker's hold on a stream (and its heartbeat) lasts
    // without renewal, and how often it is renewed.
    std::chrono::milliseconds pool_lease{10000};
    std::chrono::milliseconds pool_renew{0};  // 0 until parsed: a third of pool_lease

    // Faults, and the bounds of every wait on the servers (the defaults
    // are derived in one place: derive_bounds()).
    std::chrono::milliseconds retry_min{100};
    std::chrono::milliseconds retry_max{10000};
    std::chrono::milliseconds redis_timeout{10000};
    // Every wait on PostgreSQL: a connection, a write, a statement's result.
    std::chrono::milliseconds pg_timeout{10000};

    // Observability.
    std::optional<ListenAddress> metrics_address;  // none: no endpoint
    std::string log_level = "info";
    LogFormat log_format = LogFormat::text;
    std::chrono::milliseconds stats_interval{10000};
};

// The defaults of the bounds, derived from the lease; what a flag or its
// environment variable gave ("given") is kept. In publish mode:
// --pg-timeout and --redis-timeout two thirds of --lease, between 2 s and
// 10 s (10 s with the default lease of 15 s), so that a leader finds a
// dead link before its lease runs out; --retry-max a third of --lease, at
// most 10 s (5 s by default), so that a relay resumes within about the
// lease after a link heals (a connection attempt under way, at most
// --pg-timeout, then the longest backoff). In consume mode, 10 s each.
struct GivenBounds {
    bool pg_timeout = false;
    bool redis_timeout = false;
    bool retry_max = false;
};
void derive_bounds(Config& c, const GivenBounds& given);

// Most shards --shards expands to (the extension's OUTBOX_MAX_SHARDS).
inline constexpr int kMaxConsumeShards = 256;

// Parses "250ms", "2s", "1m" or a bare number of milliseconds.
std::chrono::milliseconds parse_duration(const std::string& text);

// The outcome of parsing the command line: a Config, or an exit code
// (help printed, or an error already reported naming the setting).
struct ParseResult {
    std::optional<Config> config;
    int exit_code = 0;
};

ParseResult parse_command_line(int argc, const char* const* argv);

// Splits a group name, "<group>" or "<group>/<shard>" (the extension's shard
// names: a number from 0, without leading zeros), into the name and the
// shard, -1 when none is named; ConfigError when the shard is no such number.
void split_group_name(const std::string& group, std::string& name, int& shard);

// True for "<group>/*", which names every shard of a group; "name" gets
// the group's name.
bool is_every_shard(const std::string& group, std::string* name = nullptr);

}  // namespace pg_outbox
