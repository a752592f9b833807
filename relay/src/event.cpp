#include "pg_outbox/event.hpp"

#include <cstdio>
#include <stdexcept>

#include "pg_outbox/trace_context.hpp"

namespace pg_outbox {

namespace {

// Reads a packed batch front to back; every read checks what is left.
class PackReader {
public:
    explicit PackReader(std::string_view bytes) : rest_(bytes) {}

    std::string_view take(std::size_t n, const char* what) {
        if (rest_.size() < n)
            throw std::invalid_argument(std::string("packed batch truncated in ") + what + " (" +
                                        std::to_string(rest_.size()) + " bytes left, " + std::to_string(n) +
                                        " needed)");
        auto out = rest_.substr(0, n);
        rest_.remove_prefix(n);
        return out;
    }

    std::uint64_t uint(std::size_t n, const char* what) {
        std::uint64_t v = 0;
        for (const char c : take(n, what)) v = v << 8 | static_cast<unsigned char>(c);
        return v;
    }

    // A field: its bytes, or none for NULL.
    std::optional<std::string_view> field(const char* what) {
        const auto length = static_cast<std::int32_t>(static_cast<std::uint32_t>(uint(4, what)));
        if (length == -1) return std::nullopt;
        if (length < 0) throw std::invalid_argument(std::string("packed batch: negative length of ") + what);
        return take(static_cast<std::size_t>(length), what);
    }

    std::string_view required(const char* what) {
        auto f = field(what);
        if (!f) throw std::invalid_argument(std::string("packed batch: ") + what + " is NULL");
        return *f;
    }

    bool done() const { return rest_.empty(); }
    std::size_t left() const { return rest_.size(); }

private:
    std::string_view rest_;
};

}  // namespace

PackedBatch unpack_batch(std::string_view bytes) {
    PackedBatch out;
    unpack_batch(bytes, out);
    return out;
}

namespace {

// Sets an optional field, in the string it already holds if any.
void assign_optional(std::optional<std::string>& to, std::optional<std::string_view> from) {
    if (!from)
        to.reset();
    else if (to)
        to->assign(*from);
    else
        to.emplace(*from);
}

}  // namespace

void unpack_batch(std::string_view bytes, PackedBatch& out) {
    PackReader in(bytes);
    if (in.take(4, "the header") != "OBP1") throw std::invalid_argument("packed batch: not in format OBP1");
    const auto count = in.uint(4, "the header");
    const auto age = static_cast<std::int64_t>(in.uint(8, "the header"));
    out.first_age_seconds.reset();
    // Each event takes 28 bytes at least: a count beyond that is a lie.
    if (count > in.left() / 28)
        throw std::invalid_argument("packed batch: " + std::to_string(count) + " events cannot fit in " +
                                    std::to_string(in.left()) + " bytes");
    out.events.resize(count);
    for (auto& e : out.events) {
        e.position.assign(in.required("position"));
        const auto parsed = Position::parse(e.position);
        if (!parsed) throw std::invalid_argument("packed batch: malformed position \"" + e.position + "\"");
        e.parsed = *parsed;
        e.event_id.assign(in.required("event_id"));
        e.topic.assign(in.required("topic"));
        assign_optional(e.key, in.field("key"));
        e.payload.assign(in.required("payload"));
        assign_optional(e.headers, in.field("headers"));
        // Not finite, or outside RFC 3339's years: empty, as to_char()'s
        // NULL was.
        if (auto c = in.field("created_at"))
            e.created_at.assign(*c);
        else
            e.created_at.clear();
    }
    if (!in.done())
        throw std::invalid_argument("packed batch: " + std::to_string(in.left()) + " bytes after the last event");
    if (count > 0 && age >= 0) out.first_age_seconds = static_cast<double>(age) / 1e6;
}

bool is_already_published_error(std::string_view reply_error) {
    // Redis 7: "ERR The ID specified in XADD is equal or smaller than the
    // target stream top item"
    return reply_error.find("equal or smaller than the target stream top item") != std::string_view::npos;
}

std::optional<std::string> ce_source_fault(std::string_view t) {
    if (t.empty()) return std::string("the source must not be empty");
    if (t.size() > 1024)
        return "the source is " + std::to_string(t.size()) + " bytes; at most 1024 are allowed";
    for (std::size_t i = 0; i < t.size(); ++i) {
        const auto c = static_cast<unsigned char>(t[i]);
        if (c < 0x20 || c == 0x7F) return "the source holds a control character (byte " + std::to_string(i + 1) + ")";
        if (c == ' ') return "the source holds a space (byte " + std::to_string(i + 1) + "); percent-encode it as %20";
        if (c > 0x7F) return "the source holds a byte outside ASCII (byte " + std::to_string(i + 1) + "); percent-encode it";
    }
    for (std::size_t i = 0; (i = t.find('{', i)) != std::string_view::npos;) {
        const auto close = t.find('}', i);
        const auto name = t.substr(i, close == std::string_view::npos ? std::string_view::npos : close - i + 1);
        if (name != "{database}" && name != "{group}")
            return "unknown placeholder \"" + std::string(name.substr(0, 64)) +
                   "\"; the source takes {database} and {group}";
        i = close + 1;
    }
    if (t.find('}') != std::string_view::npos) {
        // Every '}' must close a placeholder.
        std::size_t closes = 0, placeholders = 0;
        for (const char c : t) closes += c == '}';
        for (std::size_t i = 0; (i = t.find('{', i)) != std::string_view::npos; ++i) ++placeholders;
        if (closes != placeholders) return std::string("a '}' outside a placeholder; percent-encode it as %7D");
    }
    return std::nullopt;
}

namespace {

void append_percent_encoded(std::string& out, std::string_view s) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
            c == '_' || c == '~') {
            out.push_back(ch);
        } else {
            out.push_back('%');
            out.push_back(kHex[c >> 4]);
            out.push_back(kHex[c & 15]);
        }
    }
}

}  // namespace

