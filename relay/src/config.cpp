#include "pg_outbox/config.hpp"

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <charconv>
#include <iostream>

#include "pg_outbox/errors.hpp"

#ifndef PG_OUTBOX_VERSION
#define PG_OUTBOX_VERSION "unknown"
#endif

namespace pg_outbox {

RedisAddress RedisAddress::parse(const std::string& text) {
    RedisAddress a;
    if (text.rfind("unix:", 0) == 0 || (!text.empty() && text.front() == '/')) {
        a.unix_path = text.front() == '/' ? text : text.substr(5);
        if (a.unix_path.empty()) throw ConfigError("empty unix socket path");
        return a;
    }
    const auto colon = text.rfind(':');
    std::string host = colon == std::string::npos ? text : text.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (host.empty()) throw ConfigError("\"" + text + "\" has no host");
    a.host = host;
    if (colon != std::string::npos) {
        const std::string port = text.substr(colon + 1);
        int value = 0;
        auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
        if (ec != std::errc{} || ptr != port.data() + port.size() || value < 1 || value > 65535)
            throw ConfigError("\"" + port + "\" is not a port number (1-65535)");
        a.port = value;
    }
    return a;
}

std::string RedisAddress::to_string() const {
    return unix_path.empty() ? host + ":" + std::to_string(port) : "unix:" + unix_path;
}

std::chrono::milliseconds parse_duration(const std::string& text) {
    std::int64_t value = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || ptr == text.data() || value < 0)
        throw ConfigError("\"" + text + "\" is not a duration (for example 250ms, 2s, 1m)");
    const std::string unit(ptr, text.data() + text.size());
    if (unit.empty() || unit == "ms") return std::chrono::milliseconds(value);
    if (unit == "s") return std::chrono::seconds(value);
    if (unit == "m" || unit == "min") return std::chrono::minutes(value);
    throw ConfigError("\"" + text + "\" has an unknown unit (use ms, s or m)");
}

std::string expand_stream_key(const std::string& tmpl, const std::string& topic, const std::string& group) {
    std::string out;
    out.reserve(tmpl.size() + topic.size());
    for (std::size_t i = 0; i < tmpl.size();) {
        if (tmpl.compare(i, 7, "{topic}") == 0) {
            out += topic;
            i += 7;
        } else if (tmpl.compare(i, 7, "{group}") == 0) {
            out += group;
            i += 7;
        } else {
            out += tmpl[i++];
        }
    }
    return out;
}

