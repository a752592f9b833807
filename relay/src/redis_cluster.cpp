// Redis Cluster routing. Invariant: a command that names a key goes to the
// master the slot map gives for the key's slot; a MOVED reply means the
// map is out of date (a reshard, a failover) and is read again before the
// command is sent once more; an ASK reply sends that one command, after
// ASKING, to the node named, without changing the map (the slot is being
// migrated). A MOVED or ASK reply means the command did not run, so
// sending it again is harmless whatever it does.
#include "pg_outbox/redis_cluster.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

#include "pg_outbox/errors.hpp"

namespace pg_outbox {

namespace {

// How many redirections one command follows before giving up (the map
// keeps changing: a failover or a reshard in progress).
constexpr int kMaxRedirects = 5;

std::string node_name(const RedisAddress& a) { return a.to_string(); }

}  // namespace

std::uint16_t crc16(std::string_view data) noexcept {
    std::uint16_t crc = 0;
    for (unsigned char byte : data) {
        crc = static_cast<std::uint16_t>(crc ^ (static_cast<std::uint16_t>(byte) << 8));
        for (int bit = 0; bit < 8; ++bit)
            crc = (crc & 0x8000) ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021) : static_cast<std::uint16_t>(crc << 1);
    }
    return crc;
}

std::string_view hash_tag(std::string_view key) noexcept {
    const auto open = key.find('{');
    if (open == std::string_view::npos) return key;
    const auto close = key.find('}', open + 1);
    if (close == std::string_view::npos || close == open + 1) return key;
    return key.substr(open + 1, close - open - 1);
}

int key_slot(std::string_view key) noexcept { return crc16(hash_tag(key)) & (kClusterSlots - 1); }

SlotMap SlotMap::parse(const redisReply* reply, const std::string& asked_host) {
    auto bad = [](const std::string& why) {
        return RedisError(RedisError::Kind::reply, "CLUSTER SLOTS: " + why);
    };
    if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY) {
        if (is_error(reply)) throw_error(*reply, "CLUSTER SLOTS");
        throw bad("not an array");
    }
    SlotMap m;
    m.owner_.fill(-1);
    for (std::size_t i = 0; i < reply->elements; ++i) {
        const redisReply* range = reply->element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
            range->element[0]->type != REDIS_REPLY_INTEGER || range->element[1]->type != REDIS_REPLY_INTEGER ||
            range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2)
            throw bad("malformed slot range");
        const long long from = range->element[0]->integer, to = range->element[1]->integer;
        if (from < 0 || to >= kClusterSlots || from > to) throw bad("slot range out of bounds");
        const redisReply* master = range->element[2];
        if (master->element[0]->type != REDIS_REPLY_STRING || master->element[1]->type != REDIS_REPLY_INTEGER)
            throw bad("malformed node");
        std::string host(reply_text(master->element[0]));
        // "" (the asked node's host) or "?" (the node does not know it).
        if (host.empty() || host == "?") host = asked_host;
        const long long port = master->element[1]->integer;
        if (port < 1 || port > 65535) throw bad("port out of bounds");
        RedisAddress a;
        a.host = host;
        a.port = static_cast<int>(port);
        auto it = std::find_if(m.masters_.begin(), m.masters_.end(),
                               [&](const RedisAddress& n) { return n.host == a.host && n.port == a.port; });
        if (it == m.masters_.end()) it = m.masters_.insert(m.masters_.end(), a);
        const auto index = static_cast<std::int16_t>(it - m.masters_.begin());
        std::fill(m.owner_.begin() + from, m.owner_.begin() + to + 1, index);
    }
    return m;
}

const RedisAddress* SlotMap::master(int slot) const {
    if (slot < 0 || slot >= kClusterSlots || owner_[static_cast<std::size_t>(slot)] < 0) return nullptr;
    return &masters_[static_cast<std::size_t>(owner_[static_cast<std::size_t>(slot)])];
}