std::string expand_ce_source(std::string_view t, std::string_view database, std::string_view group) {
    std::string out;
    for (std::size_t i = 0; i < t.size();) {
        if (t.compare(i, 10, "{database}") == 0) {
            append_percent_encoded(out, database);
            i += 10;
        } else if (t.compare(i, 7, "{group}") == 0) {
            append_percent_encoded(out, group);
            i += 7;
        } else {
            out.push_back(t[i++]);
        }
    }
    return out;
}

namespace {

// The top-level member "name" of an object's members; nullptr when absent.
const JsonMember* member_named(const std::vector<JsonMember>& members, std::string_view name) {
    for (const auto& m : members)
        if (json_string_is(m.name, name)) return &m;
    return nullptr;
}

// A string member's value as a view: into the JSON text when it has no
// escape, else decoded into "decoded". Empty when not a string.
std::string_view string_value(std::string_view token, std::string& decoded) {
    if (token.size() < 2 || token.front() != '"') return {};
    const auto inner = token.substr(1, token.size() - 2);
    if (inner.find('\\') == std::string_view::npos) return inner;
    auto s = json_string(token);
    if (!s) return {};
    decoded = std::move(*s);
    return decoded;
}

}  // namespace

TraceContext trace_context_of(std::string_view headers, std::vector<JsonMember>& scratch, std::string& decoded) {
    TraceContext out;
    if (headers.find("traceparent") == std::string_view::npos) return out;
    if (!json_object_members(headers, scratch)) return out;
    const auto* parent = member_named(scratch, "traceparent");
    if (parent == nullptr) return out;
    // A valid traceparent has no character JSON escapes.
    const auto p = parent->value;
    if (p.size() != 57 || p.front() != '"' || !valid_traceparent(p.substr(1, 55))) return out;
    out.traceparent = p.substr(1, 55);
    if (const auto* state = member_named(scratch, "tracestate")) {
        const auto s = string_value(state->value, decoded);
        if (state->value.size() >= 2 && valid_tracestate(s)) out.tracestate = s;
    }
    return out;
}

