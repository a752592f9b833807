#include "pg_outbox/redis.hpp"

#include <poll.h>
#include <strings.h>
#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include <charconv>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/io_wait.hpp"
#include "pg_outbox/redis_error.hpp"

namespace pg_outbox {

namespace {

// The argument of BLOCK in a command that may wait for entries (XREAD,
// XREADGROUP): its reply may take that long beyond the timeout.
std::chrono::milliseconds block_of(const std::vector<std::string_view>& argv) {
    if (argv.empty() || argv.front().size() < 5) return std::chrono::milliseconds(0);
    const auto name = argv.front();
    if (strncasecmp(name.data(), "XREAD", 5) != 0) return std::chrono::milliseconds(0);
    for (std::size_t i = 1; i + 1 < argv.size(); ++i) {
        if (argv[i].size() != 5 || strncasecmp(argv[i].data(), "BLOCK", 5) != 0) continue;
        long long ms = 0;
        const auto [end, ec] = std::from_chars(argv[i + 1].data(), argv[i + 1].data() + argv[i + 1].size(), ms);
        if (ec == std::errc() && ms > 0) return std::chrono::milliseconds(ms);
    }
    return std::chrono::milliseconds(0);
}

// Asks one sentinel where the master named in "address" is; the answer
// carries the URL's user for the data node. Throws RedisSetupError when
// the sentinel refuses for a reason of the settings, RedisError otherwise.
RedisAddress ask_sentinel(const SentinelAddress& sentinel, const RedisAddress& address,
                          std::chrono::milliseconds timeout) {
    RedisAddress node;
    node.host = sentinel.host;
    node.port = sentinel.port;
    const std::string who = "sentinel " + sentinel.to_string();
    std::optional<RedisConnection> connection;
    try {
        connection.emplace(node, address.sentinel_password, 0, timeout);
    } catch (const RedisSetupError& e) {
        throw RedisSetupError("--sentinel-password", who + ": " + e.what());
    }
    auto r = connection->command_raw({"SENTINEL", "get-master-addr-by-name", address.master_name});
    if (is_error(r.get())) {
        const std::string text(reply_text(r.get()));
        if (text.find("unknown command") != std::string::npos || text.find("unknown subcommand") != std::string::npos)
            throw RedisSetupError("--redis", who + " is not a Redis Sentinel (" + text + ")");
        throw_error(*r, who);
    }
    if (r->type == REDIS_REPLY_NIL)
        throw RedisSetupError("--redis", who + " monitors no master named \"" + address.master_name + "\"");
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING)
        throw RedisError(RedisError::Kind::reply, who + ": unexpected reply to SENTINEL get-master-addr-by-name");
    RedisAddress master;
    master.host = std::string(reply_text(r->element[0]));
    try {
        master.port = parse_port(std::string(reply_text(r->element[1])));
    } catch (const ConfigError& e) {
        throw RedisError(RedisError::Kind::reply, who + " named a master on no port: " + e.what());
    }
    if (master.host.empty()) throw RedisError(RedisError::Kind::reply, who + " named a master without an address");
    master.user = address.user;
    return master;
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

// Through Sentinel: the sentinels are asked in the order given, and the
// first master found that answers ROLE "master" is kept. A sentinel may
// name the old master during a failover, or a server that is still being
// promoted: the next sentinel is asked, and when none helps the caller
// retries with backoff.
RedisConnection::RedisConnection(const RedisAddress& address, const std::string& password, int db,
                                 std::chrono::milliseconds timeout) {
    // A cluster is a RedisTarget of its own (RedisCluster), one
    // connection per node: none of its addresses is one server's.
    if (address.is_cluster())
        throw std::logic_error("a redis+cluster:// address is connected to through RedisTarget::connect()");
    if (!address.is_sentinel()) {
        open(address, password, db, timeout);
        return;
    }
    std::string why;  // what each sentinel said
    std::optional<RedisSetupError> setup;
    bool only_setup = true;  // every sentinel refused for a reason of the settings
    for (const auto& sentinel : address.sentinels) {
        RedisAddress master;
        try {
            master = ask_sentinel(sentinel, address, timeout);
        } catch (const RedisSetupError& e) {
            if (!setup) setup = e;
            why += std::string(why.empty() ? "" : "; ") + e.what();
            continue;
        } catch (const RedisError& e) {
            only_setup = false;
            why += std::string(why.empty() ? "" : "; ") + e.what();
            continue;
        }
        only_setup = false;
        const std::string named = "sentinel " + sentinel.to_string() + " named " + master.to_string();
        try {
            open(master, password, db, timeout);  // AUTH or SELECT refused: the settings', thrown as is
            const auto role = this->role();
            if (role == "master" || role.empty()) {
                server_ = master;
                master_name_ = address.master_name;
                spdlog::info("Redis Sentinel: {} as the master \"{}\"{}", named, address.master_name,
                             role.empty() ? " (its ROLE is not for this user to see: taken as Sentinel says)" : "");
                return;
            }
            why += (why.empty() ? "" : "; ") + named + ", which is a " + (role == "slave" ? "replica" : role) +
                   " (a failover is under way)";
        } catch (const RedisSetupError&) {
            throw;
        } catch (const RedisError& e) {
            why += (why.empty() ? "" : "; ") + named + ": " + e.what();
        }
        ctx_.reset();
    }
    if (setup && only_setup) throw *setup;
    throw RedisError(RedisError::Kind::io,
                     "could not find the master \"" + address.master_name + "\" through Sentinel: " + why);
}

// ROLE is in the @admin category: a user the ACL keeps to streams and
// scripts may be refused it, and then INFO replication. Neither allowed,
// the server cannot tell, and Sentinel's word is taken ("").
std::string RedisConnection::role() {
    RedisReply r;
    try {
        r = command({"ROLE"}, "ROLE");
    } catch (const NoPermError&) {
        RedisReply info;
        try {
            info = command({"INFO", "replication"}, "INFO replication");
        } catch (const NoPermError&) {
            return {};
        }
        const auto text = reply_text(info.get());
        const auto at = text.find("role:");
        if (at == std::string_view::npos) throw RedisError(RedisError::Kind::reply, "INFO replication shows no role");
        const auto value = text.substr(at + 5);
        return std::string(value.substr(0, value.find_first_of("\r\n")));
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0 || r->element[0]->type != REDIS_REPLY_STRING)
        throw RedisError(RedisError::Kind::reply, "unexpected reply to ROLE");
    return std::string(reply_text(r->element[0]));
}

bool RedisConnection::lost_master() {
    if (master_name_.empty() || !ctx_) return false;
    try {
        const auto role = this->role();
        if (role == "master" || role.empty()) return false;
        spdlog::warn("Redis at {} is no longer the master \"{}\" (ROLE {}): a failover moved it; asking Sentinel "
                     "again",
                     server_.to_string(), master_name_, role);
    } catch (const std::exception& e) {
        spdlog::warn("Redis at {}, the master \"{}\", does not answer ROLE ({}); asking Sentinel again",
                     server_.to_string(), master_name_, e.what());
    }
    return true;
}

// Every wait of the connection is bounded (io_wait.hpp): the connect is
// made non-blocking and waited for within the timeout, and so is every
// write and every reply after it; hiredis never blocks on the socket.
void RedisConnection::open(const RedisAddress& address, const std::string& password, int db,
                           std::chrono::milliseconds timeout) {
    server_ = address;
    timeout_ = timeout;
    redisContext* c = address.unix_path.empty() ? redisConnectNonBlock(address.host.c_str(), address.port)
                                                : redisConnectUnixNonBlock(address.unix_path.c_str());
    if (c == nullptr) throw RedisError(RedisError::Kind::io, "could not allocate a Redis connection");
    ctx_.reset(c);
    const std::string where = "could not connect to Redis at " + address.to_string();
    if (c->err) throw_io(where);
    const auto waited = wait_socket(c->fd, POLLOUT, std::chrono::steady_clock::now() + timeout);
    if (waited == WaitResult::timed_out)
        throw RedisError(RedisError::Kind::io,
                         where + ": no answer within " + std::to_string(timeout.count()) + " ms (--redis-timeout)");
    if (waited == WaitResult::stopping) throw RedisError(RedisError::Kind::io, where + ": the relay is stopping");
    int error = 0;
    socklen_t length = sizeof error;
    if (::getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    if (error != 0) throw RedisError(RedisError::Kind::io, where + ": " + std::strerror(error));
    if (address.unix_path.empty()) redisEnableKeepAlive(c);

    // AUTH (with the URL's ACL user, if any), SELECT, then a PING, which
    // Redis refuses with NOAUTH when it wants a password it was not given.
    if (!password.empty()) {
        try {
            if (address.user.empty())
                command({"AUTH", password});
            else
                command({"AUTH", address.user, password});
        } catch (const ReplyError& e) {
            throw RedisSetupError("--redis-password",
                                  "AUTH" + (address.user.empty() ? std::string() : " as user \"" + address.user + "\"") +
                                      " refused: " + e.text());
        }
    }
    if (db != 0) {
        const auto db_text = std::to_string(db);
        try {
            command({"SELECT", db_text});
        } catch (const AuthError& e) {
            throw RedisSetupError("--redis-password", "Redis wants a password: " + e.text());
        } catch (const ReplyError& e) {
            throw RedisSetupError("--redis-db", "SELECT " + db_text + " refused: " + e.text());
        }
    }
    try {
        command({"PING"}, "PING");
    } catch (const AuthError& e) {
        throw RedisSetupError("--redis-password", "Redis refused the connection: " + e.text());
    } catch (const NoPermError& e) {
        throw RedisSetupError("--redis-password", "Redis refused the connection: " + e.text());
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
    block_allowance_ = std::max(block_allowance_, block_of(argv));
}

void RedisConnection::append_formatted(std::string_view commands) {
    if (redisAppendFormattedCommand(ctx_.get(), commands.data(), commands.size()) != REDIS_OK)
        throw_io("could not queue a Redis command");
}

void RedisConnection::await(short events, std::chrono::steady_clock::time_point deadline,
                            std::chrono::milliseconds span) {
    const auto waited = wait_socket(ctx_->fd, events, deadline);
    if (waited == WaitResult::ready) return;
    // A link that takes nothing, or a server that does not answer: the
    // connection is of no more use (a reply may still come, to the wrong
    // command); the caller reconnects.
    ::shutdown(ctx_->fd, SHUT_RDWR);
    throw RedisError(RedisError::Kind::io,
                     waited == WaitResult::timed_out
                         ? "no answer from Redis at " + server_.to_string() + " within " +
                               std::to_string(span.count()) + " ms (--redis-timeout); the connection is "
                               "closed"
                         : "the relay is stopping; the connection to Redis is closed");
}

void RedisConnection::flush() { flush(std::chrono::steady_clock::now() + timeout_, timeout_); }

void RedisConnection::flush(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds span) {
    for (int done = 0;;) {
        if (redisBufferWrite(ctx_.get(), &done) != REDIS_OK) throw_io("Redis connection failed");
        if (done) return;
        await(POLLOUT, deadline, span);
    }
}

RedisReply RedisConnection::get_reply_raw() {
    read_unawaited();
    return read_reply();
}

void RedisConnection::send_unawaited(const std::vector<std::string_view>& argv, std::string context) {
    append(argv);
    unawaited_.push_back(std::move(context));
    // On the wire now, not when the next command is: the reply is read then.
    flush();
}

void RedisConnection::read_unawaited() {
    // Reading a reply ends the allowance of the BLOCK appended since; the
    // commands appended after these keep theirs.
    const auto allowance = block_allowance_;
    while (!unawaited_.empty()) {
        const std::string context = std::move(unawaited_.front());
        unawaited_.erase(unawaited_.begin());
        auto r = read_reply();
        if (is_error(r.get())) spdlog::warn("{}: {}", context, reply_text(r.get()));
    }
    block_allowance_ = allowance;
}

RedisReply RedisConnection::read_reply() {
    void* raw = nullptr;
    if (redisGetReplyFromReader(ctx_.get(), &raw) != REDIS_OK) throw_io("Redis connection failed");
    if (raw == nullptr) {
        // A command that blocks (XREAD BLOCK) may wait that long, and the
        // timeout on top of it.
        const auto span = timeout_ + block_allowance_;
        const auto deadline = std::chrono::steady_clock::now() + span;
        flush(deadline, span);
        while (raw == nullptr) {
            await(POLLIN, deadline, span);
            if (redisBufferRead(ctx_.get()) != REDIS_OK) throw_io("Redis connection failed");
            if (redisGetReplyFromReader(ctx_.get(), &raw) != REDIS_OK) throw_io("Redis connection failed");
        }
    }
    block_allowance_ = std::chrono::milliseconds(0);
    return RedisReply(static_cast<redisReply*>(raw));
}

RedisReply RedisConnection::command_raw(const std::vector<std::string_view>& argv) {
    append(argv);
    return get_reply_raw();
}

RedisReply RedisConnection::command(const std::vector<std::string_view>& argv, std::string_view context) {
    auto r = command_raw(argv);
    if (is_error(r.get())) throw_error(*r, context);
    return r;
}

Replies RedisConnection::read_replies(std::size_t n) {
    std::vector<RedisReply> replies;
    replies.reserve(n);
    for (std::size_t i = 0; i < n; ++i) replies.push_back(get_reply_raw());
    return Replies(std::move(replies));
}

const redisReply& Replies::get(std::size_t i, std::string_view context) const {
    const redisReply& r = raw(i);
    if (is_error(&r)) throw_error(r, context);
    return r;
}

const redisReply& Replies::raw(std::size_t i) const {
    if (i >= replies_.size())
        throw std::out_of_range("reply " + std::to_string(i) + " of a pipeline of " +
                                std::to_string(replies_.size()));
    if (!replies_[i]) throw std::logic_error("reply " + std::to_string(i) + " of a pipeline was taken");
    return *replies_[i];
}

RedisReply Replies::take(std::size_t i) {
    raw(i);
    return std::move(replies_[i]);
}

}  // namespace pg_outbox