std::vector<RedisAddress> parse_cluster_url(const std::string& text) {
    constexpr std::string_view scheme = "redis+cluster://";
    if (text.rfind(scheme, 0) != 0) throw ConfigError("not a redis+cluster:// URL");  // not quoted: a password
    std::string rest = text.substr(scheme.size());
    std::string userinfo;
    if (const auto at = rest.rfind('@'); at != std::string::npos) {
        userinfo = rest.substr(0, at + 1);
        rest = rest.substr(at + 1);
    }
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    std::vector<RedisAddress> seeds;
    for (std::size_t start = 0;;) {
        const auto comma = rest.find(',', start);
        const std::string one = rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (one.empty()) throw ConfigError("redis+cluster:// URL with an empty node in its list");
        if (one.find('/') != std::string::npos)
            throw ConfigError("redis+cluster:// URL with a database: a cluster has database 0 only");
        // Each seed goes through the redis:// parser, credentials included.
        seeds.push_back(RedisAddress::parse("redis://" + userinfo + one));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return seeds;
}

RedisCluster::RedisCluster(std::vector<RedisAddress> seeds, std::string password, std::chrono::milliseconds timeout)
    : seeds_(std::move(seeds)), password_(std::move(password)), timeout_(timeout) {
    for (auto& s : seeds_) s.cluster_seeds.clear();
}

RedisAddress RedisCluster::address(const std::string& host, int port) const {
    RedisAddress a;
    a.host = host;
    a.port = port;
    if (!seeds_.empty()) a.user = seeds_.front().user;
    return a;
}

void RedisCluster::refresh(RedisConnection& via, const std::string& via_host) {
    auto r = via.command_raw({"CLUSTER", "SLOTS"});
    auto m = SlotMap::parse(r.get(), via_host);
    if (m.masters().empty()) throw RedisError(RedisError::Kind::reply, "CLUSTER SLOTS: no node serves any slot");
    map_ = std::move(m);
}

void RedisCluster::refresh() {
    std::vector<RedisAddress> candidates;
    if (map_) candidates = map_->masters();
    candidates.insert(candidates.end(), seeds_.begin(), seeds_.end());
    std::string last_error = "no node to ask";
    for (const auto& a : candidates) {
        try {
            RedisConnection c(address(a.host, a.port), password_, 0, timeout_);
            refresh(c, a.host);
            return;
        } catch (const RedisSetupError&) {
            throw;
        } catch (const RedisError& e) {
            last_error = a.to_string() + ": " + e.what();
        }
    }
    map_.reset();
    throw RedisError(RedisError::Kind::io, "could not read the cluster's slot map from any node (" + last_error + ")");
}

bool RedisCluster::fault() {
    connections_.clear();
    map_.reset();
    return false;
}

RedisConnection& RedisCluster::node(const RedisAddress& a) {
    const auto name = node_name(a);
    auto it = connections_.find(name);
    if (it == connections_.end()) {
        RedisConnection c(address(a.host, a.port), password_, 0, timeout_);
        if (on_connect_) on_connect_(c);
        it = connections_.emplace(name, std::move(c)).first;
    }
    return it->second;
}

RedisConnection& RedisCluster::node_for(std::string_view key) {
    if (!map_) refresh();
    const int slot = key_slot(key);
    const RedisAddress* master = map_->master(slot);
    if (master == nullptr)
        throw_error("CLUSTERDOWN no node serves hash slot " + std::to_string(slot));
    return node(*master);
}

RedisConnection* RedisCluster::redirected(const Redirect& r, std::string_view key) {
    std::string host = r.host;
    if (host.empty()) {
        if (!map_) refresh();
        const RedisAddress* master = map_->master(key_slot(key));
        host = master ? master->host : seeds_.front().host;
    }
    return &node(address(host, r.port));
}

RedisReply RedisCluster::command_raw(std::string_view key, const std::vector<std::string_view>& argv) {
    for (int attempt = 0;; ++attempt) {
        if (!map_) refresh();
        const RedisAddress* master = map_->master(key_slot(key));
        if (master == nullptr)
            throw_error("CLUSTERDOWN no node serves hash slot " + std::to_string(key_slot(key)));
        auto r = node(*master).command_raw(argv);
        if (!is_error(r.get()) || attempt >= kMaxRedirects) return r;
        const auto redirect = parse_redirect(reply_text(r.get()));
        if (!redirect) return r;
        if (redirect->kind == Redirect::Kind::moved) {
            spdlog::debug("slot {} moved to {}:{}; reading the slot map again", redirect->slot, redirect->host,
                          redirect->port);
            refresh();
            continue;
        }
        auto& to = *redirected(*redirect, key);
        to.append({"ASKING"});
        to.append(argv);
        to.get_reply_raw();
        r = to.get_reply_raw();
        if (!is_error(r.get()) || !parse_redirect(reply_text(r.get()))) return r;
        refresh();
    }
}

void RedisCluster::send_unawaited(std::string_view key, const std::vector<std::string_view>& argv,
                                  std::string context) {
    command(key, argv, context);
}

}  // namespace pg_outbox
