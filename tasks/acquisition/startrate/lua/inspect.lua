-- inspect: read every rule's state of a bucket; writes nothing, refreshes no TTL.
--
-- KEYS[i]  one hash per rule, all in one hash slot: playrun:startrate:{<bucket>}:rule:<name>
--          (fields as in acquire.lua: r rate mpm, t TAT us, e epoch, c cooldown end us)
-- ARGV[1]  now_us override: "" in production (Redis TIME); an integer only in tests
-- ARGV[2+6*(i-1) ..]  rule i: initial, max, floor, increase (mpm), decrease (ppm),
--          fixed (mpm, 0 = none)
-- Reply    {server_now_us, then per rule: exists 0|1, effective_rate_mpm,
--          adaptive_rate_mpm, epoch, tat_us, cooldown_until_us}
--          A missing key reads as its fresh state (initial rate, epoch 0, tat 0).

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local out = {now}
for i = 1, #KEYS do
  local b = 1 + 6 * (i - 1)
  local initial, max, floor = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local fixed = tonumber(ARGV[b + 6])
  local h = redis.call('HMGET', KEYS[i], 'r', 't', 'e', 'c')
  local exists, r, t, e, c = 0, initial, 0, 0, 0
  if h[1] then
    exists, r, t, e, c = 1, tonumber(h[1]), tonumber(h[2]), tonumber(h[3]), tonumber(h[4])
  end
  local adaptive = math.min(max, math.max(floor, r))
  local eff = adaptive
  if fixed > 0 then eff = fixed end
  for _, v in ipairs({exists, eff, adaptive, e, t, c}) do out[#out + 1] = v end
end
return out
