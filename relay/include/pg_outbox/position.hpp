// Feed positions and stream entry ids: "<major>-<minor>", two unsigned
// 64-bit numbers, ordered as a pair.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pg_outbox {

struct Position {
    std::uint64_t major = 0;
    std::uint64_t minor = 0;

    static std::optional<Position> parse(std::string_view text);
    std::string to_string() const;

    auto operator<=>(const Position&) const = default;
};

}  // namespace pg_outbox
