#include "pg_outbox/position.hpp"

#include <charconv>

namespace pg_outbox {

std::optional<Position> Position::parse(std::string_view text) {
    auto dash = text.find('-');
    if (dash == std::string_view::npos || dash == 0 || dash + 1 == text.size()) return std::nullopt;
    Position p;
    auto major = text.substr(0, dash);
    auto minor = text.substr(dash + 1);
    auto r1 = std::from_chars(major.data(), major.data() + major.size(), p.major);
    if (r1.ec != std::errc{} || r1.ptr != major.data() + major.size()) return std::nullopt;
    auto r2 = std::from_chars(minor.data(), minor.data() + minor.size(), p.minor);
    if (r2.ec != std::errc{} || r2.ptr != minor.data() + minor.size()) return std::nullopt;
    return p;
}

std::string Position::to_string() const {
    return std::to_string(major) + "-" + std::to_string(minor);
}

}  // namespace pg_outbox
