#include "pg_outbox/config.hpp"

#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/event.hpp"
#include "pg_outbox/log.hpp"
#include "pg_outbox/pg.hpp"
#include "pg_outbox/redis_cluster.hpp"

#ifndef PG_OUTBOX_VERSION
#define PG_OUTBOX_VERSION "unknown"
#endif

namespace pg_outbox {

namespace {

bool is_ipv6(const std::string& text) {
    // A zone ("fe80::1%eth0") is the system's business.
    const std::string address = text.substr(0, text.find('%'));
    in6_addr buf{};
    return inet_pton(AF_INET6, address.c_str(), &buf) == 1;
}

// A host name or IPv4 address: letters, digits, "-", "_" and ".".
bool is_host_name(const std::string& text) {
    if (text.empty() || text.front() == '-' || text.front() == '.') return false;
    for (unsigned char c : text)
        if (!std::isalnum(c) && c != '-' && c != '.' && c != '_') return false;
    return true;
}

// "host", "host:port", "[v6]", "[v6]:port" or a bare IPv6 address: the
// host, and the port when given. Error messages quote "shown", which is
// the text without credentials.
std::pair<std::string, std::optional<int>> parse_host_port(const std::string& text, const std::string& shown) {
    if (text.empty()) throw ConfigError("\"" + shown + "\" has no host");
    if (text.front() == '[') {
        const auto close = text.find(']');
        if (close == std::string::npos) throw ConfigError("\"" + shown + "\" lacks the \"]\" after its IPv6 address");
        const std::string host = text.substr(1, close - 1);
        if (!is_ipv6(host)) throw ConfigError("\"" + host + "\" in \"" + shown + "\" is not an IPv6 address");
        if (close + 1 == text.size()) return {host, std::nullopt};
        if (text[close + 1] != ':') throw ConfigError("\"" + shown + "\" has text after \"]\" that is not \":port\"");
        return {host, parse_port(text.substr(close + 2))};
    }
    const auto colons = std::count(text.begin(), text.end(), ':');
    if (colons > 1) {
        // More than one colon: a bare IPv6 address, with the default port
        // ("[addr]:port" gives another).
        if (!is_ipv6(text))
            throw ConfigError("\"" + shown + "\" is not an IPv6 address; write an IPv6 address with a port as [addr]:port");
        return {text, std::nullopt};
    }
    const auto colon = text.find(':');
    const std::string host = text.substr(0, colon);
    if (host.empty()) throw ConfigError("\"" + shown + "\" has no host");
    if (!is_host_name(host)) throw ConfigError("\"" + host + "\" in \"" + shown + "\" is not a host name or address");
    if (colon == std::string::npos) return {host, std::nullopt};
    return {host, parse_port(text.substr(colon + 1))};
}

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Percent-decoding of a URL's user or password; nullopt when malformed.
std::optional<std::string> percent_decode(const std::string& text) {
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '%') {
            out += text[i];
            continue;
        }
        const int hi = i + 1 < text.size() ? hex_digit(text[i + 1]) : -1;
        const int lo = i + 2 < text.size() ? hex_digit(text[i + 2]) : -1;
        if (hi < 0 || lo < 0) return std::nullopt;
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
    }
    return out;
}

// A redis:// URL for messages: the password (or the whole user
// information when it has no colon) replaced by "********".
std::string mask_redis_url(const std::string& text) {
    const auto scheme = text.find("://");
    if (scheme == std::string::npos) return text;
    const auto authority = scheme + 3;
    const auto at = text.rfind('@');
    if (at == std::string::npos || at < authority) return text;
    const auto colon = text.find(':', authority);
    const std::string user = colon < at ? text.substr(authority, colon - authority) + ":" : "";
    return text.substr(0, authority) + user + "********" + text.substr(at);
}

// The user information of a URL ("user:password", percent-encoded) into
// the address; "shown" is the URL without its password.
void parse_userinfo(const std::string& userinfo, const std::string& shown, const char* scheme, RedisAddress& a) {
    const auto colon = userinfo.find(':');
    if (colon == std::string::npos)
        throw ConfigError("\"" + shown + "\" has user information without a password; write " + scheme +
                          "://user:password@host or " + scheme + "://:password@host");
    const auto user = percent_decode(userinfo.substr(0, colon));
    const auto password = percent_decode(userinfo.substr(colon + 1));
    if (!user || !password) throw ConfigError("\"" + shown + "\" has a malformed %-escape in its user information");
    if (password->empty()) throw ConfigError("\"" + shown + "\" has an empty password");
    a.user = *user;
    a.password = *password;
}

// A name Sentinel monitors, as the relay accepts it: visible ASCII without
// the URL's separators.
bool is_master_name(const std::string& name) {
    if (name.empty() || name.size() > 128) return false;
    for (unsigned char c : name)
        if (c <= 0x20 || c >= 0x7f || c == '/' || c == '?' || c == '#' || c == '@' || c == ',' || c == '%')
            return false;
    return true;
}

