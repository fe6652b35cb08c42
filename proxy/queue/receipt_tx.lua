#!lua
-- receipt_tx.lua - a transaction (MULTI ... EXEC) with a push of a queue,
-- run as one script that keeps EXEC's reply under a receipt key, so that
-- the same transaction sent again after a failover (its reply lost with the
-- master, its writes on the promoted replica) is answered with the first
-- one's reply instead of running a second time.
-- KEYS[1] the receipt (one per transaction, ferry deletes it once the reply
-- reached the client); ARGV[1] '1' when it was sent before (look first),
-- else '0'; ARGV[2..] the queued commands, each as its number of arguments
-- then its arguments. Only commands whose replies read the same in RESP2
-- and RESP3 and fit a Lua number come here (receipts.c). Each runs as it
-- would in the transaction: an error is its reply, the others still run.
-- The '#!lua' line makes it a write script: refused whole, before it runs,
-- where Redis would refuse EXEC (a replica, no good replicas, no memory).
-- Answers {replies}, or {replies, 1} when the receipt already held them.
if ARGV[1] == '1' then
  local kept = redis.call('GET', KEYS[1])
  if kept then
    return {cmsgpack.unpack(kept), 1}
  end
end
local out, i, last = {}, 2, #ARGV
while i <= last do
  local n = tonumber(ARGV[i])
  out[#out + 1] = redis.pcall(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
redis.call('SET', KEYS[1], cmsgpack.pack(out))
return {out}
