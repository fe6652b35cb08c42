-- receipt_mpop.lua - a blocking pop tried at once (BRPOP, BLPOP of several
-- keys: N2's priority pop; BZPOPMIN, BZPOPMAX of one key or more: N3's),
-- the item it takes left under a receipt of its key, so that the same pop
-- sent again after a failover (its reply lost with the master, the pop on
-- the promoted replica) is answered with what the first one took instead
-- of taking more. No command of Redis blocks on several keys, or on a
-- sorted set, and moves into another key: this is the try; when every key
-- is empty ferry sends the blocking pop as written (receipts.c).
-- KEYS[1..n] the lists (sorted sets) in the client's order, KEYS[n+1..2n]
-- their receipts (one per key and request, ferry deletes them once the
-- reply reached the client); ARGV[1] LEFT or RIGHT: the end the pop takes
-- from, or MIN or MAX (a sorted set's: the receipt a sorted set of the
-- member taken, with its score); ARGV[2] '1' when it was sent before (the
-- receipts looked at first), else '0'.
-- Answers as the pop would ({key, item}; {key, member, score}), nil when
-- every key is empty, the error of a key of another type, or the same with
-- a 1 after it when it is the receipt's (ferry answers without the 1).
local n = #KEYS / 2
local zset = ARGV[1] == 'MIN' or ARGV[1] == 'MAX'
if ARGV[2] == '1' then
  for i = 1, n do
    if zset then
      local r = redis.call('ZRANGE', KEYS[n + i], 0, 0, 'WITHSCORES')
      if #r > 0 then
        return {KEYS[i], r[1], r[2], 1}
      end
    else
      local v = redis.call('LINDEX', KEYS[n + i], 0)
      if v then
        return {KEYS[i], v, 1}
      end
    end
  end
end
for i = 1, n do
  if zset then
    local r = redis.pcall('ZPOP' .. ARGV[1], KEYS[i])
    if r.err then
      return r
    end
    if #r > 0 then
      redis.call('ZADD', KEYS[n + i], r[2], r[1])
      return {KEYS[i], r[1], r[2]}
    end
  else
    local v = redis.pcall('LMOVE', KEYS[i], KEYS[n + i], ARGV[1], 'LEFT')
    if type(v) == 'table' then
      return v
    end
    if v then
      return {KEYS[i], v}
    end
  end
end
return nil
