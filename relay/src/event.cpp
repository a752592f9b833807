#include "pg_outbox/event.hpp"

#include <stdexcept>

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

void append_entry_fields(std::vector<std::string_view>& argv, const Event& e) {
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
    }
    argv.emplace_back("position");
    argv.emplace_back(e.position);
    argv.emplace_back("created_at");
    argv.emplace_back(e.created_at);
}

std::size_t entry_bytes(const Event& e) {
    std::vector<std::string_view> fields;
    fields.reserve(14);
    append_entry_fields(fields, e);
    std::size_t n = e.position.size();
    for (const auto f : fields) n += f.size();
    return n + kPrevField.size() + e.position.size();
}

void xadd_argv(std::vector<std::string_view>& argv, std::string_view stream_key, const Event& event,
               std::string_view prev, std::string_view maxlen) {
    argv.clear();
    argv.emplace_back("XADD");
    argv.emplace_back(stream_key);
    if (!maxlen.empty()) {
        argv.emplace_back("MAXLEN");
        argv.emplace_back("~");
        argv.emplace_back(maxlen);
    }
    argv.emplace_back(event.position);
    append_entry_fields(argv, event);
    argv.emplace_back(kPrevField);
    argv.emplace_back(prev);
}

std::vector<std::string_view> append_script_argv(const std::string& sha, const std::string& stream_key,
                                                 const std::vector<const Event*>& events, IdMode id_mode,
                                                 const std::string& maxlen_text, const std::string& expected_last,
                                                 std::vector<std::string>& counts) {
    std::vector<std::string_view> argv;
    argv.reserve(6 + events.size() * 18);
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
        const auto count_at = argv.size();
        argv.emplace_back();
        append_entry_fields(argv, *e);
        counts.push_back(std::to_string(argv.size() - count_at - 1));
        argv[count_at] = counts.back();
    }
    return argv;
}

}  // namespace pg_outbox