// A URL that lists several servers (sentinel://, redis+cluster://): at most
// 4096 characters, no whitespace or control character. The message does
// not quote the text, which would carry the character into it.
void check_url_text(const std::string& text, const char* scheme) {
    if (text.size() > 4096)
        throw ConfigError(std::string("the ") + scheme + " URL is too long (at most 4096 characters)");
    for (std::size_t i = 0; i < text.size(); ++i)
        if (const auto c = static_cast<unsigned char>(text[i]); c <= 0x20 || c == 0x7f) {
            static constexpr char kHex[] = "0123456789abcdef";
            throw ConfigError(std::string("the ") + scheme + " URL holds whitespace or a control character (\\x" +
                              kHex[c >> 4] + kHex[c & 15] + " at offset " + std::to_string(i) +
                              "; percent-encode it in a password)");
        }
}

// "sentinel://[user:password@]host[:port][,host[:port]...]/master-name".
RedisAddress parse_sentinel_url(const std::string& text) {
    const std::string shown = mask_redis_url(text);
    const std::string usage = "; write sentinel://[user:password@]host:port[,host:port...]/master-name";
    check_url_text(text, "sentinel://");
    RedisAddress a;
    std::string rest = text.substr(std::string_view("sentinel://").size());
    if (const auto at = rest.rfind('@'); at != std::string::npos) {
        parse_userinfo(rest.substr(0, at), shown, "sentinel", a);
        rest = rest.substr(at + 1);
    }
    if (rest.find_first_of("?#") != std::string::npos)
        throw ConfigError("\"" + shown + "\": query parameters are not supported");
    const auto slash = rest.find('/');
    if (slash == std::string::npos || slash + 1 == rest.size())
        throw ConfigError("\"" + shown + "\" names no master" + usage);
    a.master_name = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (a.master_name.find('/') != std::string::npos)
        throw ConfigError("\"" + shown + "\": the path is the master's name alone (no database: use --redis-db)");
    if (!is_master_name(a.master_name))
        throw ConfigError("\"" + shown + "\": \"" + a.master_name +
                          "\" is not a master name (1-128 visible characters, none of / ? # @ , %)");
    if (rest.empty()) throw ConfigError("\"" + shown + "\" lists no sentinel" + usage);
    for (std::size_t start = 0;;) {
        const auto comma = rest.find(',', start);
        const std::string item = rest.substr(start, comma == std::string::npos ? comma : comma - start);
        if (item.empty())
            throw ConfigError("\"" + shown + "\" has an empty sentinel address (two commas, or one at an end)");
        if (a.sentinels.size() == RedisAddress::kMaxSentinels)
            throw ConfigError("\"" + shown + "\" lists more than " + std::to_string(RedisAddress::kMaxSentinels) +
                              " sentinels");
        auto [host, port] = parse_host_port(item, shown);
        SentinelAddress s{host, port.value_or(26379)};
        if (std::find(a.sentinels.begin(), a.sentinels.end(), s) != a.sentinels.end())
            throw ConfigError("\"" + shown + "\" lists the sentinel " + s.to_string() + " twice");
        a.sentinels.push_back(std::move(s));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    a.host.clear();
    a.port = 0;
    return a;
}

}  // namespace

int parse_port(const std::string& text) {
    int value = 0;
    const bool digits = !text.empty() && text.size() <= 5 &&
                        std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
    if (digits) std::from_chars(text.data(), text.data() + text.size(), value);
    if (!digits || value < 1 || value > 65535) throw ConfigError("\"" + text + "\" is not a port number (1-65535)");
    return value;
}

RedisAddress RedisAddress::parse(const std::string& text) {
    RedisAddress a;
    if (text.rfind("unix:", 0) == 0 || (!text.empty() && text.front() == '/')) {
        a.unix_path = text.front() == '/' ? text : text.substr(text.rfind("unix://", 0) == 0 ? 6 : 5);
        if (a.unix_path.empty()) throw ConfigError("empty unix socket path");
        return a;
    }
    const auto scheme = text.find("://");
    if (scheme != std::string::npos) {
        const std::string shown = mask_redis_url(text);
        if (text.compare(0, scheme, "sentinel") == 0) return parse_sentinel_url(text);
        if (text.compare(0, scheme, "redis+cluster") == 0) {
            check_url_text(text, "redis+cluster://");
            auto seeds = parse_cluster_url(text);
            a = seeds.front();
            a.cluster_seeds = std::move(seeds);
            return a;
        }
        if (text.compare(0, scheme, "redis") != 0)
            throw ConfigError("\"" + shown + "\": only redis:// and sentinel:// URLs are supported, and "
                              "redis+cluster:// for a Redis Cluster" +
                              (text.compare(0, scheme, "rediss") == 0 ? " (no TLS)" : ""));
        std::string rest = text.substr(scheme + 3);
        if (const auto at = rest.rfind('@'); at != std::string::npos) {
            parse_userinfo(rest.substr(0, at), shown, "redis", a);
            rest = rest.substr(at + 1);
        }
        if (rest.find_first_of("?#") != std::string::npos)
            throw ConfigError("\"" + shown + "\": query parameters are not supported");
        const auto slash = rest.find('/');
        if (slash != std::string::npos) {
            const std::string db = rest.substr(slash + 1);
            rest = rest.substr(0, slash);
            if (!db.empty()) {
                int value = -1;
                const bool digits = db.size() <= 5 && std::all_of(db.begin(), db.end(), [](unsigned char c) {
                    return std::isdigit(c);
                });
                if (digits) std::from_chars(db.data(), db.data() + db.size(), value);
                if (!digits || value < 0) throw ConfigError("\"" + shown + "\": \"" + db + "\" is not a database number");
                a.db = value;
            }
        }
        auto [host, port] = parse_host_port(rest, shown);
        a.host = host;
        if (port) a.port = *port;
        return a;
    }
    auto [host, port] = parse_host_port(text, text);
    a.host = host;
    if (port) a.port = *port;
    return a;
}

