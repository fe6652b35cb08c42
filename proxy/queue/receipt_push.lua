-- receipt_push.lua - a push that leaves its reply under a receipt key, so
-- that the same push sent again after a failover (its reply lost with the
-- master, the push itself on the promoted replica) is answered with the
-- first one's reply instead of pushing a second time.
-- KEYS[1] the list (or stream), KEYS[2] the receipt (one per request,
-- ferry deletes it once the reply reached the client); ARGV[1] the push
-- (lpush, rpush, lpushx, rpushx or xadd); ARGV[2] '1' when it was sent
-- before (look first), else '0'; ARGV[3..] its values (xadd: every
-- argument after the key). Answers as the push would (the list's length,
-- the entry's id, or the error), or {reply} when the receipt already held
-- it (ferry answers the reply).
local xadd = ARGV[1] == 'xadd'
local n
if ARGV[2] == '1' then
  n = redis.call('GET', KEYS[2])
  if n then
    if xadd then
      return {n}
    end
    return {tonumber(n)}
  end
end
if xadd then
  n = redis.pcall('XADD', KEYS[1], unpack(ARGV, 3))
  if type(n) == 'table' then
    return n
  end
else
  local i, last = 3, #ARGV
  repeat
    -- In pieces: unpack has a limit; pushing values in turn is the push.
    local j = math.min(i + 999, last)
    n = redis.pcall(ARGV[1], KEYS[1], unpack(ARGV, i, j))
    if type(n) == 'table' then
      return n
    end
    i = j + 1
  until i > last
end
redis.call('SET', KEYS[2], n)
return n
