-- receipt_mpop.lua - a pop of several keys (BRPOP k1 k2 ..., BLPOP: N2's
-- priority pop) tried at once, the item it takes left under a receipt of
-- its key, so that the same pop sent again after a failover (its reply
-- lost with the master, the pop on the promoted replica) is answered with
-- what the first one took instead of taking more. No command of Redis
-- blocks on several keys and moves into another: this is the try; when
-- every key is empty ferry sends the blocking pop as written (receipts.c).
-- KEYS[1..n] the lists in the client's order, KEYS[n+1..2n] their receipts
-- (one per key and request, ferry deletes them once the reply reached the
-- client); ARGV[1] LEFT or RIGHT: the end the pop takes from; ARGV[2] '1'
-- when it was sent before (the receipts looked at first), else '0'.
-- Answers {key, item} as the pop would, nil when every key is empty, the
-- error of a key of another type (as the pop would give it), or {key,
-- item, 1} when the item is the receipt's (ferry answers {key, item}).
local n = #KEYS / 2
if ARGV[2] == '1' then
  for i = 1, n do
    local v = redis.call('LINDEX', KEYS[n + i], 0)
    if v then
      return {KEYS[i], v, 1}
    end
  end
end
for i = 1, n do
  local v = redis.pcall('LMOVE', KEYS[i], KEYS[n + i], ARGV[1], 'LEFT')
  if type(v) == 'table' then
    return v
  end
  if v then
    return {KEYS[i], v}
  end
end
return nil
