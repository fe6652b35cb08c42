-- lease_expire.lua - expire leases (proxy/queue/lease.c): items back at the end
-- of their queue with their attempt count raised, or past max_attempts to
-- the dead letter; each lease once, as the lease goes in the same step.
-- KEYS: processing, leases, attempts, queue, dead letter, lock, consumers,
--       failures (all in the queue's slot)
-- ARGV: owner, lock ttl ms, batch, max_attempts, lease_ms, after_failures
--       (0: no back-off), pause_ms, and for a client that hung up: its
--       consumer name and the items it took (ARGV[9...]).
-- A round (ARGV[8] empty) takes the lock and expires what is past its
-- deadline, then leases items found without one; for a client that hung
-- up, exactly its items whose lease is still there and still its own are
-- expired now (no lock: the lease itself makes it once).
-- Returns {back, dead, orphans, open, then for each consumer to pause: its
-- name and when its pause ends (ms, Redis' TIME)}, or {-1, 0, 0, 0} when
-- another ferry holds the lock.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local batch = tonumber(ARGV[3])
local gone = ARGV[8] ~= nil and ARGV[8] ~= ''
local due = {}
if gone then
  for i = 9, #ARGV do
    if redis.call('ZSCORE', KEYS[2], ARGV[i]) and
        redis.call('HGET', KEYS[7], ARGV[i]) == ARGV[8] then
      due[#due + 1] = ARGV[i]
    end
  end
else
  local owner = redis.call('GET', KEYS[6])
  if owner and owner ~= ARGV[1] then return {-1, 0, 0, 0} end
  redis.call('SET', KEYS[6], ARGV[1], 'PX', ARGV[2])
  due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, batch)
end
local back, dead, orphans, paused = 0, 0, 0, {}
for _, item in ipairs(due) do
  redis.call('ZREM', KEYS[2], item)
  local c = redis.call('HGET', KEYS[7], item)
  redis.call('HDEL', KEYS[7], item)
  if redis.call('LREM', KEYS[1], -1, item) > 0 then
    if c and tonumber(ARGV[6]) > 0 and
        redis.call('HINCRBY', KEYS[8], c, 1) >= tonumber(ARGV[6]) then
      redis.call('HDEL', KEYS[8], c)
      paused[#paused + 1] = c
      paused[#paused + 1] = tostring(now + tonumber(ARGV[7]))
    end
    local v = redis.call('HGET', KEYS[3], item) or '1:R'
    local a, side = string.match(v, '^(%d+):(%a)$')
    a = (tonumber(a) or 1) + 1
    if a > tonumber(ARGV[4]) then
      redis.call('LPUSH', KEYS[5], item)
      redis.call('HDEL', KEYS[3], item)
      dead = dead + 1
    else
      redis.call('HSET', KEYS[3], item, a .. ':' .. (side or 'R'))
      if side == 'L' then redis.call('LPUSH', KEYS[4], item)
      else redis.call('RPUSH', KEYS[4], item) end
      back = back + 1
    end
  else
    redis.call('HDEL', KEYS[3], item)
  end
end
if not gone then
  for _, item in ipairs(redis.call('LRANGE', KEYS[1], 0, batch - 1)) do
    if not redis.call('ZSCORE', KEYS[2], item) then
      -- No attempts written: a lease script that arrives just after (the
      -- move's own) still records the end of the queue it came from; an
      -- item without attempts counts as 1 taken from the right.
      redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), item)
      orphans = orphans + 1
    end
  end
end
local out = {back, dead, orphans, redis.call('ZCARD', KEYS[2])}
for _, c in ipairs(paused) do out[#out + 1] = c end
return out