ParseResult parse_command_line(int argc, const char* const* argv) {
    Config c;
    std::string redis = "127.0.0.1:6379";
    std::string poll = "500ms", retry_min = "100ms", retry_max = "10s", redis_timeout = "10s", stats = "10s";
    std::string id_mode = "position", log_format = "text", maintain = "60s";

    CLI::App app{"pg_outbox_relay: publishes pg_outbox feeds to Redis Streams", "pg_outbox_relay"};
    app.set_version_flag("--version", PG_OUTBOX_VERSION);
    app.require_subcommand(1);
    app.fallthrough();
    // A flag given twice (a wrapper's default, then the caller's) takes the last.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

    // Settings of every mode.
    app.add_option("--pg", c.pg_conninfo, "PostgreSQL connection string or URI (empty: libpq's PG* environment)")
        ->envname("PG_OUTBOX_PG");
    app.add_option("--redis", redis, "Redis address: host:port, unix:/path or /path")
        ->envname("PG_OUTBOX_REDIS")
        ->capture_default_str();
    app.add_option("--redis-password", c.redis_password, "Redis password (AUTH)")->envname("PG_OUTBOX_REDIS_PASSWORD");
    app.add_option("--redis-db", c.redis_db, "Redis database number")
        ->envname("PG_OUTBOX_REDIS_DB")
        ->check(CLI::Range(0, 1024))
        ->capture_default_str();
    app.add_option("--redis-timeout", redis_timeout, "Redis connect and command timeout")
        ->envname("PG_OUTBOX_REDIS_TIMEOUT")
        ->capture_default_str();
    app.add_option("--retry-min", retry_min, "first delay before retrying after a fault")
        ->envname("PG_OUTBOX_RETRY_MIN")
        ->capture_default_str();
    app.add_option("--retry-max", retry_max, "longest delay between retries (exponential backoff with jitter)")
        ->envname("PG_OUTBOX_RETRY_MAX")
        ->capture_default_str();
    app.add_option("--metrics-address", c.metrics_address,
                   "host:port for the Prometheus endpoint (/metrics) and health check (/health); empty: off")
        ->envname("PG_OUTBOX_METRICS_ADDRESS");
    app.add_option("--log-level", c.log_level, "trace, debug, info, warn or error")
        ->envname("PG_OUTBOX_LOG_LEVEL")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
        ->capture_default_str();
    app.add_option("--log-format", log_format, "text or json (one object a line)")
        ->envname("PG_OUTBOX_LOG_FORMAT")
        ->check(CLI::IsMember({"text", "json"}))
        ->capture_default_str();

    auto* publish = app.add_subcommand("publish", "publish a group's feed to Redis Streams");
    publish->add_option("--group", c.group, "the group whose feed to publish (see outbox_group_create)")
        ->envname("PG_OUTBOX_GROUP")
        ->required();
    publish->add_option("--stream", c.stream_template,
                        "stream key template; {topic} and {group} are replaced, other text (Redis Cluster hash "
                        "tags included) is kept, e.g. outbox:{{topic}} gives outbox:{orders}")
        ->envname("PG_OUTBOX_STREAM")
        ->capture_default_str();
    publish->add_option("--batch-size", c.batch_size, "events fetched and pipelined per batch")
        ->envname("PG_OUTBOX_BATCH_SIZE")
        ->check(CLI::Range(1, 100000))
        ->capture_default_str();
    publish->add_option("--poll-interval", poll, "longest wait for a notification before fetching again")
        ->envname("PG_OUTBOX_POLL_INTERVAL")
        ->capture_default_str();
    publish->add_flag("--listen,!--no-listen", c.listen,
                      "wake on the extension's NOTIFY (default); --no-listen: poll only")
        ->envname("PG_OUTBOX_LISTEN");
    publish->add_option("--maxlen", c.maxlen, "trim each stream to about this many entries (XADD MAXLEN ~); 0: never")
        ->envname("PG_OUTBOX_MAXLEN")
        ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 62))
        ->capture_default_str();
    publish->add_option("--id-mode", id_mode,
                        "stream entry ids: 'position' (the feed position: Redis refuses a replay, no duplicates) or "
                        "'redis' (Redis-generated: a replay after a crash duplicates entries, the inbox absorbs them)")
        ->envname("PG_OUTBOX_ID_MODE")
        ->check(CLI::IsMember({"position", "redis"}))
        ->capture_default_str();
    publish->add_option("--maintain-interval", maintain,
                        "run outbox_maintain() this often while leading, unless the extension's background worker "
                        "(or anything else) ran it within that time; 0: never")
        ->envname("PG_OUTBOX_MAINTAIN_INTERVAL")
        ->capture_default_str();
    publish->add_option("--stats-interval", stats, "how often to measure the backlog for the lag metric")
        ->envname("PG_OUTBOX_STATS_INTERVAL")
        ->capture_default_str();

    std::string block = "1s", min_idle = "30s", claim_interval = "5s";
    auto* consume = app.add_subcommand("consume", "apply stream entries through the inbox and a handler");
    consume->add_option("--consumer", c.consumer,
                        "the consumer: the inbox identity under which each event is applied once")
        ->envname("PG_OUTBOX_CONSUMER")
        ->required();
    consume->add_option("--stream", c.streams, "a stream to read; repeat for several")
        ->envname("PG_OUTBOX_STREAMS")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->delimiter(',')
        ->required();
    consume->add_option("--handler", c.handler,
                        "SQL run for each new event in the inbox's transaction, with $1 topic, $2 key, $3 payload "
                        "(jsonb), $4 headers (jsonb), $5 event_id (uuid); e.g. SELECT app.apply($1, $2, $3, $4, $5)")
        ->envname("PG_OUTBOX_HANDLER")
        ->required();
    consume->add_option("--group", c.consumer_group, "the Redis consumer group (default: the consumer)")
        ->envname("PG_OUTBOX_CONSUMER_GROUP");
    consume->add_option("--worker", c.worker, "this process's name in the consumer group (default: host:pid)")
        ->envname("PG_OUTBOX_WORKER");
    consume->add_option("--batch-size", c.consume_batch_size, "entries read and applied per transaction")
        ->envname("PG_OUTBOX_BATCH_SIZE")
        ->check(CLI::Range(1, 10000))
        ->capture_default_str();
    consume->add_option("--block", block, "longest wait for new entries (XREADGROUP BLOCK)")
        ->envname("PG_OUTBOX_BLOCK")
        ->capture_default_str();
    consume->add_option("--start", c.start_id,
                        "where a new consumer group starts: 0 (the beginning of each stream) or $ (new entries)")
        ->envname("PG_OUTBOX_START")
        ->capture_default_str();
    consume->add_option("--min-idle", min_idle,
                        "pending entries idle this long (their worker died or is stuck) are reclaimed")
        ->envname("PG_OUTBOX_MIN_IDLE")
        ->capture_default_str();
    consume->add_option("--claim-interval", claim_interval, "how often to reclaim idle pending entries")
        ->envname("PG_OUTBOX_CLAIM_INTERVAL")
        ->capture_default_str();
    consume->add_option("--max-deliveries", c.max_deliveries,
                        "deliveries after which a failing entry is dead-lettered and acknowledged")
        ->envname("PG_OUTBOX_MAX_DELIVERIES")
        ->check(CLI::Range(1, 1000000))
        ->capture_default_str();

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return {std::nullopt, app.exit(e)};
    }

    // Values CLI11 cannot check by itself; each error names its flag.
    auto duration = [](const char* flag, const std::string& text, std::chrono::milliseconds min) {
        try {
            auto d = parse_duration(text);
            if (d < min) throw ConfigError("must be at least " + std::to_string(min.count()) + "ms");
            return d;
        } catch (const ConfigError& e) {
            throw ConfigError(std::string(flag) + ": " + e.what());
        }
    };
    try {
        try {
            c.redis = RedisAddress::parse(redis);
        } catch (const ConfigError& e) {
            throw ConfigError(std::string("--redis: ") + e.what());
        }
        c.poll_interval = duration("--poll-interval", poll, std::chrono::milliseconds(1));
        c.retry_min = duration("--retry-min", retry_min, std::chrono::milliseconds(1));
        c.retry_max = duration("--retry-max", retry_max, c.retry_min);
        c.redis_timeout = duration("--redis-timeout", redis_timeout, std::chrono::milliseconds(100));
        c.stats_interval = duration("--stats-interval", stats, std::chrono::milliseconds(100));
        c.maintain_interval = duration("--maintain-interval", maintain, std::chrono::milliseconds(0));
        c.id_mode = id_mode == "redis" ? IdMode::redis_generated : IdMode::explicit_position;
        c.log_format = log_format == "json" ? LogFormat::json : LogFormat::text;
        if (publish->parsed()) c.mode = Config::Mode::publish;
        if (consume->parsed()) {
            c.mode = Config::Mode::consume;
            c.block = duration("--block", block, std::chrono::milliseconds(1));
            c.min_idle = duration("--min-idle", min_idle, std::chrono::milliseconds(1));
            c.claim_interval = duration("--claim-interval", claim_interval, std::chrono::milliseconds(1));
            if (c.consumer.empty()) throw ConfigError("--consumer: must not be empty");
            if (c.handler.empty()) throw ConfigError("--handler: must not be empty");
            for (const auto& s : c.streams)
                if (s.empty()) throw ConfigError("--stream: a stream name must not be empty");
            if (c.start_id != "0" && c.start_id != "$") throw ConfigError("--start: use 0 or $");
            if (c.block >= c.redis_timeout)
                throw ConfigError("--block: must be shorter than --redis-timeout, or every wait would time out");
            if (c.consumer_group.empty()) c.consumer_group = c.consumer;
            if (c.worker.empty()) {
                char host[256] = {};
                ::gethostname(host, sizeof host - 1);
                c.worker = std::string(host) + ":" + std::to_string(::getpid());
            }
        }
        if (c.stream_template.empty()) throw ConfigError("--stream: the template must not be empty");
    } catch (const ConfigError& e) {
        std::cerr << "pg_outbox_relay: " << e.what() << '\n';
        return {std::nullopt, 2};
    }
    return {c, 0};
}

}  // namespace pg_outbox
