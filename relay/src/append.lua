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

local head = {'XADD', KEYS[1]}
if tonumber(maxlen) > 0 then
  head = {'XADD', KEYS[1], 'MAXLEN', '~', maxlen}
end
local written, already = 0, 0
local i = 3
while i <= #ARGV do
  local to = i + 1 + tonumber(ARGV[i + 1])
  -- XADD key [MAXLEN ~ n] id fields... prev <last>
  local args = {unpack(head)}
  args[#args + 1] = ARGV[i]
  for j = i + 2, to do args[#args + 1] = ARGV[j] end
  args[#args + 1] = 'prev'
  args[#args + 1] = last
  local r = redis.pcall(unpack(args))
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
    last = r
  end
  i = to + 1
end
return {written, already}
