// Error replies become typed exceptions here and nowhere else. Invariant:
// the class of an error is chosen by the reply's code (its first word)
// alone, and a redirection is a MovedError or AskError only when its slot
// and address parse: a caller that follows one never follows a reply it
// cannot read.
#include "pg_outbox/redis_error.hpp"

namespace pg_outbox {

namespace {

constexpr int kSlots = 16384;  // Redis Cluster's hash slots
constexpr std::size_t kMaxCodeLength = 32;
constexpr std::size_t kMaxHostLength = 255;

// Digits only, at most "max_digits" of them, as an int; nullopt otherwise.
std::optional<int> parse_uint(std::string_view text, std::size_t max_digits) {
    if (text.empty() || text.size() > max_digits) return std::nullopt;
    int value = 0;
    for (char c : text) {
        if (c < '0' || c > '9') return std::nullopt;
        value = value * 10 + (c - '0');
    }
    return value;
}

std::string message_of(std::string_view text, std::string_view context, std::string_view detail) {
    std::string m;
    m.reserve(context.size() + text.size() + detail.size() + 5);
    if (!context.empty()) m.append(context).append(": ");
    m.append(text);
    if (!detail.empty()) m.append(" (").append(detail).append(")");
    return m;
}

template <class E>
[[noreturn]] void raise(std::string_view text, const std::string& message) {
    throw E(text, message);
}

}  // namespace

std::optional<Redirect> parse_redirect(std::string_view error) {
    Redirect r{};
    if (error.rfind("MOVED ", 0) == 0) {
        r.kind = Redirect::Kind::moved;
        error.remove_prefix(6);
    } else if (error.rfind("ASK ", 0) == 0) {
        r.kind = Redirect::Kind::ask;
        error.remove_prefix(4);
    } else {
        return std::nullopt;
    }
    const auto space = error.find(' ');
    if (space == std::string_view::npos) return std::nullopt;
    const auto slot = parse_uint(error.substr(0, space), 5);
    if (!slot || *slot >= kSlots) return std::nullopt;
    r.slot = *slot;
    std::string_view endpoint = error.substr(space + 1);
    // The port follows the last colon: "host:port", "::1:7000", "[::1]:7000".
    const auto colon = endpoint.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    const auto port = parse_uint(endpoint.substr(colon + 1), 5);
    if (!port || *port < 1 || *port > 65535) return std::nullopt;
    r.port = *port;
    std::string_view host = endpoint.substr(0, colon);
    if (!host.empty() && host.front() == '[') {
        if (host.size() < 2 || host.back() != ']') return std::nullopt;
        host = host.substr(1, host.size() - 2);
    }
    // A host name is at most 253 characters long (DNS), an address
    // shorter; no spaces, controls or brackets left in it.
    if (host.size() > kMaxHostLength) return std::nullopt;
    for (unsigned char c : host)
        if (c <= ' ' || c == '[' || c == ']' || c == 0x7f) return std::nullopt;
    r.host = std::string(host);
    return r;
}

std::string reply_error_code(std::string_view text) {
    const auto word = text.substr(0, text.find(' '));
    if (word.empty() || word.size() > kMaxCodeLength) return "other";
    for (char c : word)
        if (c < 'A' || c > 'Z') return "other";
    return std::string(word);
}

void throw_error(std::string_view text, std::string_view context, std::string_view detail) {
    const auto message = message_of(text, context, detail);
    const auto code = reply_error_code(text);
    if (code == "MOVED" || code == "ASK") {
        if (auto r = parse_redirect(text)) {
            if (r->kind == Redirect::Kind::moved) throw MovedError(text, message, std::move(*r));
            throw AskError(text, message, std::move(*r));
        }
        raise<ReplyError>(text, message);
    }
    if (code == "OOM") raise<OomError>(text, message);
    if (code == "READONLY") raise<ReadOnlyError>(text, message);
    if (code == "NOSCRIPT") raise<NoScriptError>(text, message);
    if (code == "BUSYGROUP") raise<BusyGroupError>(text, message);
    if (code == "WRONGTYPE") raise<WrongTypeError>(text, message);
    if (code == "NOGROUP") raise<NoGroupError>(text, message);
    if (code == "LOADING") raise<LoadingError>(text, message);
    if (code == "MASTERDOWN") raise<MasterDownError>(text, message);
    if (code == "TRYAGAIN") raise<TryAgainError>(text, message);
    if (code == "CLUSTERDOWN") raise<ClusterDownError>(text, message);
    if (code == "NOPERM") raise<NoPermError>(text, message);
    if (code == "NOAUTH" || code == "WRONGPASS") raise<AuthError>(text, message);
    raise<ReplyError>(text, message);
}

void throw_error(const redisReply& reply, std::string_view context, std::string_view detail) {
    if (reply.type != REDIS_REPLY_ERROR)
        throw_error("unexpected reply of type " + std::to_string(reply.type) + " where an error was expected",
                    context, detail);
    throw_error(std::string_view(reply.str == nullptr ? "" : reply.str, reply.str == nullptr ? 0 : reply.len),
                context, detail);
}

std::exception_ptr make_error(std::string_view text, std::string_view context, std::string_view detail) {
    try {
        throw_error(text, context, detail);
    } catch (...) {
        return std::current_exception();
    }
}

std::exception_ptr make_error(const redisReply& reply, std::string_view context, std::string_view detail) {
    try {
        throw_error(reply, context, detail);
    } catch (...) {
        return std::current_exception();
    }
}

}  // namespace pg_outbox
