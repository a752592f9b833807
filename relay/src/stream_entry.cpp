// A stream entry's fields, and what its "prev" field says (see
// stream_entry.hpp).
#include "pg_outbox/stream_entry.hpp"

#include <algorithm>
#include <cctype>
#include <optional>

#include "pg_outbox/event.hpp"
#include "pg_outbox/json_text.hpp"
#include "pg_outbox/trace_context.hpp"

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

namespace {

using Fault = std::pair<std::string, std::string>;

Fault malformed(std::string why, const char* sqlstate) { return {std::move(why), sqlstate}; }

// A media type of JSON: application/json or any type ending in +json,
// parameters (after ';') and case ignored.
bool is_json_media_type(std::string_view type) {
    type = type.substr(0, type.find(';'));
    while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
    while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
    std::string lower(type);
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return lower == "application/json" || (lower.size() > 5 && lower.compare(lower.size() - 5, 5, "+json") == 0);
}

// A value shown in a reason: its first 64 bytes, control characters
// escaped.
std::string shown(std::string_view value) {
    std::string out;
    for (const char ch : value.substr(0, 64)) {
        const auto c = static_cast<unsigned char>(ch);
        if (c < 0x20 || c == 0x7F || c == '"' || c == '\\') {
            static constexpr char kHex[] = "0123456789abcdef";
            out += "\\x";
            out.push_back(kHex[c >> 4]);
            out.push_back(kHex[c & 15]);
        } else {
            out.push_back(ch);
        }
    }
    if (value.size() > 64) out += "...";
    return "\"" + out + "\"";
}

// Headers with a trace context added: "base" (a JSON object's text, or
// empty for none) with the members appended, where jsonb keeps them over
// members of the same name before them.
std::string headers_with_trace(std::string_view base, std::string_view traceparent, std::string_view tracestate,
                               bool add_tracestate) {
    std::string out;
    if (base.empty()) {
        out = "{";
    } else {
        const auto close = base.find_last_of('}');
        out.assign(base.substr(0, close));
        // An object with members takes a comma before the new ones.
        const auto last = out.find_last_not_of(" \t\r\n");
        if (last != std::string::npos && out[last] != '{') out += ", ";
    }
    out += "\"traceparent\": ";
    json_append_string(out, traceparent);
    if (add_tracestate && !tracestate.empty()) {
        out += ", \"tracestate\": ";
        json_append_string(out, tracestate);
    }
    out += '}';
    return out;
}

// The canonical fields of a CloudEvent read from an entry: id, type, key,
// data, the headers' object, the trace context.
struct CloudEvent {
    std::string id, type, data;
    std::optional<std::string> key, headers;
    std::string traceparent, tracestate;
};

// The trace context of a CloudEvent's attributes: kept when valid.
void take_trace(CloudEvent& ce, const std::optional<std::string>& parent, const std::optional<std::string>& state) {
    if (!parent || !valid_traceparent(*parent)) return;
    ce.traceparent = *parent;
    if (state && valid_tracestate(*state)) ce.tracestate = *state;
}

// The pgoutboxheaders attribute: the text of a JSON object.
std::optional<Fault> take_headers(CloudEvent& ce, std::string_view text, const char* where) {
    std::vector<JsonMember> members;
    if (!json_object_members(text, members))
        return is_json(text) ? malformed(std::string(where) + " is not a JSON object", "22023")
                             : malformed(std::string(where) + " is not valid JSON", "22P02");
    ce.headers = std::string(text);
    return std::nullopt;
}

std::optional<Fault> read_binary(const StreamEntry& entry, CloudEvent& ce) {
    for (const char* name : {"ce_specversion", "ce_id", "ce_type", "ce_subject", "ce_partitionkey", "ce_traceparent",
                             "ce_tracestate", "ce_pgoutboxheaders", "content-type", "data"})
        if (const auto n = entry.count(name); n > 1)
            return malformed("CloudEvent: field \"" + std::string(name) + "\" appears " + std::to_string(n) +
                                 " times in the entry",
                             "22023");
    const auto* version = entry.field("ce_specversion");
    if (*version != "1.0")
        return malformed("CloudEvent: ce_specversion is " + shown(*version) + "; the consumer reads version 1.0",
                         "22023");
    const auto* id = entry.field("ce_id");
    const auto* type = entry.field("ce_type");
    const auto* data = entry.field("data");
    if (id == nullptr) return malformed("CloudEvent: the entry has no field \"ce_id\"", "22023");
    if (type == nullptr) return malformed("CloudEvent: the entry has no field \"ce_type\"", "22023");
    if (data == nullptr) return malformed("CloudEvent: the entry has no field \"data\"", "22023");
    if (const auto* content_type = entry.field("content-type"); content_type && !is_json_media_type(*content_type))
        return malformed("CloudEvent: content-type " + shown(*content_type) +
                             " is not JSON; the consumer applies JSON data only",
                         "0A000");
    ce.id = *id;
    ce.type = *type;
    ce.data = *data;
    if (const auto* k = entry.field("ce_partitionkey"))
        ce.key = *k;
    else if (const auto* subject = entry.field("ce_subject"))
        ce.key = *subject;
    if (const auto* h = entry.field("ce_pgoutboxheaders"))
        if (auto fault = take_headers(ce, *h, "CloudEvent: ce_pgoutboxheaders")) return fault;
    std::optional<std::string> parent, state;
    if (const auto* p = entry.field("ce_traceparent")) parent = *p;
    if (const auto* t = entry.field("ce_tracestate")) state = *t;
    take_trace(ce, parent, state);
    return std::nullopt;
}

std::optional<Fault> read_structured(std::string_view event, CloudEvent& ce) {
    std::vector<JsonMember> members;
    if (!json_object_members(event, members))
        return is_json(event) ? malformed("CloudEvent: field \"event\" is not a JSON object", "22023")
                              : malformed("CloudEvent: field \"event\" is not valid JSON", "22P02");
    std::vector<std::string> names;
    names.reserve(members.size());
    for (const auto& m : members) {
        auto name = json_string(m.name);
        if (!name) return malformed("CloudEvent: an attribute's name is not a valid JSON string", "22P02");
        if (std::find(names.begin(), names.end(), *name) != names.end())
            return malformed("CloudEvent: attribute " + shown(*name) + " appears twice", "22023");
        names.push_back(std::move(*name));
    }
    auto find = [&](std::string_view name) -> const JsonMember* {
        for (std::size_t i = 0; i < names.size(); ++i)
            if (names[i] == name) return &members[i];
        return nullptr;
    };
    // A string attribute: nullopt when absent; a fault when not a string.
    std::optional<Fault> fault;
    auto string_attribute = [&](std::string_view name) -> std::optional<std::string> {
        const auto* m = find(name);
        if (m == nullptr || fault) return std::nullopt;
        if (m->value.empty() || m->value.front() != '"') {
            fault = malformed("CloudEvent: attribute \"" + std::string(name) + "\" is not a string", "22023");
            return std::nullopt;
        }
        auto s = json_string(m->value);
        if (!s) fault = malformed("CloudEvent: attribute \"" + std::string(name) + "\" is not a valid JSON string",
                                  "22P02");
        return s;
    };
    const auto version = string_attribute("specversion");
    if (fault) return fault;
    if (!version) return malformed("CloudEvent: the event has no specversion", "22023");
    if (*version != "1.0")
        return malformed("CloudEvent: specversion is " + shown(*version) + "; the consumer reads version 1.0", "22023");
    if (find("data_base64") != nullptr)
        return malformed("CloudEvent: data_base64 (binary data) is not supported; the consumer applies JSON data only",
                         "0A000");
    auto id = string_attribute("id");
    auto type = string_attribute("type");
    const auto content_type = string_attribute("datacontenttype");
    auto partition_key = string_attribute("partitionkey");
    auto subject = string_attribute("subject");
    auto headers = string_attribute("pgoutboxheaders");
    const auto parent = string_attribute("traceparent");
    const auto state = string_attribute("tracestate");
    if (fault) {
        // A trace context of the wrong type is only not taken.
        const bool trace_only = fault->first.find("\"traceparent\"") != std::string::npos ||
                                fault->first.find("\"tracestate\"") != std::string::npos;
        if (!trace_only) return fault;
    }
    if (!id) return malformed("CloudEvent: the event has no id", "22023");
    if (!type) return malformed("CloudEvent: the event has no type", "22023");
    const auto* data = find("data");
    if (data == nullptr) return malformed("CloudEvent: the event has no data", "22023");
    if (content_type && !is_json_media_type(*content_type))
        return malformed("CloudEvent: datacontenttype " + shown(*content_type) +
                             " is not JSON; the consumer applies JSON data only",
                         "0A000");
    ce.id = std::move(*id);
    ce.type = std::move(*type);
    ce.data = std::string(data->value);
    if (partition_key)
        ce.key = std::move(partition_key);
    else if (subject)
        ce.key = std::move(subject);
    if (headers)
        if (auto f = take_headers(ce, *headers, "CloudEvent: pgoutboxheaders")) return f;
    take_trace(ce, parent, state);
    return std::nullopt;
}

// The trace context of another writer's "traceparent" field, added to a
// default-format entry's headers when they lack one.
void merge_trace_field(StreamEntry& entry) {
    const auto* parent = entry.field("traceparent");
    if (parent == nullptr || !valid_traceparent(*parent) || entry.count("headers") > 1) return;
    const auto* state = entry.field("tracestate");
    const std::string tracestate = state && valid_tracestate(*state) ? *state : std::string();
    for (auto& [name, value] : entry.fields) {
        if (name != "headers") continue;
        std::vector<JsonMember> members;
        if (value.find("traceparent") == std::string::npos) {
            if (!json_object_members(value, members)) return;  // the server finds it malformed
        } else {
            if (!json_object_members(value, members)) return;
            for (const auto& m : members)
                if (json_string_is(m.name, "traceparent")) return;  // theirs is kept
        }
        bool has_state = false;
        for (const auto& m : members) has_state = has_state || json_string_is(m.name, "tracestate");
        value = headers_with_trace(value, *parent, tracestate, !has_state);
        return;
    }
    entry.fields.emplace_back("headers", headers_with_trace({}, *parent, tracestate, true));
}

}  // namespace

