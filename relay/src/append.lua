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
