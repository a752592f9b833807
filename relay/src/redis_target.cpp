// The relay's Redis targets. Invariant: a command goes to the server that
// holds its key, and an error reply reaches the caller as its typed error
// (throw_error()), whatever the target.
#include "pg_outbox/redis_target.hpp"

#include "pg_outbox/redis_cluster.hpp"

namespace pg_outbox {

std::unique_ptr<RedisTarget> RedisTarget::connect(const RedisAddress& address, const std::string& password, int db,
                                                  std::chrono::milliseconds timeout) {
    if (address.is_cluster()) {
        auto cluster = std::make_unique<RedisCluster>(address.cluster_seeds, password, timeout);
        cluster->refresh();
        return cluster;
    }
    return std::make_unique<RedisNode>(RedisConnection(address, password, db, timeout));
}

RedisReply RedisTarget::command(std::string_view key, const std::vector<std::string_view>& argv,
                                std::string_view context) {
    auto r = command_raw(key, argv);
    if (is_error(r.get())) throw_error(*r, context);
    return r;
}

RedisReply RedisNode::command_raw(std::string_view, const std::vector<std::string_view>& argv) {
    return connection_.command_raw(argv);
}

void RedisNode::send_unawaited(std::string_view, const std::vector<std::string_view>& argv, std::string context) {
    connection_.send_unawaited(argv, std::move(context));
}

}  // namespace pg_outbox
