// W3C Trace Context level 1: what makes a traceparent and a tracestate
// valid (see trace_context.hpp). Nothing here allocates: the checks run
// for every event that carries a trace context.
#include "pg_outbox/trace_context.hpp"

#include <cstddef>

namespace pg_outbox {

namespace {

bool lower_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// "n" lowercase hex digits from "at", not all zeros.
bool hex_id(std::string_view s, std::size_t at, std::size_t n) {
    bool nonzero = false;
    for (std::size_t i = at; i < at + n; ++i) {
        if (!lower_hex(s[i])) return false;
        nonzero = nonzero || s[i] != '0';
    }
    return nonzero;
}

bool key_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' || c == '/';
}

// A list member's key: [a-z0-9][_0-9a-z*/-]{0,255}, or a tenant
// [a-z0-9][_0-9a-z*/-]{0,240} '@' and a system [a-z][_0-9a-z*/-]{0,13}.
bool valid_key(std::string_view key) {
    if (key.empty()) return false;
    const auto first_ok = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
    const auto at = key.find('@');
    if (at == std::string_view::npos) {
        if (!first_ok(key[0]) || key.size() > 256) return false;
        for (const char c : key.substr(1))
            if (!key_char(c)) return false;
        return true;
    }
    const auto tenant = key.substr(0, at), system = key.substr(at + 1);
    if (tenant.empty() || tenant.size() > 241 || !first_ok(tenant[0])) return false;
    for (const char c : tenant.substr(1))
        if (!key_char(c)) return false;
    if (system.empty() || system.size() > 14 || !(system[0] >= 'a' && system[0] <= 'z')) return false;
    for (const char c : system.substr(1))
        if (!key_char(c)) return false;  // a second '@' too
    return true;
}

// A list member's value: 1 to 256 characters of 0x20-0x7E but ',' and
// '=', the last not a space.
bool valid_value(std::string_view value) {
    if (value.empty() || value.size() > 256 || value.back() == ' ') return false;
    for (const char c : value)
        if (c < 0x20 || c > 0x7E || c == ',' || c == '=') return false;
    return true;
}

}  // namespace

bool valid_traceparent(std::string_view s) {
    if (s.size() != 55) return false;
    if (s[0] != '0' || s[1] != '0' || s[2] != '-' || s[35] != '-' || s[52] != '-') return false;
    return hex_id(s, 3, 32) && hex_id(s, 36, 16) && lower_hex(s[53]) && lower_hex(s[54]);
}

bool valid_tracestate(std::string_view s) {
    if (s.size() > 512) return false;
    for (const char c : s)
        if (c < 0x20 || c > 0x7E) return false;  // tabs too: printable ASCII only
    std::size_t members = 0;
    for (std::size_t from = 0;;) {
        const auto comma = s.find(',', from);
        auto member = s.substr(from, comma == std::string_view::npos ? std::string_view::npos : comma - from);
        if (++members > 32) return false;
        while (!member.empty() && (member.front() == ' ' || member.front() == '\t')) member.remove_prefix(1);
        while (!member.empty() && (member.back() == ' ' || member.back() == '\t')) member.remove_suffix(1);
        if (!member.empty()) {
            const auto eq = member.find('=');
            if (eq == std::string_view::npos || !valid_key(member.substr(0, eq)) ||
                !valid_value(member.substr(eq + 1)))
                return false;
        }
        if (comma == std::string_view::npos) return true;
        from = comma + 1;
    }
}

}  // namespace pg_outbox
