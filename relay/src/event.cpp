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
    return n;
}

void xadd_argv(std::vector<std::string_view>& argv, std::string_view stream_key, const Event& event,
               std::string_view maxlen) {
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
}

const char* const kAppendScript = R"lua(
-- Compares two ids "<major>-<minor>" of decimal numbers without leading
-- zeros: by length, then as text, so no precision is lost.
local function less(a, b)
  local a1, a2 = string.match(a, '^(%d+)-(%d+)$')
  local b1, b2 = string.match(b, '^(%d+)-(%d+)$')
  if #a1 ~= #b1 then return #a1 < #b1 end
  if a1 ~= b1 then return a1 < b1 end
  if #a2 ~= #b2 then return #a2 < #b2 end
  return a2 < b2
end

local maxlen = ARGV[1]
local expected = ARGV[2]
if expected ~= '' then
  local last = '0-0'
  local info = redis.pcall('XINFO', 'STREAM', KEYS[1])
  if type(info) == 'table' and not info.err then
    for i = 1, #info, 2 do
      if info[i] == 'last-generated-id' then last = info[i + 1] end
    end
  end
  if less(last, expected) then
    return {0, 0, 'PGOUTBOX_BEHIND ' .. last}
  end
end

-- Redis refused an id as not above the top. It is a replay when the entry
-- with that id is there with the same event id, or was deleted (trimmed)
-- since; anything else means another writer put higher ids into the
-- stream, and skipping the entry would lose it.
local max_deleted
local function published_before(id, event_id)
  local e = redis.call('XRANGE', KEYS[1], id, id)
  if #e == 1 then
    local f = e[1][2]
    for j = 1, #f, 2 do
      if f[j] == 'event_id' then return f[j + 1] == event_id end
    end
    return false
  end
  if not max_deleted then
    max_deleted = '0-0'
    local info = redis.call('XINFO', 'STREAM', KEYS[1])
    for j = 1, #info, 2 do
      if info[j] == 'max-deleted-entry-id' then max_deleted = info[j + 1] end
    end
  end
  return not less(max_deleted, id)
end

local trim = tonumber(maxlen) > 0
local written, already = 0, 0
local i = 3
while i <= #ARGV do
  local last = i + 1 + tonumber(ARGV[i + 1])
  local r
  if trim then
    r = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', maxlen, ARGV[i], unpack(ARGV, i + 2, last))
  else
    r = redis.pcall('XADD', KEYS[1], ARGV[i], unpack(ARGV, i + 2, last))
  end
  if type(r) == 'table' and r.err then
    if not string.find(r.err, 'equal or smaller than the target stream top item', 1, true) then
      return {written, already, r.err}
    end
    -- the fields start with event_id and its value
    if not published_before(ARGV[i], ARGV[i + 3]) then
      return {written, already, 'PGOUTBOX_FOREIGN ' .. ARGV[i]}
    end
    already = already + 1
  else
    written = written + 1
  end
  i = last + 1
end
return {written, already}
)lua";

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