std::string SentinelAddress::to_string() const {
    return (host.find(':') == std::string::npos ? host : "[" + host + "]") + ":" + std::to_string(port);
}

std::string RedisAddress::to_string() const {
    if (!cluster_seeds.empty()) {
        std::string out = "redis+cluster://";
        for (const auto& seed : cluster_seeds) out += (&seed == &cluster_seeds.front() ? "" : ",") + seed.to_string();
        return out;
    }
    if (!unix_path.empty()) return "unix:" + unix_path;
    if (is_sentinel()) {
        std::string out = "sentinel://";
        for (std::size_t i = 0; i < sentinels.size(); ++i) out += (i ? "," : "") + sentinels[i].to_string();
        return out + "/" + master_name;
    }
    return (host.find(':') == std::string::npos ? host : "[" + host + "]") + ":" + std::to_string(port);
}

ListenAddress ListenAddress::parse(const std::string& text) {
    if (text.empty()) throw ConfigError("empty address");
    ListenAddress a;
    if (text.front() != '[' && std::count(text.begin(), text.end(), ':') > 1)
        throw ConfigError("\"" + text + "\": write an IPv6 address as [addr]:port");
    if (text.front() == ':') {
        a.port = parse_port(text.substr(1));
        return a;
    }
    auto [host, port] = parse_host_port(text, text);
    if (!port) throw ConfigError("\"" + text + "\" has no port; expected host:port, [addr]:port or :port");
    a.host = host;
    a.port = *port;
    return a;
}

std::string ListenAddress::to_string() const {
    if (host.empty()) return ":" + std::to_string(port);
    return (host.find(':') == std::string::npos ? host : "[" + host + "]") + ":" + std::to_string(port);
}

std::chrono::milliseconds parse_duration(const std::string& text) {
    std::int64_t value = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || ptr == text.data() || value < 0)
        throw ConfigError("\"" + text + "\" is not a duration (for example 250ms, 2s, 1m)");
    const std::string unit(ptr, text.data() + text.size());
    // A week is far beyond any sensible setting, and far from overflowing.
    constexpr std::int64_t kWeekMs = std::int64_t{7} * 24 * 3600 * 1000;
    std::int64_t scale = 0;
    if (unit.empty() || unit == "ms") scale = 1;
    else if (unit == "s") scale = 1000;
    else if (unit == "m" || unit == "min") scale = 60000;
    if (scale != 0) {
        if (value > kWeekMs / scale) throw ConfigError("\"" + text + "\" is too long (at most a week)");
        return std::chrono::milliseconds(value * scale);
    }
    throw ConfigError("\"" + text + "\" has an unknown unit (use ms, s or m)");
}

std::string Config::group_name() const {
    std::string name;
    int shard;
    split_group_name(group, name, shard);
    return name;
}

int Config::group_shard() const {
    std::string name;
    int shard;
    split_group_name(group, name, shard);
    return shard;
}

void split_group_name(const std::string& group, std::string& name, int& shard) {
    const auto slash = group.find('/');
    name = group.substr(0, slash);
    shard = -1;
    if (slash == std::string::npos) return;
    const std::string digits = group.substr(slash + 1);
    const bool valid = !digits.empty() && digits.size() <= 3 && (digits.size() == 1 || digits[0] != '0') &&
                       std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (!valid || name.empty())
        throw ConfigError("--group \"" + group + "\": a shard is named by its group's name, \"/\" and its number, "
                          "from 0, as in orders/0 (orders/* names every shard)");
    shard = std::stoi(digits);
}

bool is_every_shard(const std::string& group, std::string* name) {
    if (group.size() < 2 || group.compare(group.size() - 2, 2, "/*") != 0) return false;
    if (name) *name = group.substr(0, group.size() - 2);
    return true;
}