EntryFields::EntryFields(EntryFormat format, std::string source) : format_(format) {
    set_source(std::move(source));
}

void EntryFields::set_source(std::string source) {
    source_ = std::move(source);
    source_json_.clear();
    json_append_string(source_json_, source_);
}

std::string& EntryFields::buffer() {
    if (used_ == buffers_.size()) buffers_.emplace_back();
    auto& b = buffers_[used_++];
    b.clear();
    return b;
}

TraceContext EntryFields::trace_of(const Event& e) {
    // Headers without "traceparent" (most) are not read, and take no buffer.
    if (!e.headers || e.headers->find("traceparent") == std::string::npos) return {};
    return trace_context_of(*e.headers, members_, buffer());
}

std::string_view EntryFields::headers_without_trace(std::string_view headers) {
    if (headers.find("trace") == std::string_view::npos) {
        // Nothing to take out; an empty object leaves nothing.
        std::size_t i = 0, j = headers.size();
        while (i < j && (headers[i] == ' ' || headers[i] == '\n' || headers[i] == '\t' || headers[i] == '\r')) ++i;
        while (j > i && (headers[j - 1] == ' ' || headers[j - 1] == '\n' || headers[j - 1] == '\t' ||
                         headers[j - 1] == '\r'))
            --j;
        if (j - i >= 2 && headers[i] == '{' && headers.find_first_not_of(" \t\r\n", i + 1) == j - 1) return {};
        return headers;
    }
    if (!json_object_members(headers, members_)) return headers;  // not an object: as it is
    bool found = false;
    for (const auto& m : members_)
        found = found || json_string_is(m.name, "traceparent") || json_string_is(m.name, "tracestate");
    if (!found) return members_.empty() ? std::string_view() : headers;
    auto& out = buffer();
    out.reserve(headers.size());
    for (const auto& m : members_) {
        if (json_string_is(m.name, "traceparent") || json_string_is(m.name, "tracestate")) continue;
        out += out.empty() ? "{" : ", ";
        out += m.name;
        out += ": ";
        out += m.value;
    }
    if (out.empty()) return {};
    out += '}';
    return out;
}

void EntryFields::append(std::vector<std::string_view>& out, const Event& e) {
    switch (format_) {
        case EntryFormat::plain: return append_plain(out, e);
        case EntryFormat::cloudevents: return append_binary(out, e);
        case EntryFormat::cloudevents_structured: return append_structured(out, e);
    }
}

void EntryFields::append_plain(std::vector<std::string_view>& argv, const Event& e) {
    argv.emplace_back("event_id");
    argv.emplace_back(e.event_id);
    argv.emplace_back("topic");
    argv.emplace_back(e.topic);
    if (e.key) {
        argv.emplace_back("key");
        argv.emplace_back(*e.key);
    }
    argv.emplace_back("payload");
    argv.emplace_back(e.payload);
    if (e.headers) {
        argv.emplace_back("headers");
        argv.emplace_back(*e.headers);
        const auto trace = trace_of(e);
        if (!trace.traceparent.empty()) {
            argv.emplace_back("traceparent");
            argv.emplace_back(trace.traceparent);
        }
        if (!trace.tracestate.empty()) {
            argv.emplace_back("tracestate");
            argv.emplace_back(trace.tracestate);
        }
    }
    argv.emplace_back("position");
    argv.emplace_back(e.position);
    argv.emplace_back("created_at");
    argv.emplace_back(e.created_at);
}

namespace {

// The position as "%020llu-%020llu", which sorts as text as positions do.
void format_sequence(std::string& out, const Position& p) {
    char text[48];
    const int n = std::snprintf(text, sizeof text, "%020llu-%020llu", static_cast<unsigned long long>(p.major),
                                static_cast<unsigned long long>(p.minor));
    out.append(text, static_cast<std::size_t>(n));
}

}  // namespace

