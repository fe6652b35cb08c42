-- lease_ack.lua - a client's LREM on a processing list (the ack): the same
-- LREM, and with the item's last copy its lease, attempts and holder go;
-- the consumer's failures are reset (proxy/queue/lease.c).
-- KEYS: processing, leases, attempts, consumers, failures (one slot)
-- ARGV: count, item (the client's LREM), the consumer acking
local n = redis.pcall('LREM', KEYS[1], ARGV[1], ARGV[2])
if type(n) == 'table' then return n end
if n > 0 then
  redis.call('HDEL', KEYS[5], ARGV[3])
  if not redis.call('LPOS', KEYS[1], ARGV[2]) then
    redis.call('ZREM', KEYS[2], ARGV[2])
    redis.call('HDEL', KEYS[3], ARGV[2])
    redis.call('HDEL', KEYS[4], ARGV[2])
  end
end
return n
