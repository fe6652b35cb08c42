-- instance_claim.lua - one ferry claims a dead instance's receipts
-- (instance.c): only while its heartbeat is gone, and only one claimer at a
-- time (the claim key, with a TTL in case the claimer dies too).
-- KEYS[1] ferry:alive:<name>, KEYS[2] ferry:claim:<name>, KEYS[3]
-- ferry:instances; ARGV[1] the claimer's token, ARGV[2] the claim's TTL in
-- ms, ARGV[3] the name, ARGV[4] 'claim' or 'done' (its receipts settled:
-- the name leaves the registry unless it came back meanwhile). Answers 1
-- claimed (or forgotten), else 0.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if ARGV[4] == 'done' then
  redis.call('SREM', KEYS[3], ARGV[3])
  redis.call('DEL', KEYS[2])
  return 1
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