void EntryFields::append_binary(std::vector<std::string_view>& argv, const Event& e) {
    argv.emplace_back("ce_specversion");
    argv.emplace_back("1.0");
    argv.emplace_back("ce_id");
    argv.emplace_back(e.event_id);
    argv.emplace_back("ce_source");
    argv.emplace_back(source_);
    argv.emplace_back("ce_type");
    argv.emplace_back(e.topic);
    if (!e.created_at.empty()) {
        argv.emplace_back("ce_time");
        argv.emplace_back(e.created_at);
    }
    if (e.key) {
        argv.emplace_back("ce_subject");
        argv.emplace_back(*e.key);
        argv.emplace_back("ce_partitionkey");
        argv.emplace_back(*e.key);
    }
    auto& sequence = buffer();
    format_sequence(sequence, e.parsed);
    argv.emplace_back("ce_sequence");
    argv.emplace_back(sequence);
    if (e.headers) {
        const auto trace = trace_of(e);
        if (!trace.traceparent.empty()) {
            argv.emplace_back("ce_traceparent");
            argv.emplace_back(trace.traceparent);
        }
        if (!trace.tracestate.empty()) {
            argv.emplace_back("ce_tracestate");
            argv.emplace_back(trace.tracestate);
        }
        if (const auto rest = headers_without_trace(*e.headers); !rest.empty()) {
            argv.emplace_back("ce_pgoutboxheaders");
            argv.emplace_back(rest);
        }
    }
    argv.emplace_back("content-type");
    argv.emplace_back("application/json");
    argv.emplace_back("data");
    argv.emplace_back(e.payload);
}

void EntryFields::append_structured(std::vector<std::string_view>& argv, const Event& e) {
    const auto trace = trace_of(e);
    const std::string_view rest = e.headers ? headers_without_trace(*e.headers) : std::string_view();
    auto& out = buffer();
    out.reserve(160 + source_json_.size() + 2 * e.topic.size() + (e.key ? 2 * e.key->size() : 0) +
                rest.size() + rest.size() / 4 + e.payload.size());
    out += R"({"specversion":"1.0","id":)";
    json_append_string(out, e.event_id);
    out += R"(,"source":)";
    out += source_json_;
    out += R"(,"type":)";
    json_append_string(out, e.topic);
    if (!e.created_at.empty()) {
        out += R"(,"time":)";
        json_append_string(out, e.created_at);
    }
    if (e.key) {
        out += R"(,"subject":)";
        json_append_string(out, *e.key);
        out += R"(,"partitionkey":)";
        json_append_string(out, *e.key);
    }
    out += R"(,"sequence":")";
    format_sequence(out, e.parsed);
    out += '"';
    if (!trace.traceparent.empty()) {
        out += R"(,"traceparent":)";
        json_append_string(out, trace.traceparent);
    }
    if (!trace.tracestate.empty()) {
        out += R"(,"tracestate":)";
        json_append_string(out, trace.tracestate);
    }
    if (!rest.empty()) {
        out += R"(,"pgoutboxheaders":)";
        json_append_string(out, rest);
    }
    out += R"(,"datacontenttype":"application/json","data":)";
    out += e.payload;
    out += '}';
    argv.emplace_back("content-type");
    argv.emplace_back("application/cloudevents+json");
    argv.emplace_back("event");
    argv.emplace_back(out);
}

