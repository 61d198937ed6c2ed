-- Library, not a script (shared/keys.py prepends it to every script): Redis server time, the one clock of the
-- fleet's scripts (so host clocks do not matter). Each call is a TIME call: a script reads it once and keeps it.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function now_s()
  return tonumber(redis.call('TIME')[1])
end
-- The Redis time (ms) of an entry the script just appended with XADD '*': its id's ms part, the server's clock as
-- TIME would read it (or the stream's last entry's ms, were the clock ever behind it), so a script that appends
-- anyway takes the time from its entry instead of calling TIME.
local function entry_ms(id)
  return tonumber(string.match(id, '^%d+'))
end
