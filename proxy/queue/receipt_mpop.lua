-- receipt_mpop.lua - a pop of several keys (BRPOP, BLPOP of several keys:
-- N2's priority pop; BZPOPMIN, BZPOPMAX of one key or more: N3's; LMPOP,
-- ZMPOP and their blocking forms, tried at once), the items it takes left
-- under a receipt of their key, so that the same pop sent again after a
-- failover (its reply lost with the master, the pop on the promoted
-- replica) is answered with what the first one took instead of taking
-- more. No command of Redis blocks on several keys, or on a sorted set,
-- and moves into another key: this is the try; when every key is empty
-- ferry sends a blocking pop as written (receipts.c).
-- KEYS[1..n] the lists (sorted sets) in the client's order, KEYS[n+1..2n]
-- their receipts (one per key and request, ferry deletes them once the
-- reply reached the client); ARGV[1] LEFT or RIGHT: the end the pop takes
-- from, or MIN or MAX (a sorted set's: the receipt a sorted set of the
-- members taken, with their scores); ARGV[2] '1' when it was sent before
-- (the receipts looked at first), else '0'; ARGV[3] LMPOP's or ZMPOP's
-- count, '' one; ARGV[4] '1' for LMPOP's and ZMPOP's shape, else '0'.
-- Answers as the pop would ({key, item}; {key, member, score}; {key,
-- {items}}; {key, {{member, score}...}}), nil when every key is empty, the
-- error of a key of another type, or the same with a 1 after it when it is
-- the receipt's (ferry answers without the 1). A list's receipt holds its
-- items in the order taken (a batch pop's: the last goes back first).
local n = #KEYS / 2
local zset = ARGV[1] == 'MIN' or ARGV[1] == 'MAX'
local shaped = ARGV[4] == '1'
local count = ARGV[3] ~= nil and ARGV[3] ~= '' and ARGV[3] or '1'

-- {{member, score}...} of ZRANGE's flat pairs
local function pairs_of(r)
  local out = {}
  for j = 1, #r, 2 do
    out[#out + 1] = {r[j], r[j + 1]}
  end
  return out
end

if ARGV[2] == '1' then
  for i = 1, n do
    if zset then
      local r
      if ARGV[1] == 'MIN' then
        r = redis.call('ZRANGE', KEYS[n + i], 0, -1, 'WITHSCORES')
      else
        r = redis.call('ZRANGE', KEYS[n + i], 0, -1, 'REV', 'WITHSCORES')
      end
      if #r > 0 then
        if shaped then
          return {KEYS[i], pairs_of(r), 1}
        end
        return {KEYS[i], r[1], r[2], 1}
      end
    else
      local v = redis.call('LRANGE', KEYS[n + i], 0, -1)
      if #v > 0 then
        if shaped then
          return {KEYS[i], v, 1}
        end
        return {KEYS[i], v[1], 1}
      end
    end
  end
end
for i = 1, n do
  if zset then
    local r = redis.pcall('ZPOP' .. ARGV[1], KEYS[i], count)
    if r.err then
      return r
    end
    if #r > 0 then
      for j = 1, #r, 2 do
        redis.call('ZADD', KEYS[n + i], r[j + 1], r[j])
      end
      if shaped then
        return {KEYS[i], pairs_of(r)}
      end
      return {KEYS[i], r[1], r[2]}
    end
  else
    local v = redis.pcall(ARGV[1] == 'LEFT' and 'LPOP' or 'RPOP', KEYS[i], count)
    if type(v) == 'table' and v.err then
      return v
    end
    if v then
      redis.call('RPUSH', KEYS[n + i], unpack(v))
      if shaped then
        return {KEYS[i], v}
      end
      return {KEYS[i], v[1]}
    end
  end
end
return nil
