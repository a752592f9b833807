// JSON text read and written in place: the members of an object as
// spans of the text, a string token decoded, a string escaped. Stream
// entries carry JSON that must reach PostgreSQL byte for byte (a payload's
// numbers have any precision, which a parse into doubles would round), so
// values are cut out of the text rather than parsed and printed again.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pg_outbox {

// A member of a JSON object: its name as the text writes it (the string
// token, quotes included) and its value's text.
struct JsonMember {
    std::string_view name;
    std::string_view value;
};

// Where the JSON value that starts at "at" (after white space) ends, one
// past its last byte; npos when the text there is no value of RFC 8259
// (strings are checked for escapes and control characters, not for
// UTF-8, which PostgreSQL checks). Nesting of any depth, without
// recursion.
std::size_t json_value_end(std::string_view text, std::size_t at = 0);

// Whether "text" is one JSON value and nothing else but white space.
bool is_json(std::string_view text);

// The members of "text" when it is one JSON object (white space around it
// allowed), in order, into "out" (cleared first); false when it is not.
bool json_object_members(std::string_view text, std::vector<JsonMember>& out);

// A string token's content: the bytes between the quotes when it has no
// escape, else decoded (UTF-8; \u escapes of surrogate pairs joined);
// nullopt when the token is no valid JSON string (a lone surrogate, a
// \u0000 is kept as the NUL byte it names).
std::optional<std::string> json_string(std::string_view token);
// Whether the string token holds exactly "text" (no escapes involved when
// the token has none).
bool json_string_is(std::string_view token, std::string_view text);

// The size of "s" as json_append_string() writes it.
std::size_t json_string_size(std::string_view s);

// Appends "s" as a JSON string token: quotes, '"' and '\\' escaped,
// control characters as \u00XX (\n, \t, ... by their short escapes).
void json_append_string(std::string& out, std::string_view s);

}  // namespace pg_outbox