const char* to_string(EntryFormat format) noexcept {
    switch (format) {
        case EntryFormat::cloudevents: return "cloudevents";
        case EntryFormat::cloudevents_structured: return "cloudevents-structured";
        case EntryFormat::plain: break;
    }
    return "default";
}

const char* to_string(OnFailure mode) noexcept {
    return mode == OnFailure::park_key ? "park-key" : "skip";
}

namespace {

// --shards: each --stream holding "{shard}" becomes one stream per shard.
// With --shards every stream must hold it (a stream without it would be
// read as one, whatever the count says), and no stream may come twice.
void expand_shards(Config& c) {
    constexpr std::string_view kShard = "{shard}";
    const bool templated = std::any_of(c.streams.begin(), c.streams.end(),
                                       [&](const std::string& s) { return s.find(kShard) != std::string::npos; });
    if (c.shards == 0) {
        if (c.pool) throw ConfigError("--pool: needs --shards N and a --stream template with {shard}");
        return;
    }
    if (!templated)
        throw ConfigError("--shards: no --stream holds {shard}; write the shard streams' template, e.g. "
                          "--stream 'outbox:orders:{shard}'");
    std::vector<std::string> expanded;
    for (const auto& s : c.streams) {
        if (s.find(kShard) == std::string::npos)
            throw ConfigError("--stream \"" + s + "\": with --shards each stream is a template holding {shard}");
        for (int shard = 0; shard < c.shards; ++shard) {
            const std::string number = std::to_string(shard);
            std::string stream = s;
            for (auto at = stream.find(kShard); at != std::string::npos; at = stream.find(kShard, at + number.size()))
                stream.replace(at, kShard.size(), number);
            expanded.push_back(std::move(stream));
        }
    }
    std::vector<std::string> sorted = expanded;
    std::sort(sorted.begin(), sorted.end());
    if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end())
        throw ConfigError("--stream: \"" + *dup + "\" is named twice");
    c.streams = std::move(expanded);
}

// --pool-lease and --pool-renew: the lease outlives two renewals, and a
// turn (one --block wait at most) ends before a renewal is due.
void check_pool(Config& c, const std::string& lease, const std::string& renew) {
    auto parse = [](const char* flag, const std::string& text) {
        try {
            return parse_duration(text);
        } catch (const ConfigError& e) {
            throw ConfigError(std::string(flag) + ": " + e.what());
        }
    };
    c.pool_lease = parse("--pool-lease", lease);
    if (c.pool_lease < std::chrono::seconds(1) || c.pool_lease > std::chrono::minutes(10))
        throw ConfigError("--pool-lease: must be between 1s and 10m");
    if (renew.empty()) {
        c.pool_renew = c.pool_lease / 3;
    } else {
        c.pool_renew = parse("--pool-renew", renew);
        if (c.pool_renew < std::chrono::milliseconds(100)) throw ConfigError("--pool-renew: must be at least 100ms");
        if (c.pool_renew * 2 > c.pool_lease)
            throw ConfigError("--pool-renew: must be at most half of --pool-lease, so that a late renewal still "
                              "comes in time");
    }
    if (c.pool && c.block > c.pool_renew)
        throw ConfigError("--block: must be at most --pool-renew with --pool, so that a wait for entries never "
                          "delays a renewal");
}

// The values of --group, each split at its commas: every item a group,
// a shard or "<group>/*", none empty, none twice.
std::vector<std::string> check_group_list(const std::vector<std::string>& values) {
    std::vector<std::string> groups;
    for (const auto& value : values)
        for (std::size_t start = 0;;) {
            const auto comma = value.find(',', start);
            groups.push_back(value.substr(start, comma == std::string::npos ? comma : comma - start));
            if (comma == std::string::npos) break;
            start = comma + 1;
        }
    if (groups.empty()) throw ConfigError("--group is required");
    for (std::size_t i = 0; i < groups.size(); ++i) {
        const auto& group = groups[i];
        if (group.empty())
            throw ConfigError(groups.size() == 1 ? "--group: the group name must not be empty"
                                                 : "--group: an empty group name in the list (two commas, or one "
                                                   "at an end)");
        std::string name;
        int shard;
        if (is_every_shard(group, &name)) {
            if (name.empty() || name.find('/') != std::string::npos)
                throw ConfigError("--group \"" + group + "\": every shard of a group is named by its group's name "
                                  "and \"/*\", as in orders/*");
        } else {
            split_group_name(group, name, shard);
        }
        for (std::size_t j = 0; j < i; ++j)
            if (groups[j] == group)
                throw ConfigError("--group \"" + group + "\" is given twice; name each group or shard once");
    }
    return groups;
}

