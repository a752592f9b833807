// Where the relay's Redis commands go, behind one interface: a single
// server (found directly or through Sentinel) or a Redis Cluster. A caller
// names the key of each command and never asks which kind it has; only
// what differs in kind of guarantee is told (per_slot(): a transaction's
// keys must share a hash slot). Like redis-plus-plus's Redis and
// RedisCluster, the connections are the target's, made and dropped by it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pg_outbox/config.hpp"
#include "pg_outbox/redis.hpp"
#include "pg_outbox/redis_error.hpp"

namespace pg_outbox {

class RedisTarget {
public:
    virtual ~RedisTarget() = default;

    // Connects as "address" says: to one server, to the master Sentinel
    // names (RedisConnection), or to a cluster, whose slot map is read
    // from the first seed that answers (which tells that the cluster is
    // reachable and the credentials work). Throws RedisSetupError when a
    // setting cannot work, RedisError otherwise.
    static std::unique_ptr<RedisTarget> connect(const RedisAddress& address, const std::string& password, int db,
                                                std::chrono::milliseconds timeout);

    // The connection to the server of a key: the one server's, or the
    // cluster's master of the key's slot (connected when first needed).
    // For pipelines and transactions, whose replies the caller reads.
    virtual RedisConnection& node_for(std::string_view key) = 0;

    // Runs one command on the server of "key" and returns its reply as it
    // is, an error reply included: for the replies a caller must inspect.
    // A cluster follows MOVED and ASK a few times.
    virtual RedisReply command_raw(std::string_view key, const std::vector<std::string_view>& argv) = 0;
    // The same; an error reply throws its typed error (redis_error.hpp),
    // its message after "context: ".
    RedisReply command(std::string_view key, const std::vector<std::string_view>& argv,
                       std::string_view context = {});

    // A command whose outcome nothing waits on (an acknowledgement). On
    // one server its reply is read with the next command's and an error
    // reply is logged with "context" (RedisConnection::send_unawaited());
    // on a cluster, whose next command may go to another node, it runs at
    // once as command() does.
    virtual void send_unawaited(std::string_view key, const std::vector<std::string_view>& argv,
                                std::string context) = 0;

    // The connection a redirection sends one command to (the node an ASK
    // names, after ASKING); nullptr when the target follows no
    // redirection (one server: a MOVED from it is an error like any other).
    virtual RedisConnection* redirected(const Redirect& r, std::string_view key) = 0;
    // A MOVED was met: the slot map is read again before the next command
    // is routed. Nothing to do on one server.
    virtual void refresh() {}

    // Calls "f" on each connection the target makes from now on (to load
    // a script, to check MULTI), and at once on the one server's.
    virtual void on_connect(std::function<void(RedisConnection&)> f) = 0;

    // After a fault: drops what is in an unknown state (a cluster's node
    // connections and slot map, made and read again at next use). Returns
    // true when the target is of no more use and is to be connected anew:
    // a connection found through Sentinel whose server a failover demoted,
    // or that does not answer ROLE. Never throws.
    virtual bool fault() = 0;

    // Whether the keys of one transaction (WATCH, MULTI/EXEC) must share a
    // hash slot: a cluster's transactions are per slot, on its master.
    virtual bool per_slot() const = 0;
};

// One server, named by the address or found through Sentinel.
class RedisNode final : public RedisTarget {
public:
    explicit RedisNode(RedisConnection connection) : connection_(std::move(connection)) {}

    RedisConnection& node_for(std::string_view) override { return connection_; }
    RedisReply command_raw(std::string_view key, const std::vector<std::string_view>& argv) override;
    void send_unawaited(std::string_view key, const std::vector<std::string_view>& argv,
                        std::string context) override;
    RedisConnection* redirected(const Redirect&, std::string_view) override { return nullptr; }
    void on_connect(std::function<void(RedisConnection&)> f) override { f(connection_); }
    bool fault() override { return connection_.lost_master(); }
    bool per_slot() const override { return false; }

private:
    RedisConnection connection_;
};

}  // namespace pg_outbox
