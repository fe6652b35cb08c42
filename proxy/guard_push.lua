-- guard_push.lua - a push to a bounded queue (queues: max_length), checked
-- and applied in one atomic step: when the values would take the list past
-- its bound, nothing is applied and the caller gets -QFULL.
-- KEYS[1] the list; ARGV[1] max_length; ARGV[2] the push (lpush, rpush,
-- lpushx, rpushx); ARGV[3..] its values, pushed as the one command would.
local key, max, op = KEYS[1], tonumber(ARGV[1]), ARGV[2]
local n = redis.pcall('LLEN', key)
if type(n) == 'number' and n + #ARGV - 2 > max and
    not (n == 0 and (op == 'lpushx' or op == 'rpushx')) then
  return redis.error_reply('QFULL ferry: queue ' .. key .. ' holds ' .. n ..
                           ' items (max_length ' .. ARGV[1] .. ')')
end
local r
for i = 3, #ARGV, 1000 do
  r = redis.pcall(op, key, unpack(ARGV, i, math.min(i + 999, #ARGV)))
  if type(r) == 'table' and r.err then
    return r
  end
end
return r
