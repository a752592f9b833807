// Redis Cluster support for the relay: hash slots (CRC16 of a key or its
// hash tag), the slot map read from CLUSTER SLOTS, MOVED and ASK
// redirections, and one connection per node. hiredis 0.14 has none of
// this; it follows the Redis Cluster specification
// (https://redis.io/docs/reference/cluster-spec/).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/redis.hpp"
#include "pg_outbox/redis_error.hpp"
#include "pg_outbox/redis_target.hpp"

namespace pg_outbox {

constexpr int kClusterSlots = 16384;

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as the Redis
// Cluster specification defines it: "123456789" gives 0x31C3.
std::uint16_t crc16(std::string_view data) noexcept;

// The part of a key that is hashed: the text between the first "{" and
// the first "}" after it, when that text is not empty; else the whole key.
std::string_view hash_tag(std::string_view key) noexcept;

// The hash slot of a key, 0-16383.
int key_slot(std::string_view key) noexcept;

// Which master serves each slot, from a CLUSTER SLOTS reply (Redis 3.0 to
// 7.x; CLUSTER SHARDS, new in 7.0, would tell the same). "asked" is the
// node that replied: a node listed with an empty host is on its host.
class SlotMap {
public:
    // Throws RedisError(reply) when the reply is not a slot map.
    static SlotMap parse(const redisReply* reply, const std::string& asked_host);

    // The master of a slot; nullptr when no node serves it.
    const RedisAddress* master(int slot) const;
    const std::vector<RedisAddress>& masters() const { return masters_; }

private:
    std::vector<RedisAddress> masters_;
    std::array<std::int16_t, kClusterSlots> owner_{};  // index in masters_, -1: none
};

// The seed nodes of "redis+cluster://[user:password@]host:port[,host:port...]":
// where the relay first reads the slot map. Each has the URL's user and
// password; a database is refused (a cluster has database 0 only).
// Throws ConfigError.
std::vector<RedisAddress> parse_cluster_url(const std::string& text);

// The nodes of a cluster, one connection each, and the slot map that
// routes a key to its master. Connections are made when first needed;
// after a fault (a node lost, a MOVED) the map is read again from any node
// that answers: the known masters first, then the seeds.
class RedisCluster final : public RedisTarget {
public:
    RedisCluster(std::vector<RedisAddress> seeds, std::string password, std::chrono::milliseconds timeout);

    // Called on each new node connection (e.g. to load a script).
    void on_connect(std::function<void(RedisConnection&)> f) override { on_connect_ = std::move(f); }

    // Reads the slot map through "via" (a connection to any node).
    void refresh(RedisConnection& via, const std::string& via_host);
    // Reads the slot map from the first node that answers. Throws
    // RedisError(io) when none does.
    void refresh() override;
    // Something failed: every node connection is dropped (its pipeline
    // is in an unknown state) and the map is read again before next use.
    // The cluster stays of use: false.
    bool fault() override;

    // The connection to the master of a key's slot, or to a node.
    RedisConnection& node_for(std::string_view key) override;
    RedisConnection& node(const RedisAddress& address);

    // Runs one command on a key's master, following MOVED (the map is
    // read again) and ASK (ASKING, then the command, on the node named)
    // a few times. Returns the reply as it is, error replies included.
    RedisReply command_raw(std::string_view key, const std::vector<std::string_view>& argv) override;
    // Runs at once (command()): the next command may go to another node.
    void send_unawaited(std::string_view key, const std::vector<std::string_view>& argv,
                        std::string context) override;

    // The connection to a redirection's target; when Redis printed no
    // host, the host of the key's master in the map.
    RedisConnection* redirected(const Redirect& r, std::string_view key) override;

    bool per_slot() const override { return true; }

private:
    RedisAddress address(const std::string& host, int port) const;

    std::vector<RedisAddress> seeds_;
    std::string password_;
    std::chrono::milliseconds timeout_;
    std::function<void(RedisConnection&)> on_connect_;
    std::optional<SlotMap> map_;
    std::map<std::string, RedisConnection> connections_;  // by "host:port"
};

}  // namespace pg_outbox