// The help's option lines: CLI11 starts a description one space after an
// option whose name and type fill the column but one, where it reads as
// part of the name, and help2man, which makes the man page from the help,
// takes the line for an option without description. At least two spaces
// then, else the next line, as for a longer name.
class HelpFormatter : public CLI::Formatter {
public:
    std::string make_option(const CLI::Option* opt, bool is_positional) const override {
        const std::string name = "  " + make_option_name(opt, is_positional) + make_option_opts(opt);
        const std::string description = make_option_desc(opt);
        const std::size_t width = get_column_width();
        std::string line = name;
        if (!description.empty()) {
            if (name.size() + 2 > width)
                line += "\n" + std::string(width, ' ');
            else
                line.append(width - name.size(), ' ');
            for (const char c : description) {
                line += c;
                if (c == '\n') line.append(width, ' ');
            }
        }
        return line + "\n";
    }
};

}  // namespace

void derive_bounds(Config& c, const GivenBounds& given) {
    using std::chrono::milliseconds;
    const bool publish = c.mode == Config::Mode::publish;
    const milliseconds wait = publish ? std::clamp<milliseconds>(c.lease * 2 / 3, std::chrono::seconds(2),
                                                                  std::chrono::seconds(10))
                                      : milliseconds(std::chrono::seconds(10));
    if (!given.pg_timeout) c.pg_timeout = wait;
    if (!given.redis_timeout) c.redis_timeout = wait;
    if (!given.retry_max)
        c.retry_max = std::max(c.retry_min, publish ? std::min<milliseconds>(c.lease / 3, std::chrono::seconds(10))
                                                    : milliseconds(std::chrono::seconds(10)));
}

