// A Redis connection (hiredis) with owned handles; binary-safe argv
// commands only, and pipelining.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <hiredis/hiredis.h>

#include "pg_outbox/config.hpp"

namespace pg_outbox {

struct RedisReplyDeleter {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using RedisReply = std::unique_ptr<redisReply, RedisReplyDeleter>;

struct RedisContextDeleter {
    void operator()(redisContext* c) const noexcept { redisFree(c); }
};

// The replies of a pipeline, read in full: every reply of a pipeline is
// read whatever the earlier ones said, so that the connection stays in
// step; then each is looked at.
class Replies {
public:
    Replies() = default;
    explicit Replies(std::vector<RedisReply> replies) : replies_(std::move(replies)) {}

    std::size_t size() const noexcept { return replies_.size(); }
    // The i-th reply; an error reply throws its typed error
    // (redis_error.hpp), its message after "context: ".
    const redisReply& get(std::size_t i, std::string_view context = {}) const;
    // The i-th reply as it is, an error reply included: only for the
    // replies a caller must inspect (WATCH, MULTI, the commands queued in a
    // transaction, EXEC).
    const redisReply& raw(std::size_t i) const;
    // The i-th reply, owned by the caller from now on (raw, as raw()); a
    // reply taken is not to be read again.
    RedisReply take(std::size_t i);

private:
    std::vector<RedisReply> replies_;
};

class RedisConnection {
public:
    // Connects, authenticates and selects the database. Throws RedisError.
    // Every wait of the connection (the connect, each write, each reply) is
    // bounded by the timeout, a reply to XREAD BLOCK by the timeout and
    // the BLOCK, and every wait is cut short by the stop request
    // (io_wait.hpp): a wait that runs out closes the connection and throws
    // RedisError(io).
    // A Sentinel address (sentinel://) is asked where its master is:
    // each sentinel in turn, with the same timeout, until one names a
    // server that answers ROLE as a master; RedisError(io) when none did
    // (the caller retries with backoff), RedisSetupError when every
    // sentinel refused for a reason of the settings (AUTH, not a sentinel,
    // an unknown master name). A cluster address (redis+cluster://) is no
    // one server's: it is connected to through RedisTarget::connect()
    // (redis_target.hpp).
    RedisConnection(const RedisAddress& address, const std::string& password, int db,
                    std::chrono::milliseconds timeout);

    RedisConnection(RedisConnection&&) noexcept = default;
    RedisConnection& operator=(RedisConnection&&) noexcept = default;

    // Sends one command and returns its reply. An error reply throws its
    // typed error (redis_error.hpp: OomError, MovedError, ..., ReplyError)
    // with Redis's text, after "context: " when a context is given;
    // RedisError(io) when the connection breaks.
    RedisReply command(const std::vector<std::string_view>& argv, std::string_view context = {});
    // The same, returning an error reply as it is: for the replies the
    // caller must inspect itself (an expected BUSYGROUP, a missing key).
    RedisReply command_raw(const std::vector<std::string_view>& argv);

    // Pipelining: queue commands, then read one reply per command, in order.
    // Queued commands are sent by the first get_reply_raw(), or by flush().
    // Replies come raw, error replies included: every reply of a pipeline
    // must be read whatever the earlier ones said.
    void append(const std::vector<std::string_view>& argv);
    // Queues commands already in the protocol (format_command()).
    void append_formatted(std::string_view commands);
    void flush();
    RedisReply get_reply_raw();
    // Reads the replies of the next n commands of the pipeline, every one
    // of them, error replies included; Replies::get() then throws an error
    // reply's typed error.
    Replies read_replies(std::size_t n);

    // Sends a command whose reply is read before the reply of the next
    // command, instead of being waited for: its round trip rides with the
    // next one's. For an acknowledgement nothing waits on: an error reply
    // is logged with "context", never thrown. Read before anything else
    // this connection reads, so send it with no reply outstanding (not in
    // the middle of a pipeline).
    void send_unawaited(const std::vector<std::string_view>& argv, std::string context);

    // The server this connection reached (for a Sentinel address, the
    // master it named).
    const RedisAddress& server() const { return server_; }
    // After a fault, on a connection found through Sentinel: asks the
    // server its ROLE, and returns true (having logged why) when it is no
    // longer the master (a failover demoted it) or does not answer: the
    // connection is of no more use, Sentinel must be asked again. False
    // for every other connection. Never throws.
    bool lost_master();

private:
    // Connects to one server: AUTH, SELECT, PING.
    void open(const RedisAddress& address, const std::string& password, int db, std::chrono::milliseconds timeout);
    // The server's role: "master", "slave", "sentinel"; "" when the ACL
    // lets this user see neither ROLE nor INFO replication.
    std::string role();
    [[noreturn]] void throw_io(const std::string& what) const;
    // Reads the next reply on the wire.
    RedisReply read_reply();
    // Reads the replies of the commands send_unawaited() sent.
    void read_unawaited();
    // Waits for the socket until the deadline, "span" after the wait's
    // start (for the message); past it, or once the stop request's grace
    // is over, shuts the connection down and throws RedisError(io).
    void await(short events, std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds span);
    void flush(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds span);

    std::unique_ptr<redisContext, RedisContextDeleter> ctx_;
    RedisAddress server_;
    std::string master_name_;  // found through Sentinel: the master's name
    std::string command_;  // the last command formatted, its capacity kept
    std::chrono::milliseconds timeout_{0};
    // The longest BLOCK of the commands appended since the last reply.
    std::chrono::milliseconds block_allowance_{0};
    // The contexts of the commands send_unawaited() sent, whose replies are
    // still to be read, in order.
    std::vector<std::string> unawaited_;
};

// Appends a command to "out" in the Redis protocol (RESP). hiredis formats
// each length with a printf-like routine, which showed in profiles of a
// drain as much as a tenth of the relay's time.
void format_command(std::string& out, const std::vector<std::string_view>& argv);

// The text of a reply that is a status, string or error.
std::string_view reply_text(const redisReply* r);

// The value of a field in a reply that lists fields and values in turn
// (XINFO STREAM, one group of XINFO GROUPS); nullptr when it is absent.
const redisReply* map_field(const redisReply* map, std::string_view name);

}  // namespace pg_outbox
