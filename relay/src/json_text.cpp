// JSON text cut into spans and strings escaped, for stream entry fields
// (see json_text.hpp). The reader checks the grammar only; decoding a
// string with escapes is left to nlohmann-json.
#include "pg_outbox/json_text.hpp"

#include <nlohmann/json.hpp>

namespace pg_outbox {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::size_t skip_space(std::string_view t, std::size_t i) {
    while (i < t.size() && is_space(t[i])) ++i;
    return i;
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// The end of the string token at "i" (a '"'), or npos.
std::size_t string_end(std::string_view t, std::size_t i) {
    for (++i; i < t.size(); ++i) {
        const auto c = static_cast<unsigned char>(t[i]);
        if (c == '"') return i + 1;
        if (c < 0x20) return std::string_view::npos;
        if (c != '\\') continue;
        if (++i >= t.size()) return std::string_view::npos;
        switch (t[i]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                break;
            case 'u':
                if (i + 4 >= t.size() || !is_hex(t[i + 1]) || !is_hex(t[i + 2]) || !is_hex(t[i + 3]) ||
                    !is_hex(t[i + 4]))
                    return std::string_view::npos;
                i += 4;
                break;
            default:
                return std::string_view::npos;
        }
    }
    return std::string_view::npos;
}

// The end of the number at "i", or npos.
std::size_t number_end(std::string_view t, std::size_t i) {
    auto digit = [&](std::size_t k) { return k < t.size() && t[k] >= '0' && t[k] <= '9'; };
    if (i < t.size() && t[i] == '-') ++i;
    if (!digit(i)) return std::string_view::npos;
    if (t[i] == '0')
        ++i;
    else
        while (digit(i)) ++i;
    if (i < t.size() && t[i] == '.') {
        if (!digit(++i)) return std::string_view::npos;
        while (digit(i)) ++i;
    }
    if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
        ++i;
        if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
        if (!digit(i)) return std::string_view::npos;
        while (digit(i)) ++i;
    }
    return i;
}

// The end of an object member's name and its colon, starting at the name's
// opening quote (after any space); npos when they are not there.
std::size_t member_name_end(std::string_view t, std::size_t i) {
    if (i >= t.size() || t[i] != '"') return std::string_view::npos;
    i = string_end(t, i);
    if (i == std::string_view::npos) return i;
    i = skip_space(t, i);
    if (i >= t.size() || t[i] != ':') return std::string_view::npos;
    return i + 1;
}

}  // namespace

std::size_t json_value_end(std::string_view t, std::size_t i) {
    constexpr auto npos = std::string_view::npos;
    // The open arrays ('[') and objects ('{'), innermost last.
    std::string open;
    for (;;) {
        i = skip_space(t, i);
        if (i >= t.size()) return npos;
        // One scalar, or the start of a container.
        const char c = t[i];
        if (c == '{' || c == '[') {
            const auto after = skip_space(t, i + 1);
            if (after < t.size() && t[after] == (c == '{' ? '}' : ']')) {
                i = after + 1;
            } else {
                open.push_back(c);
                i = after;
                if (c == '{') {
                    // A member's name and its colon first.
                    i = member_name_end(t, i);
                    if (i == npos) return npos;
                }
                continue;
            }
        } else if (c == '"') {
            i = string_end(t, i);
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            i = number_end(t, i);
        } else if (t.compare(i, 4, "true") == 0 || t.compare(i, 4, "null") == 0) {
            i += 4;
        } else if (t.compare(i, 5, "false") == 0) {
            i += 5;
        } else {
            return npos;
        }
        if (i == npos) return npos;
        // After a value: the next element or member, or the end of the
        // containers it closes.
        for (;;) {
            if (open.empty()) return i;
            i = skip_space(t, i);
            if (i >= t.size()) return npos;
            const char close = open.back() == '{' ? '}' : ']';
            if (t[i] == close) {
                open.pop_back();
                ++i;
                continue;
            }
            if (t[i] != ',') return npos;
            i = skip_space(t, i + 1);
            if (open.back() == '{') {
                i = member_name_end(t, i);
                if (i == npos) return npos;
            }
            break;
        }
    }
}

bool is_json(std::string_view text) {
    const auto end = json_value_end(text);
    return end != std::string_view::npos && skip_space(text, end) == text.size();
}

bool json_object_members(std::string_view t, std::vector<JsonMember>& out) {
    constexpr auto npos = std::string_view::npos;
    out.clear();
    auto i = skip_space(t, 0);
    if (i >= t.size() || t[i] != '{') return false;
    i = skip_space(t, i + 1);
    if (i < t.size() && t[i] == '}') return skip_space(t, i + 1) == t.size();
    for (;;) {
        if (i >= t.size() || t[i] != '"') return false;
        const auto name_end = string_end(t, i);
        if (name_end == npos) return false;
        const auto name = t.substr(i, name_end - i);
        i = skip_space(t, name_end);
        if (i >= t.size() || t[i] != ':') return false;
        const auto from = skip_space(t, i + 1);
        const auto end = json_value_end(t, from);
        if (end == npos) return false;
        out.push_back({name, t.substr(from, end - from)});
        i = skip_space(t, end);
        if (i >= t.size()) return false;
        if (t[i] == '}') return skip_space(t, i + 1) == t.size();
        if (t[i] != ',') return false;
        i = skip_space(t, i + 1);
    }
}

std::optional<std::string> json_string(std::string_view token) {
    if (token.size() < 2 || token.front() != '"' || string_end(token, 0) != token.size()) return std::nullopt;
    const auto inner = token.substr(1, token.size() - 2);
    if (inner.find('\\') == std::string_view::npos) return std::string(inner);
    try {
        return nlohmann::json::parse(token).get<std::string>();
    } catch (const nlohmann::json::exception&) {
        return std::nullopt;
    }
}

bool json_string_is(std::string_view token, std::string_view text) {
    if (token.size() == text.size() + 2 && token.front() == '"' && token.back() == '"' &&
        token.substr(1, text.size()) == text)
        return true;
    if (token.find('\\') == std::string_view::npos) return false;
    const auto decoded = json_string(token);
    return decoded && *decoded == text;
}

std::size_t json_string_size(std::string_view s) {
    std::size_t n = s.size() + 2;
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        const bool short_escape = c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f';
        n += short_escape ? 1 : 5;
    }
    return n;
}

void json_append_string(std::string& out, std::string_view s) {
    static constexpr char kHex[] = "0123456789abcdef";
    out.push_back('"');
    std::size_t plain = 0;  // start of the run not yet appended
    for (std::size_t i = 0; i < s.size(); ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        out.append(s.substr(plain, i - plain));
        plain = i + 1;
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                out += "\\u00";
                out.push_back(kHex[c >> 4]);
                out.push_back(kHex[c & 15]);
        }
    }
    out.append(s.substr(plain));
    out.push_back('"');
}

}  // namespace pg_outbox
