-- inspect: read every rule's state of a bucket; writes nothing, refreshes no TTL.
--
-- KEYS[i]  rule i's hash (see prelude.lua); every key in one hash slot
-- ARGV[1]  now_us: "" in production (Redis TIME); an integer only in tests
-- ARGV[4i-2 .. 4i+1]  rule i: initial, max, floor, fixed (mpm, 0 = none)
-- Returns  {server_now_us, then per rule: exists 0|1, effective_rate_mpm,
--          adaptive_rate_mpm, epoch, tat_us, cooldown_until_us}
--          A missing key reads as its fresh state (initial rate, epoch 0, tat 0).
-- Calls    one HMGET per rule.

local out = {clock(ARGV[1])}
for i = 1, #KEYS do
  local a = 4 * i - 2
  local r, t, e, c = state(KEYS[i])
  local exists = 1
  if r == nil then exists = 0 end
  r = math.min(tonumber(ARGV[a + 1]), math.max(tonumber(ARGV[a + 2]), r or tonumber(ARGV[a])))
  local eff = tonumber(ARGV[a + 3])
  if eff == 0 then eff = r end
  for _, v in ipairs({exists, eff, r, e, t, c}) do out[#out + 1] = v end
end
return out
