-- Library, not a script (shared/keys.py prepends it to every script): Redis server time, the one clock of the
-- fleet's scripts (so host clocks do not matter). Each call is a TIME call: a script reads it once and keeps it.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function now_s()
  return tonumber(redis.call('TIME')[1])
end
