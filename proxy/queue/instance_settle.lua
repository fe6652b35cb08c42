#!lua flags=allow-cross-slot-keys
-- instance_settle.lua - settles the receipts a dead ferry process left
-- (instance.c), one SCAN step at a time. A receipt's name says what it
-- needs: ferry:rcpt:[{tag}:]<name>:<process>.<loop>:<n>:<what>:<key>, <what>
-- L or R for a pop (its item taken from that end of <key>), Z a sorted set's
-- pop (members and scores), P a push, T a transaction, S a script (receipts.c).
-- KEYS[1] ferry:alive:<name> (fixed and Sentinel mode; in cluster mode it is
-- on another node: none, ARGV[5] is its token as the caller read it, ''
-- none); ARGV[1] the name, ARGV[2] the SCAN cursor, ARGV[3] its COUNT,
-- ARGV[4] a process whose receipts stay (the caller itself, settling its own
-- name's; '' none), ARGV[6] '1' in cluster mode (receipts after their key's
-- {tag}, each in its slot: the flag lets one step touch several), ARGV[7]
-- the ms a push's receipt is left to live (below). A live process's
-- receipts (the heartbeat's token) stay too. A pop's item goes back to the
-- end it came from, a transaction's or script's receipt is deleted (the
-- write stands), a push's left to expire. Each step is atomic: a receipt is
-- settled once, whoever else tries. Answers {next cursor, receipts deleted, key of
-- each item put back...}.
local alive
if #KEYS > 0 then
  alive = redis.call('GET', KEYS[1])
elseif ARGV[5] ~= '' then
  alive = ARGV[5]
end
local cluster = ARGV[6] == '1'
local name = string.gsub(ARGV[1], '[%.%-]', '%%%0')
local head = cluster and '^ferry:rcpt:{[^}]*}:' or '^ferry:rcpt:'
local match = cluster and ('ferry:rcpt:{*}:' .. ARGV[1] .. ':*') or ('ferry:rcpt:' .. ARGV[1] .. ':*')
local step = redis.call('SCAN', ARGV[2], 'MATCH', match, 'COUNT', ARGV[3])
local out = {step[1], 0}
for _, k in ipairs(step[2]) do
  local proc, what, key = string.match(k, head .. name .. ':([^:.]+)%.%d+:%d+:(%u):(.*)$')
  if proc and proc ~= alive and proc ~= ARGV[4] then
    if what == 'L' or what == 'R' then
      -- Every item (a batch pop's several), the last taken first: each
      -- goes back where it was.
      local side = what == 'L' and 'LEFT' or 'RIGHT'
      local v = redis.pcall('LMOVE', k, key, 'RIGHT', side)
      while type(v) == 'string' do
        out[#out + 1] = key
        v = redis.pcall('LMOVE', k, key, 'RIGHT', side)
      end
    elseif what == 'Z' then
      -- A sorted set's pop: each member back with its score.
      local r = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES')
      for i = 1, #r, 2 do
        redis.call('ZADD', key, r[i + 1], r[i])
        out[#out + 1] = key
      end
      redis.call('DEL', k)
    elseif what == 'P' then
      -- A push's receipt is left to expire: the dead process's fallback
      -- store may hold the push's rows (sent to a master that froze, their
      -- outcome unknown), which its replay pushes only where the receipt is
      -- missing (replay.c); deleted now, they would be pushed twice.
      if redis.call('PTTL', k) < 0 then
        redis.call('PEXPIRE', k, ARGV[7])
        out[2] = out[2] + 1 -- (once: a later settle finds it expiring)
      end
    elseif what == 'T' or what == 'S' then
      redis.call('DEL', k)
      out[2] = out[2] + 1
    end
  end
end
return out
