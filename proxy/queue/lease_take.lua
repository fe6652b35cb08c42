-- lease_take.lua - record the lease of an item a client just moved into a
-- processing list (proxy/queue/lease.c), if it is still there: its deadline from
-- Redis' TIME, its attempt count (kept if it has one) and who holds it.
-- KEYS: processing, leases, attempts, consumers (all in the queue's slot)
-- ARGV: item, lease_ms, side (R or L: the end of the queue it came from),
--       consumer
if not redis.call('LPOS', KEYS[1], ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then
  redis.call('HSET', KEYS[3], ARGV[1], '1:' .. ARGV[3])
end
redis.call('HSET', KEYS[4], ARGV[1], ARGV[4])
return 1