void read_entry_format(StreamEntry& entry) {
    const bool binary = entry.field("ce_specversion") != nullptr;
    const std::string* event = binary ? nullptr : entry.field("event");
    const std::string* content_type = entry.field("content-type");
    const bool structured = event != nullptr && content_type != nullptr &&
                            is_json_media_type(*content_type) &&
                            content_type->substr(0, content_type->find(';')).find("cloudevents") != std::string::npos;
    if (!binary && !structured) {
        merge_trace_field(entry);
        return;
    }
    CloudEvent ce;
    std::optional<Fault> fault;
    if (binary) {
        fault = read_binary(entry, ce);
    } else if (const auto n = entry.count("event"); n > 1) {
        fault = malformed("CloudEvent: field \"event\" appears " + std::to_string(n) + " times in the entry", "22023");
    } else {
        fault = read_structured(*event, ce);
    }
    if (fault) {
        entry.format_fault = std::move(fault);
        return;
    }
    std::vector<std::pair<std::string, std::string>> fields;
    fields.reserve(entry.fields.size() + 6);
    fields.emplace_back("event_id", std::move(ce.id));
    fields.emplace_back("topic", std::move(ce.type));
    if (ce.key) fields.emplace_back("key", std::move(*ce.key));
    fields.emplace_back("payload", std::move(ce.data));
    if (!ce.traceparent.empty())
        fields.emplace_back("headers", headers_with_trace(ce.headers ? *ce.headers : std::string(), ce.traceparent,
                                                          ce.tracestate, true));
    else if (ce.headers)
        fields.emplace_back("headers", std::move(*ce.headers));
    for (const auto& f : entry.fields)
        if (f.first == kPrevField) fields.push_back(f);
    for (auto& f : entry.fields) {
        const auto& name = f.first;
        if (name == kPrevField || name == "data" || name == "event" || name == "event_id" || name == "topic" ||
            name == "key" || name == "payload" || name == "headers")
            continue;
        fields.push_back(std::move(f));
    }
    entry.fields = std::move(fields);
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