std::size_t EntryFields::entry_bytes(const Event& e) {
    const std::size_t id_and_prev = e.position.size() + kPrevField.size() + e.position.size();
    const bool trace = e.headers && e.headers->find("trace") != std::string::npos;
    if (format_ != EntryFormat::plain && !trace) {
        // Counted without making the entry (a batch's every event is
        // counted before it is written): the same sizes as append_binary()
        // and append_structured() write, for headers without a trace
        // context. The others are made and measured below.
        constexpr std::size_t kSequence = 41;  // %020llu-%020llu
        const std::string_view rest = e.headers ? headers_without_trace(*e.headers) : std::string_view();
        if (format_ == EntryFormat::cloudevents) {
            std::size_t n = 14 + 3 + 5 + e.event_id.size() + 9 + source_.size() + 7 + e.topic.size() + 11 +
                            kSequence + 12 + 16 + 4 + e.payload.size();
            if (!e.created_at.empty()) n += 7 + e.created_at.size();
            if (e.key) n += 10 + 15 + 2 * e.key->size();
            if (!rest.empty()) n += 18 + rest.size();
            return id_and_prev + n;
        }
        std::size_t n = std::string_view(R"({"specversion":"1.0","id":)").size() + json_string_size(e.event_id) +
                        std::string_view(R"(,"source":)").size() + source_json_.size() +
                        std::string_view(R"(,"type":)").size() + json_string_size(e.topic) +
                        std::string_view(R"(,"sequence":"")").size() + kSequence +
                        std::string_view(R"(,"datacontenttype":"application/json","data":)").size() +
                        e.payload.size() + 1;
        if (!e.created_at.empty()) n += std::string_view(R"(,"time":)").size() + json_string_size(e.created_at);
        if (e.key)
            n += std::string_view(R"(,"subject":)").size() + std::string_view(R"(,"partitionkey":)").size() +
                 2 * json_string_size(*e.key);
        if (!rest.empty()) n += std::string_view(R"(,"pgoutboxheaders":)").size() + json_string_size(rest);
        return id_and_prev + 12 + 28 + 5 + n;  // content-type, its value, event
    }
    thread_local std::vector<std::string_view> fields;
    fields.clear();
    const auto used = used_;
    append(fields, e);
    std::size_t n = 0;
    for (const auto f : fields) n += f.size();
    used_ = used;
    return id_and_prev + n;
}

void append_entry_fields(std::vector<std::string_view>& argv, const Event& e, EntryFields& fields) {
    fields.append(argv, e);
}

std::size_t entry_bytes(const Event& e, EntryFields& fields) { return fields.entry_bytes(e); }

void xadd_argv(std::vector<std::string_view>& argv, std::string_view stream_key, const Event& event,
               std::string_view prev, std::string_view maxlen, EntryFields& fields) {
    argv.clear();
    argv.emplace_back("XADD");
    argv.emplace_back(stream_key);
    if (!maxlen.empty()) {
        argv.emplace_back("MAXLEN");
        argv.emplace_back("~");
        argv.emplace_back(maxlen);
    }
    argv.emplace_back(event.position);
    fields.append(argv, event);
    argv.emplace_back(kPrevField);
    argv.emplace_back(prev);
}

std::vector<std::string_view> append_script_argv(const std::string& sha, const std::string& stream_key,
                                                 const std::vector<const Event*>& events, IdMode id_mode,
                                                 const std::string& maxlen_text, const std::string& expected_last,
                                                 std::vector<std::string>& counts, EntryFields& fields) {
    std::vector<std::string_view> argv;
    argv.reserve(6 + events.size() * 30);
    argv.emplace_back("EVALSHA");
    argv.emplace_back(sha);
    argv.emplace_back("1");
    argv.emplace_back(stream_key);
    argv.emplace_back(maxlen_text);
    argv.emplace_back(expected_last);
    counts.clear();
    counts.reserve(events.size());  // the views below must not move
    for (const Event* e : events) {
        argv.emplace_back(id_mode == IdMode::explicit_position ? std::string_view(e->position) : std::string_view("*"));
        argv.emplace_back(e->event_id);
        const auto count_at = argv.size();
        argv.emplace_back();
        fields.append(argv, *e);
        counts.push_back(std::to_string(argv.size() - count_at - 1));
        argv[count_at] = counts.back();
    }
    return argv;
}

}  // namespace pg_outbox
