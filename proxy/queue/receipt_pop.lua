-- receipt_pop.lua - a pop that leaves the item(s) it takes under a receipt
-- key, so that the same pop sent again after a failover (its reply lost
-- with the master, the pop itself on the promoted replica) is answered
-- with what the first one took instead of taking more.
-- KEYS[1] the list (or sorted set), KEYS[2] the receipt (one per request,
-- ferry deletes it once the reply reached the client); ARGV[1] LEFT or
-- RIGHT: the end the pop takes from (MIN or MAX: ZPOPMIN, ZPOPMAX, the
-- receipt a sorted set of the members taken, with their scores); ARGV[2] a
-- batch pop's count (RPOP k n, ZPOPMIN k n), '' none. Answers as the pop
-- would (the item or items, member and score pairs, nil, or the error), or
-- {item} / {{items}} when they are the receipt's (ferry answers them).
if ARGV[1] == 'MIN' or ARGV[1] == 'MAX' then
  local have
  if ARGV[1] == 'MIN' then
    have = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  else
    have = redis.call('ZRANGE', KEYS[2], 0, -1, 'REV', 'WITHSCORES')
  end
  if #have > 0 then
    return {have}
  end
  local r
  if ARGV[2] ~= '' then
    r = redis.pcall('ZPOP' .. ARGV[1], KEYS[1], ARGV[2])
  else
    r = redis.pcall('ZPOP' .. ARGV[1], KEYS[1])
  end
  if type(r) == 'table' and r.err == nil and #r > 0 then
    local args = {}
    for i = 1, #r, 2 do
      args[#args + 1] = r[i + 1]
      args[#args + 1] = r[i]
    end
    redis.call('ZADD', KEYS[2], unpack(args))
  end
  return r
end
if ARGV[2] ~= nil and ARGV[2] ~= '' then
  local have = redis.call('LRANGE', KEYS[2], 0, -1)
  if #have > 0 then
    return {have}
  end
  local items = redis.pcall(ARGV[1] == 'LEFT' and 'LPOP' or 'RPOP', KEYS[1], ARGV[2])
  if type(items) == 'table' and items.err == nil and #items > 0 then
    -- In the order taken: put back, the last taken goes first.
    redis.call('RPUSH', KEYS[2], unpack(items))
  end
  return items
end
local v = redis.call('LINDEX', KEYS[2], 0)
if v then
  return {v}
end
return redis.pcall('LMOVE', KEYS[1], KEYS[2], ARGV[1], 'LEFT')
