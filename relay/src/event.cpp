#include "pg_outbox/event.hpp"

namespace pg_outbox {

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
