-- A run is about to store result objects under these keys: journal them first, due for deletion after the grace
-- period. finish.lua pushes the due time of a succeeded request's keys to its expiry; keys of a run that never
-- finished (killed after writing, or fenced off as a late writer) fall due and the sweeper deletes their objects.
-- KEYS[1] results journal (zset: key -> due time, Redis server ms). ARGV[1] grace (ms), ARGV[2..] result keys.
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], due, ARGV[i]) end
return #ARGV - 1
