-- pg_outbox: appends a stream's share of a batch, in order (see kAppendScript
-- in relay/include/pg_outbox/event.hpp). Embedded in the relay at build time.

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
-- The stream's last id: the "prev" of the next entry written. Read from
-- Redis, not taken from the relay, so that a replay, another relay or a
-- republish after a loss names the entry really before it in the stream.
-- It is the last id generated, so an entry deleted since still counts:
-- a consumer then sees that it is missing.
local last = '0-0'
local info = redis.pcall('XINFO', 'STREAM', KEYS[1])
if type(info) == 'table' and not info.err then
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last = info[i + 1] end
  end
end
if expected ~= '' and less(last, expected) then
  return {0, 0, 'PGOUTBOX_BEHIND ' .. last}
end

-- The event id of an entry's fields, in any of the relay's formats: the
-- default's event_id, a CloudEvent's ce_id (binary content mode), or the
-- id a structured CloudEvent's "event" starts with, as the relay writes it.
local function entry_event_id(f)
  for j = 1, #f, 2 do
    if f[j] == 'event_id' or f[j] == 'ce_id' then return f[j + 1] end
    if f[j] == 'event' then
      local id = string.match(f[j + 1], '^{"specversion":"1%.0","id":"([^"\\]*)"')
      if id then return id end
    end
  end
  return nil
end

-- Redis refused an id as not above the top. It is a replay when the entry
-- with that id is there with the same event id (whatever the format it
-- was written in), or was deleted (trimmed) since; anything else means
-- another writer put higher ids into the stream, and skipping the entry
-- would lose it.
local max_deleted
local function published_before(id, event_id)
  local e = redis.call('XRANGE', KEYS[1], id, id)
  if #e == 1 then
    return entry_event_id(e[1][2]) == event_id
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

local head = {'XADD', KEYS[1]}
if tonumber(maxlen) > 0 then
  head = {'XADD', KEYS[1], 'MAXLEN', '~', maxlen}
end
local written, already = 0, 0
local i = 3
while i <= #ARGV do
  -- id, event id, count, fields...
  local to = i + 2 + tonumber(ARGV[i + 2])
  -- XADD key [MAXLEN ~ n] id fields... prev <last>
  local args = {unpack(head)}
  args[#args + 1] = ARGV[i]
  for j = i + 3, to do args[#args + 1] = ARGV[j] end
  args[#args + 1] = 'prev'
  args[#args + 1] = last
  local r = redis.pcall(unpack(args))
  if type(r) == 'table' and r.err then
    if not string.find(r.err, 'equal or smaller than the target stream top item', 1, true) then
      return {written, already, r.err}
    end
    if not published_before(ARGV[i], ARGV[i + 1]) then
      return {written, already, 'PGOUTBOX_FOREIGN ' .. ARGV[i]}
    end
    already = already + 1
  else
    written = written + 1
    last = r
  end
  i = to + 1
end
return {written, already}
