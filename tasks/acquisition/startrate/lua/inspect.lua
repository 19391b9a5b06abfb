-- inspect: read every rule's state of a bucket; writes nothing, refreshes no TTL.
--
-- KEYS[i]  rule i's hash (see prelude.lua); every key in one hash slot
-- ARGV[1]  packed integers (see prelude.lua): per rule i at A[4i-3 .. 4i]: initial,
--          max, floor, fixed (mpm, 0 = none)
-- ARGV[2]  now_us, tests only; absent in production (Redis TIME)
-- Returns  {server_now_us, then per rule: exists 0|1, effective_rate_mpm,
--          adaptive_rate_mpm, epoch, tat_us, cooldown_until_us}
--          A missing key reads as its fresh state (initial rate, epoch 0, tat 0).
-- Calls    one HMGET per rule.

local A = numbers(ARGV[1], 4 * #KEYS)
local out = {clock(ARGV[2])}
for i = 1, #KEYS do
  local a = 4 * i - 4
  local h = state(KEYS[i])
  local exists = 1
  if h[1] == nil then exists = 0 end
  local r = min(A[a + 2], max(A[a + 3], h[1] or A[a + 1]))  -- clamped (prelude)
  local eff = A[a + 4]
  if eff == 0 then eff = r end
  for _, v in ipairs({exists, eff, r, h[3], h[2], h[4]}) do out[#out + 1] = v end
end
return out
