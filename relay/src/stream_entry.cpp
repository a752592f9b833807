// A stream entry's fields, and what its "prev" field says (see
// stream_entry.hpp).
#include "pg_outbox/stream_entry.hpp"

#include <algorithm>
#include <optional>

#include "pg_outbox/event.hpp"

namespace pg_outbox {

const std::string* StreamEntry::field(std::string_view name) const {
    for (const auto& [k, v] : fields)
        if (k == name) return &v;
    return nullptr;
}

std::size_t StreamEntry::count(std::string_view name) const {
    std::size_t n = 0;
    for (const auto& f : fields) n += f.first == name;
    return n;
}

std::size_t StreamEntry::bytes() const {
    std::size_t n = 0;
    for (const auto& [k, v] : fields) n += k.size() + v.size();
    return n;
}

EntryPrev entry_prev(const StreamEntry& entry) {
    EntryPrev out;
    const std::string* value = entry.field(kPrevField);
    if (value == nullptr) return out;
    out.kind = EntryPrev::Kind::malformed;
    if (const auto n = entry.count(kPrevField); n > 1) {
        out.fault = "field \"prev\" appears " + std::to_string(n) + " times in the entry";
        out.sqlstate = "22023";
        return out;
    }
    // "<u64>-<u64>": at most 41 bytes. Anything else is not quoted (it
    // may be huge or hold any bytes); the dead letter keeps it.
    const auto parsed = value->size() <= 41 ? Position::parse(*value) : std::nullopt;
    if (!parsed || !std::all_of(value->begin(), value->end(), [](char c) { return c == '-' || (c >= '0' && c <= '9'); })) {
        out.fault = "field \"prev\" is not a stream entry id (" + std::to_string(value->size()) + " bytes)";
        out.sqlstate = "22P02";
        return out;
    }
    const auto own = Position::parse(entry.id);
    if (own && !(*parsed < *own)) {
        out.fault = "field \"prev\" names " + parsed->to_string() + ", not an entry before the entry itself";
        out.sqlstate = "22023";
        return out;
    }
    out.kind = EntryPrev::Kind::valid;
    out.prev = *parsed;
    return out;
}

}  // namespace pg_outbox
