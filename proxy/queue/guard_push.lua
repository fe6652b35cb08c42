-- guard_push.lua - a push to a bounded queue (queues: max_length), checked
-- and applied in one atomic step: when the values would take the list past
-- its bound, nothing is applied and the caller gets -QFULL.
-- KEYS[1] the list, KEYS[2] (if given) the push's receipt (receipts.c:
-- its reply kept there, so that the push sent again after a failover is
-- answered with it instead of pushing twice); ARGV[1] max_length; ARGV[2]
-- the push (lpush, rpush, lpushx, rpushx); ARGV[3] '1' when it went with
-- its receipt before (look first), '0' first time, '-' no receipt;
-- ARGV[4..] its values, pushed as the one command would.
local key, max, op = KEYS[1], tonumber(ARGV[1]), ARGV[2]
if ARGV[3] == '1' then
  local had = redis.call('GET', KEYS[2])
  if had then
    return {tonumber(had)}
  end
end
local n = redis.pcall('LLEN', key)
if type(n) == 'number' and n + #ARGV - 3 > max and
    not (n == 0 and (op == 'lpushx' or op == 'rpushx')) then
  return redis.error_reply('QFULL ferry: queue ' .. key .. ' holds ' .. n ..
                           ' items (max_length ' .. ARGV[1] .. ')')
end
local r
for i = 4, #ARGV, 1000 do
  r = redis.pcall(op, key, unpack(ARGV, i, math.min(i + 999, #ARGV)))
  if type(r) == 'table' and r.err then
    return r
  end
end
if ARGV[3] ~= '-' then
  redis.call('SET', KEYS[2], r)
end
return r
