// Redis's error replies as typed exceptions, made in one place
// (throw_error()) from the reply's text, so that callers catch what they
// handle (an OomError, a MovedError with its slot and address) instead of
// reading codes out of messages. Every class derives from RedisError of
// kind reply, so that a caller that handles none of them retries as
// before. A MOVED or ASK reply is parsed once, here.
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include <hiredis/hiredis.h>

#include "pg_outbox/errors.hpp"

namespace pg_outbox {

// A MOVED or ASK error reply: "MOVED <slot> <host>:<port>". Redis prints
// an IPv6 host without brackets ("::1:7000", the port after the last
// colon), and an empty host when the node does not know its own endpoint
// (the caller then uses the host it asked).
struct Redirect {
    enum class Kind { moved, ask };
    Kind kind;
    int slot;
    std::string host;
    int port;
};

// Parses an error reply's text; nullopt for any other error, or a
// redirection that is malformed (slot outside 0-16383, no port, a port
// outside 1-65535, trailing text).
std::optional<Redirect> parse_redirect(std::string_view error);

// The code of an error reply: its first word when that is 1 to 32 capital
// letters ("OOM", "READONLY"), else "other".
std::string reply_error_code(std::string_view text);

// An error reply of any code this file gives no class of its own (ERR,
// BUSY, EXECABORT, MISCONF, ...): its code() is the reply's first word.
class ReplyError : public RedisError {
public:
    // "text" is Redis's, "message" what() says (the text, after a context
    // and before a detail).
    ReplyError(std::string_view text, const std::string& message)
        : RedisError(Kind::reply, message, reply_error_code(text)), text_(text) {}

    // The reply as Redis wrote it, without the context.
    const std::string& text() const noexcept { return text_; }

private:
    std::string text_;
};

// Redis refused a write for want of memory (maxmemory, noeviction).
class OomError : public ReplyError {
    using ReplyError::ReplyError;
};
// A write to a replica: a failover demoted the server.
class ReadOnlyError : public ReplyError {
    using ReplyError::ReplyError;
};
// EVALSHA of a script the server does not hold (restarted, flushed).
class NoScriptError : public ReplyError {
    using ReplyError::ReplyError;
};
// XGROUP CREATE of a consumer group that exists.
class BusyGroupError : public ReplyError {
    using ReplyError::ReplyError;
};
// A command for another type than the key holds.
class WrongTypeError : public ReplyError {
    using ReplyError::ReplyError;
};
// XREADGROUP, XACK, ... naming a consumer group or a stream that is gone.
class NoGroupError : public ReplyError {
    using ReplyError::ReplyError;
};
// The server is loading its data set into memory.
class LoadingError : public ReplyError {
    using ReplyError::ReplyError;
};
// A replica that serves no stale data while its master is down.
class MasterDownError : public ReplyError {
    using ReplyError::ReplyError;
};
// A cluster node refusing a command on keys that a migration splits.
class TryAgainError : public ReplyError {
    using ReplyError::ReplyError;
};
// The cluster is down, or no node serves the slot.
class ClusterDownError : public ReplyError {
    using ReplyError::ReplyError;
};
// The ACL does not let the user run the command or read the key.
class NoPermError : public ReplyError {
    using ReplyError::ReplyError;
};
// NOAUTH (a password wanted) or WRONGPASS (the user or password refused).
class AuthError : public ReplyError {
    using ReplyError::ReplyError;
};

// A cluster node answered that another serves the key's slot: the command
// did not run. The slot and the address are parsed from the reply.
class RedirectionError : public ReplyError {
public:
    RedirectionError(std::string_view text, const std::string& message, Redirect redirect)
        : ReplyError(text, message), redirect_(std::move(redirect)) {}

    const Redirect& redirect() const noexcept { return redirect_; }
    int slot() const noexcept { return redirect_.slot; }
    // "" when the node did not know its endpoint (its host is the one asked).
    const std::string& host() const noexcept { return redirect_.host; }
    int port() const noexcept { return redirect_.port; }

private:
    Redirect redirect_;
};
// The slot moved for good (a reshard finished, a failover): the map is out
// of date.
class MovedError : public RedirectionError {
    using RedirectionError::RedirectionError;
};
// The slot is being migrated: that one command goes to the node named,
// after ASKING.
class AskError : public RedirectionError {
    using RedirectionError::RedirectionError;
};

// Whether a reply is an error reply. The one test of a reply's type for an
// error outside this layer: for the replies a caller must inspect (MULTI,
// the commands queued in a transaction, EXEC, WATCH).
inline bool is_error(const redisReply* reply) noexcept {
    return reply != nullptr && reply->type == REDIS_REPLY_ERROR;
}

// Throws the typed error of an error reply's text: what() is the text,
// after "context: " when a context is given, and before " (detail)" when a
// detail is given. The class is chosen by the reply's code alone: a MOVED
// or ASK that does not parse is a plain ReplyError.
[[noreturn]] void throw_error(std::string_view text, std::string_view context = {}, std::string_view detail = {});
// The same for an error reply; a reply of any other type is thrown as a
// ReplyError saying what type came instead of an error.
[[noreturn]] void throw_error(const redisReply& reply, std::string_view context = {}, std::string_view detail = {});

// The typed error of an error reply, to keep while the rest of a pipeline
// is read and throw after it (std::rethrow_exception).
std::exception_ptr make_error(std::string_view text, std::string_view context = {}, std::string_view detail = {});
std::exception_ptr make_error(const redisReply& reply, std::string_view context = {}, std::string_view detail = {});

// Whether an error kept by make_error() is of class E (nullptr is none).
template <class E>
bool error_is(const std::exception_ptr& error) noexcept {
    if (!error) return false;
    try {
        std::rethrow_exception(error);
    } catch (const E&) {
        return true;
    } catch (...) {
        return false;
    }
}

}  // namespace pg_outbox
