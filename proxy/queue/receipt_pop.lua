-- receipt_pop.lua - a pop that leaves the item it takes under a receipt
-- key, so that the same pop sent again after a failover (its reply lost
-- with the master, the pop itself on the promoted replica) is answered
-- with the item the first one took instead of taking another one.
-- KEYS[1] the list, KEYS[2] the receipt (one per request, ferry deletes it
-- once the reply reached the client); ARGV[1] LEFT or RIGHT: the end the
-- pop takes from. Answers as the pop would (the item, nil, or the error),
-- or {item} when the item is the receipt's (ferry answers the item).
local v = redis.call('LINDEX', KEYS[2], 0)
if v then
  return {v}
end
return redis.pcall('LMOVE', KEYS[1], KEYS[2], ARGV[1], 'LEFT')