ParseResult parse_command_line(int argc, const char* const* argv) {
    Config c;
    std::string redis = "127.0.0.1:6379";
    std::string poll = "500ms", retry_min = "100ms", retry_max, redis_timeout, pg_timeout, stats = "10s";
    std::string entry_format = "default";
    std::string id_mode = "position", log_format = "text", maintain = "60s", stuck_after = "60s", lease = "15s";
    std::string metrics_address;

    CLI::App app{"pg_outbox_relay: publishes pg_outbox feeds to Redis Streams", "pg_outbox_relay"};
    app.set_version_flag("--version", PG_OUTBOX_VERSION);
    app.formatter(std::make_shared<HelpFormatter>());
    app.require_subcommand(1);
    app.fallthrough();
    // A flag given twice (a wrapper's default, then the caller's) takes the last.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

    // Settings of every mode.
    app.add_option("--pg", c.pg_conninfo, "PostgreSQL connection string or URI (empty: libpq's PG* environment)")
        ->envname("PG_OUTBOX_PG");
    app.add_option("--redis", redis,
                   "Redis address: host:port, [v6addr]:port, host, a bare IPv6 address (default port), "
                   "unix:/path, /path, redis://[user:password@]host[:port][/db], "
                   "sentinel://[user:password@]host[:port][,host[:port]...]/master-name to find the master "
                   "through Redis Sentinel (port 26379 by default; the credentials are the data nodes') and "
                   "follow its failovers, or a Redis Cluster's seed nodes: "
                   "redis+cluster://[user:password@]host[:port][,host[:port]...]")
        ->envname("PG_OUTBOX_REDIS")
        ->capture_default_str();
    auto* password_option = app.add_option("--redis-password", c.redis_password, "Redis password (AUTH)")
                                ->envname("PG_OUTBOX_REDIS_PASSWORD");
    std::string sentinel_password;
    auto* sentinel_password_option =
        app.add_option("--sentinel-password", sentinel_password,
                       "password of the sentinels themselves (their requirepass), with a sentinel:// --redis; "
                       "default: none")
            ->envname("PG_OUTBOX_SENTINEL_PASSWORD");
    auto* db_option =
        app.add_option("--redis-db", c.redis_db, "Redis database number (0 only with a redis+cluster:// address)")
            ->envname("PG_OUTBOX_REDIS_DB")
            ->check(CLI::Range(0, 1024))
            ->capture_default_str();
    app.add_option("--redis-timeout", redis_timeout,
                   "longest wait on Redis (a connection, a write, a reply; a reply to XREAD BLOCK: this beyond "
                   "the BLOCK); at least 100ms; default: two thirds of --lease between 2s and 10s in publish "
                   "mode, 10s in consume mode")
        ->envname("PG_OUTBOX_REDIS_TIMEOUT");
    app.add_option("--pg-timeout", pg_timeout,
                   "longest wait on PostgreSQL (a connection, a write, a statement's result); a wait past it "
                   "closes the connection and the relay reconnects; at least 1s, at most 1h; default: two thirds "
                   "of --lease between 2s and 10s in publish mode, 10s in consume mode")
        ->envname("PG_OUTBOX_PG_TIMEOUT");
    app.add_option("--retry-min", retry_min, "first delay before retrying after a fault")
        ->envname("PG_OUTBOX_RETRY_MIN")
        ->capture_default_str();
    app.add_option("--retry-max", retry_max,
                   "longest delay between retries (exponential backoff with jitter); default: a third of --lease, "
                   "at most 10s, in publish mode, 10s in consume mode")
        ->envname("PG_OUTBOX_RETRY_MAX");
    app.add_option("--metrics-address", metrics_address,
                   "where to serve the Prometheus endpoint (/metrics) and health check (/health): host:port, "
                   "[v6addr]:port, or :port for every interface (IPv4 and IPv6); empty: off")
        ->envname("PG_OUTBOX_METRICS_ADDRESS");
    app.add_option("--log-level", c.log_level, "trace, debug, info, warn or error")
        ->envname("PG_OUTBOX_LOG_LEVEL")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
        ->capture_default_str();
    app.add_option("--log-format", log_format, "text or json (one object a line)")
        ->envname("PG_OUTBOX_LOG_FORMAT")
        ->check(CLI::IsMember({"text", "json"}))
        ->capture_default_str();

    auto* publish =
        app.add_subcommand("publish", "publish a group's feed to Redis Streams (or several groups', a thread each)");
    // Each occurrence is one value, split at commas here (group names hold
    // none), so that an empty item is refused rather than dropped.
    publish
        ->add_option("--group", c.groups,
                     "the group whose feed to publish (see outbox_group_create), or a shard of a sharded group, "
                     "<group>/<shard>; <group>/* (quoted in a shell) is every shard. Repeat it, or separate with "
                     "commas, to publish several from one process: a thread each, with its own connections and "
                     "leadership")
        ->envname("PG_OUTBOX_GROUP")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->required();
    publish->add_option("--stream", c.stream_template,
                        "stream key template; {topic}, {group} and {shard} are replaced, other text (Redis Cluster "
                        "hash tags included) is kept, e.g. outbox:{{topic}} gives outbox:{orders}; a sharded "
                        "group's template needs {shard}")
        ->envname("PG_OUTBOX_STREAM")
        ->capture_default_str();
    publish->add_option("--batch-size", c.batch_size,
                        "events fetched per batch; while batches come back full (a backlog), each next one "
                        "asks for twice as many, up to 4 times this")
        ->envname("PG_OUTBOX_BATCH_SIZE")
        ->check(CLI::Range(1, 100000))
        ->capture_default_str();
    publish->add_option("--batch-bytes", c.batch_bytes,
                        "bytes of entry fields per write to Redis: a batch is written in parts that take events "
                        "until the next would exceed this, at least one event each")
        ->envname("PG_OUTBOX_BATCH_BYTES")
        ->check(CLI::Range(std::int64_t{1024}, std::int64_t{512} << 20))
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
    publish->add_option("--format", entry_format,
                        "stream entry fields: 'default' (event_id, topic, key, payload, headers, ...), "
                        "'cloudevents' (a CloudEvent in binary content mode: ce_* fields and data) or "
                        "'cloudevents-structured' (one JSON field \"event\", content-type "
                        "application/cloudevents+json); consume reads all three")
        ->envname("PG_OUTBOX_FORMAT")
        ->capture_default_str();
    publish->add_option("--ce-source", c.ce_source,
                        "the CloudEvents source attribute of --format cloudevents*: a URI-reference of printable "
                        "ASCII without spaces, at most 1024 bytes; {database} and {group} are replaced by the "
                        "names, percent-encoded")
        ->envname("PG_OUTBOX_CE_SOURCE")
        ->capture_default_str();
    publish->add_option("--maintain-interval", maintain,
                        "run outbox_maintain() this often while leading, unless the extension's background worker "
                        "(or anything else) ran it within that time; 0: never")
        ->envname("PG_OUTBOX_MAINTAIN_INTERVAL")
        ->capture_default_str();
    publish->add_option("--stats-interval", stats, "how often to measure the backlog for the lag metric")
        ->envname("PG_OUTBOX_STATS_INTERVAL")
        ->capture_default_str();
    publish->add_option("--stuck-after", stuck_after,
                        "/health answers 503 when the leader has had events waiting this long without publishing "
                        "any (a batch Redis keeps refusing); 0: never")
        ->envname("PG_OUTBOX_STUCK_AFTER")
        ->capture_default_str();
    publish->add_option("--lease", lease,
                        "how long the leadership lasts without progress: a standby takes the group over from a "
                        "leader that has not fetched or advanced for this long (at least 1s and 3x --poll-interval)")
        ->envname("PG_OUTBOX_LEASE")
        ->capture_default_str();

    std::string block = "1s", min_idle = "30s", claim_interval = "5s", pool_lease = "10s", pool_renew;
    auto* consume = app.add_subcommand("consume", "apply stream entries through the inbox and a handler");
    consume->add_option("--consumer", c.consumer,
                        "the consumer: the inbox identity under which each event is applied once")
        ->envname("PG_OUTBOX_CONSUMER")
        ->required();
    // Each value is one stream, commas included; only the environment
    // variable, which cannot be repeated, lists streams with commas.
    auto* streams_option =
        consume->add_option("--stream", c.streams,
                            "a stream to read, taken whole (commas included); repeat for several. "
                            "PG_OUTBOX_STREAMS lists streams separated by commas")
            ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
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
    consume->add_option("--block", block,
                        "longest wait for new entries (XREAD BLOCK after the consumer group's position)")
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
    std::string on_failure;
    consume->add_option("--on-failure", on_failure,
                        "what an entry failing for its own reasons does to the later entries of its key: park-key "
                        "parks the key (its later entries are stored, not applied, until the failed one applies or "
                        "is redriven with inbox_redrive or given up with inbox_skip); skip dead-letters it after "
                        "--max-deliveries and goes on with the key (default: park-key with --pool, else skip)")
        ->envname("PG_OUTBOX_ON_FAILURE");
    std::string shards;
    consume->add_option("--shards", shards,
                        "a sharded group's shard count: each --stream holding {shard} (e.g. 'outbox:orders:{shard}') "
                        "stands for that many streams, {shard} replaced by 0 to N-1 (1-256)")
        ->envname("PG_OUTBOX_SHARDS");
    consume->add_flag("--pool", c.pool,
                      "share the streams out among the group's workers: each stream is read by one live worker at "
                      "a time (a lease in Redis), so each key's events apply in order while the streams apply in "
                      "parallel; a worker takes at most its share, streams of a dead worker are taken over after "
                      "--pool-lease. Needs --shards and {shard} in --stream")
        ->envname("PG_OUTBOX_POOL");
    consume->add_option("--pool-lease", pool_lease,
                        "with --pool: how long a worker's hold on a stream, and its heartbeat, lasts without "
                        "renewal; a dead or paused worker's streams are taken over after this (1s to 10m)")
        ->envname("PG_OUTBOX_POOL_LEASE")
        ->capture_default_str();
    consume->add_option("--pool-renew", pool_renew,
                        "with --pool: how often the worker renews its holds and heartbeat (default: a third of "
                        "--pool-lease; at least 100ms, at most half of --pool-lease, at least --block)")
        ->envname("PG_OUTBOX_POOL_RENEW");

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // --help and --version exit 0; every error in a flag, an
        // environment variable or the mode exits 2 like the checks below.
        if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return {std::nullopt, app.exit(e)};
        std::string message = e.what();
        if (message == "A subcommand is required")
            message = "a mode is required: publish or consume";
        std::cerr << "pg_outbox_relay: " << escape_control(message) << "\nRun with --help for more information.\n";
        return {std::nullopt, 2};
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
        if (sentinel_password_option->count() && !sentinel_password.empty()) {
            if (!c.redis.is_sentinel())
                throw ConfigError("--sentinel-password: only with a sentinel:// --redis address");
            c.redis.sentinel_password = sentinel_password;
        }
        // A URL's credentials and database, unless the flags give them too.
        if (!c.redis.password.empty()) {
            if (password_option->count() && !c.redis_password.empty())
                throw ConfigError("--redis-password: the --redis URL holds a password too; give it once");
            c.redis_password = c.redis.password;
        }
        if (c.redis.db) {
            if (db_option->count() && c.redis_db != *c.redis.db)
                throw ConfigError("--redis-db: " + std::to_string(c.redis_db) + " differs from the database " +
                                  std::to_string(*c.redis.db) + " of the --redis URL");
            c.redis_db = *c.redis.db;
        }
        if (c.redis.is_cluster() && c.redis_db != 0)
            throw ConfigError("--redis-db: a Redis Cluster has database 0 only; leave --redis-db out with a "
                              "redis+cluster:// address");
        check_conninfo(c.pg_conninfo);
        if (!metrics_address.empty()) {
            try {
                c.metrics_address = ListenAddress::parse(metrics_address);
            } catch (const ConfigError& e) {
                throw ConfigError(std::string("--metrics-address: ") + e.what());
            }
        }
        c.poll_interval = duration("--poll-interval", poll, std::chrono::milliseconds(1));
        c.retry_min = duration("--retry-min", retry_min, std::chrono::milliseconds(1));
        GivenBounds given;
        // Given, or derived (an empty value too: an env file's
        // PG_OUTBOX_PG_TIMEOUT= is the default).
        if (!retry_max.empty()) {
            c.retry_max = duration("--retry-max", retry_max, c.retry_min);
            given.retry_max = true;
        }
        if (!redis_timeout.empty()) {
            c.redis_timeout = duration("--redis-timeout", redis_timeout, std::chrono::milliseconds(100));
            given.redis_timeout = true;
        }
        if (!pg_timeout.empty()) {
            c.pg_timeout = duration("--pg-timeout", pg_timeout, std::chrono::seconds(1));
            if (c.pg_timeout > std::chrono::hours(1)) throw ConfigError("--pg-timeout: at most 1h");
            given.pg_timeout = true;
        }
        c.stats_interval = duration("--stats-interval", stats, std::chrono::milliseconds(100));
        c.maintain_interval = duration("--maintain-interval", maintain, std::chrono::milliseconds(0));
        c.stuck_after = duration("--stuck-after", stuck_after, std::chrono::milliseconds(0));
        c.lease = duration("--lease", lease, std::chrono::milliseconds(1000));
        if (c.lease > std::chrono::hours(1)) throw ConfigError("--lease: at most 1h");
        if (c.lease < 3 * c.poll_interval)
            throw ConfigError("--lease: must be at least 3 times --poll-interval, so that an idle leader renews it "
                              "in time");
        c.id_mode = id_mode == "redis" ? IdMode::redis_generated : IdMode::explicit_position;
        // An env file's PG_OUTBOX_FORMAT= is the default.
        if (entry_format == "default" || entry_format.empty())
            c.entry_format = EntryFormat::plain;
        else if (entry_format == "cloudevents")
            c.entry_format = EntryFormat::cloudevents;
        else if (entry_format == "cloudevents-structured")
            c.entry_format = EntryFormat::cloudevents_structured;
        else
            throw ConfigError("--format: \"" + entry_format.substr(0, 64) +
                              "\" is not a format; use default, cloudevents or cloudevents-structured");
        if (auto fault = ce_source_fault(c.ce_source)) throw ConfigError("--ce-source: " + *fault);
        c.log_format = log_format == "json" ? LogFormat::json : LogFormat::text;
        if (publish->parsed()) c.mode = Config::Mode::publish;
        if (consume->parsed()) c.mode = Config::Mode::consume;
        derive_bounds(c, given);
        // A fetch waits in the server for new events up to --poll-interval,
        // within the bound on its result: a shorter bound would cut every
        // idle fetch as if the link were dead.
        if (c.mode == Config::Mode::publish && c.pg_timeout <= c.poll_interval)
            throw ConfigError("--pg-timeout: must be longer than --poll-interval (" +
                              std::to_string(c.poll_interval.count()) + " ms), the longest a fetch waits in the "
                              "server for new events; it is " + std::to_string(c.pg_timeout.count()) +
                              " ms (two thirds of --lease, at most 10s, unless given)");
        if (consume->parsed()) {
            c.mode = Config::Mode::consume;
            c.block = duration("--block", block, std::chrono::milliseconds(1));
            c.min_idle = duration("--min-idle", min_idle, std::chrono::milliseconds(1));
            c.claim_interval = duration("--claim-interval", claim_interval, std::chrono::milliseconds(1));
            if (c.consumer.empty()) throw ConfigError("--consumer: must not be empty");
            if (c.handler.empty()) throw ConfigError("--handler: must not be empty");
            if (streams_option->count() == 0) {
                const char* env = std::getenv("PG_OUTBOX_STREAMS");
                if (env == nullptr) throw ConfigError("--stream is required (or PG_OUTBOX_STREAMS)");
                c.streams.clear();
                const std::string list = env;
                for (std::size_t start = 0;;) {
                    const auto comma = list.find(',', start);
                    c.streams.push_back(list.substr(start, comma == std::string::npos ? comma : comma - start));
                    if (comma == std::string::npos) break;
                    start = comma + 1;
                }
            }
            for (const auto& s : c.streams)
                if (s.empty()) throw ConfigError("--stream: a stream name must not be empty");
            if (!shards.empty()) {
                int n = 0;
                const auto [end, ec] = std::from_chars(shards.data(), shards.data() + shards.size(), n);
                if (ec != std::errc() || end != shards.data() + shards.size() || n < 1 || n > kMaxConsumeShards)
                    throw ConfigError("--shards: \"" + shards + "\" is not a shard count (1 to " +
                                      std::to_string(kMaxConsumeShards) + ")");
                c.shards = n;
            }
            expand_shards(c);
            check_pool(c, pool_lease, pool_renew);
            // Given, or by --pool (an empty value too: an env file's
            // PG_OUTBOX_ON_FAILURE= is the default).
            if (on_failure.empty())
                c.on_failure = c.pool ? OnFailure::park_key : OnFailure::skip;
            else if (on_failure == "park-key")
                c.on_failure = OnFailure::park_key;
            else if (on_failure == "skip")
                c.on_failure = OnFailure::skip;
            else
                throw ConfigError("--on-failure: \"" + on_failure + "\" is not a mode; use skip or park-key");
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
        if (c.mode == Config::Mode::publish) {
            c.groups = check_group_list(c.groups);
            c.group = c.groups.front();
        }
    } catch (const ConfigError& e) {
        std::cerr << "pg_outbox_relay: " << escape_control(e.what()) << '\n';
        return {std::nullopt, 2};
    }
    return {c, 0};
}

}  // namespace pg_outbox
