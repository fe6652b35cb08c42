-- instance_settle.lua - settles the receipts a dead ferry process left
-- (instance.c), one SCAN step at a time. A receipt's name says what it
-- needs: ferry:rcpt:<name>:<process>.<loop>:<n>:<what>:<key>, <what> L or R
-- for a pop (its item taken from that end of <key>), P a push, T a
-- transaction (receipts.c).
-- KEYS[1] ferry:alive:<name>; ARGV[1] the name, ARGV[2] the SCAN cursor,
-- ARGV[3] its COUNT, ARGV[4] a process whose receipts stay (the caller
-- itself, settling its own name's; '' none). A live process's receipts (the
-- heartbeat's token) stay too. A pop's item goes back to the end it came
-- from, a push's or transaction's receipt is deleted (the write stands).
-- Each step is atomic: a receipt is settled once, whoever else tries.
-- Answers {next cursor, receipts deleted, key of each item put back...}.
local alive = redis.call('GET', KEYS[1])
local prefix = 'ferry:rcpt:' .. ARGV[1] .. ':'
local step = redis.call('SCAN', ARGV[2], 'MATCH', prefix .. '*', 'COUNT', ARGV[3])
local out = {step[1], 0}
for _, k in ipairs(step[2]) do
  local proc, what, key = string.match(string.sub(k, #prefix + 1),
                                       '^([^:.]+)%.%d+:%d+:(%u):(.*)$')
  if proc and proc ~= alive and proc ~= ARGV[4] then
    if what == 'L' or what == 'R' then
      local v = redis.pcall('LMOVE', k, key, 'LEFT', what == 'L' and 'LEFT' or 'RIGHT')
      if type(v) == 'string' then
        out[#out + 1] = key
      end
    elseif what == 'P' or what == 'T' then
      redis.call('DEL', k)
      out[2] = out[2] + 1
    end
  end
end
return out
