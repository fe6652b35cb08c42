-- instance_claim.lua - one ferry claims a dead instance's receipts
-- (instance.c): only once its heartbeat has been gone for a while, and only
-- one claimer at a time (the claim key, with a TTL in case the claimer dies
-- too). The while (ARGV[5], half a TTL by Redis' clock, from the first
-- claimer that saw it gone) spares a live ferry whose heartbeat lapsed
-- across a failover, reconnecting: its receipts are live.
-- KEYS[1] ferry:alive:<name>, KEYS[2] ferry:claim:<name>, KEYS[3]
-- ferry:instances, KEYS[4] ferry:gone:<name> (when it was first seen gone);
-- ARGV[1] the claimer's token, ARGV[2] the claim's TTL in ms, ARGV[3] the
-- name, ARGV[4] 'claim' or 'done' (its receipts settled: the name leaves
-- the registry unless it came back meanwhile), ARGV[5] the while in ms.
-- Answers 1 claimed (or forgotten), else 0.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('DEL', KEYS[4])
  return 0
end
if ARGV[4] == 'done' then
  redis.call('SREM', KEYS[3], ARGV[3])
  redis.call('DEL', KEYS[2], KEYS[4])
  return 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = redis.call('GET', KEYS[4])
if not since then
  redis.call('SET', KEYS[4], now, 'PX', tonumber(ARGV[2]))
  return 0
end
if now - tonumber(since) < tonumber(ARGV[5]) then
  return 0
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
