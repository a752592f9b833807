#include "pg_outbox/redis.hpp"

#include <charconv>

#include "pg_outbox/errors.hpp"

namespace pg_outbox {

namespace {

timeval to_timeval(std::chrono::milliseconds ms) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
    return tv;
}

}  // namespace

std::string_view reply_text(const redisReply* r) {
    if (r == nullptr || r->str == nullptr) return {};
    return {r->str, r->len};
}

void format_command(std::string& out, const std::vector<std::string_view>& argv) {
    std::size_t size = 16;
    for (auto a : argv) size += a.size() + 16;
    out.reserve(out.size() + size);
    auto line = [&out](char type, std::size_t n) {
        char digits[24];
        const auto end = std::to_chars(digits, digits + sizeof digits, n).ptr;
        out += type;
        out.append(digits, end);
        out += "\r\n";
    };
    line('*', argv.size());
    for (auto a : argv) {
        line('$', a.size());
        out.append(a);
        out += "\r\n";
    }
}

const redisReply* map_field(const redisReply* map, std::string_view name) {
    if (map == nullptr || map->type != REDIS_REPLY_ARRAY) return nullptr;
    for (std::size_t i = 0; i + 1 < map->elements; i += 2)
        if (reply_text(map->element[i]) == name) return map->element[i + 1];
    return nullptr;
}

RedisConnection::RedisConnection(const RedisAddress& address, const std::string& password, int db,
                                 std::chrono::milliseconds timeout) {
    if (!address.cluster_seeds.empty()) {
        // A Redis Cluster: the first seed node that answers, which tells
        // that the cluster is reachable and the credentials work (the
        // relay's RedisCluster keeps a connection per node beside it).
        std::string errors;
        for (const auto& seed : address.cluster_seeds) {
            try {
                *this = RedisConnection(seed, password, 0, timeout);
                return;
            } catch (const RedisSetupError&) {
                throw;
            } catch (const RedisError& e) {
                errors += (errors.empty() ? "" : "; ") + std::string(e.what());
            }
        }
        throw RedisError(RedisError::Kind::io, "could not connect to any seed node of the Redis cluster (" + errors + ")");
    }
    const auto tv = to_timeval(timeout);
    redisContext* c = address.unix_path.empty()
                          ? redisConnectWithTimeout(address.host.c_str(), address.port, tv)
                          : redisConnectUnixWithTimeout(address.unix_path.c_str(), tv);
    if (c == nullptr) throw RedisError(RedisError::Kind::io, "could not allocate a Redis connection");
    ctx_.reset(c);
    if (c->err) throw_io("could not connect to Redis at " + address.to_string());
    if (redisSetTimeout(c, tv) != REDIS_OK) throw_io("could not set the Redis timeout");
    if (address.unix_path.empty()) redisEnableKeepAlive(c);

    // AUTH (with the URL's ACL user, if any), SELECT, then a PING, which
    // Redis refuses with NOAUTH when it wants a password it was not given.
    if (!password.empty()) {
        auto r = address.user.empty() ? command_raw({"AUTH", password}) : command_raw({"AUTH", address.user, password});
        if (r->type == REDIS_REPLY_ERROR)
            throw RedisSetupError("--redis-password",
                                  "AUTH" + (address.user.empty() ? std::string() : " as user \"" + address.user + "\"") +
                                      " refused: " + std::string(reply_text(r.get())));
    }
    if (db != 0) {
        const auto db_text = std::to_string(db);
        auto r = command_raw({"SELECT", db_text});
        if (r->type == REDIS_REPLY_ERROR) {
            const auto text = reply_text(r.get());
            if (text.rfind("NOAUTH", 0) == 0)
                throw RedisSetupError("--redis-password", "Redis wants a password: " + std::string(text));
            throw RedisSetupError("--redis-db", "SELECT " + db_text + " refused: " + std::string(text));
        }
    }
    auto ping = command_raw({"PING"});
    if (ping->type == REDIS_REPLY_ERROR) {
        const auto text = reply_text(ping.get());
        if (text.rfind("NOAUTH", 0) == 0 || text.rfind("WRONGPASS", 0) == 0 || text.rfind("NOPERM", 0) == 0)
            throw RedisSetupError("--redis-password", "Redis refused the connection: " + std::string(text));
        throw RedisError(RedisError::Kind::reply, "PING: " + std::string(text));
    }
}

void RedisConnection::throw_io(const std::string& what) const {
    throw RedisError(RedisError::Kind::io, what + ": " + (ctx_ && ctx_->errstr[0] ? ctx_->errstr : "connection lost"));
}

void RedisConnection::append(const std::vector<std::string_view>& argv) {
    command_.clear();
    format_command(command_, argv);
    if (redisAppendFormattedCommand(ctx_.get(), command_.data(), command_.size()) != REDIS_OK)
        throw_io("could not queue a Redis command");
}

void RedisConnection::append_formatted(std::string_view commands) {
    if (redisAppendFormattedCommand(ctx_.get(), commands.data(), commands.size()) != REDIS_OK)
        throw_io("could not queue a Redis command");
}

void RedisConnection::flush() {
    int done = 0;
    while (!done)
        if (redisBufferWrite(ctx_.get(), &done) != REDIS_OK) throw_io("Redis connection failed");
}

RedisReply RedisConnection::get_reply_raw() {
    void* raw = nullptr;
    if (redisGetReply(ctx_.get(), &raw) != REDIS_OK || raw == nullptr) throw_io("Redis connection failed");
    return RedisReply(static_cast<redisReply*>(raw));
}

RedisReply RedisConnection::command_raw(const std::vector<std::string_view>& argv) {
    append(argv);
    return get_reply_raw();
}

RedisReply RedisConnection::command(const std::vector<std::string_view>& argv, std::string_view context) {
    auto r = command_raw(argv);
    if (r->type == REDIS_REPLY_ERROR)
        throw RedisError(RedisError::Kind::reply, context.empty() ? std::string(reply_text(r.get()))
                                                                  : std::string(context) + ": " +
                                                                        std::string(reply_text(r.get())));
    return r;
}

}  // namespace pg_outbox
