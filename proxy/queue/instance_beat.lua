-- instance_beat.lua - a ferry process's heartbeat (instance.c): while it
-- runs, ferry:alive:<name> holds its token with a TTL, and the name is in
-- the registry peers look through for dead instances.
-- KEYS[1] ferry:alive:<name>, KEYS[2] ferry:instances; ARGV[1] this
-- process's token, ARGV[2] the TTL in ms, ARGV[3] '1' to take the key
-- whoever holds it (a takeover: the two processes are one instance), ARGV[4]
-- the name. Answers {1} refreshed, {2} taken (it was free, expired or
-- handed over), or {0, token}: another live process holds the name.
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] and ARGV[3] ~= '1' then
  return {0, cur}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[4])
if cur == ARGV[1] then
  return {1}
end
return {2}
