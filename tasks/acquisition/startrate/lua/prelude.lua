-- prelude: shared by acquire, penalize and inspect. bucket.py puts it in front of each
-- script when it loads it, so the three read the clock, their numbers and a rule's state
-- alike.
--
-- A rule's state is one hash, playrun:startrate:{<bucket>}:rule:<name>, with fields
--   r  adaptive rate, milli-starts per minute (mpm)
--   t  GCRA theoretical arrival time (TAT), us
--   e  penalty epoch
--   c  cooldown end, us
--   x  when the key expires (ms, Redis clock), as the last PEXPIRE set it
-- A missing key is a fresh rule (initial rate, epoch 0); a missing field reads as 0.
-- Integers only: every value stays below 2^53, where doubles are exact. The maths
-- mirror startrate/maths.py.
--
-- Every script takes ARGV[1] = its numbers packed as little-endian doubles, each an
-- integer below 2^53 (one argument instead of one per number, and no tonumber: cheaper
-- to send and to read), and ARGV[2] = now_us in tests only (absent in production).

local floor, ceil, max, min, fmt = math.floor, math.ceil, math.max, math.min, string.format

-- now in us: ARGV[2] when given (tests replay exact arrivals), else Redis TIME, the one
-- clock every worker shares.
local function clock(arg)
  if arg then return tonumber(arg) end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- ARGV[1] as a table of count numbers (A[1] is the first). The formats of one and two
-- rules are literals: building one per call (string.rep) cost a tenth of an acquire.
local function numbers(packed, count)
  if #packed ~= 8 * count then error('ARGV[1]: want ' .. count .. ' packed numbers') end
  local f = count == 8 and '<dddddddd' or count == 13 and '<ddddddddddddd'
    or '<' .. string.rep('d', count)
  return {struct.unpack(f, packed)}
end

-- One rule's state, one HMGET: h[1] r (nil for a missing key), h[2] t, h[3] e, h[4] c
-- as numbers; h[5] x as stored (false if missing): only a grant's TTL check reads it.
-- The scripts clamp r on read, min(max, max(floor, r or initial)), so a changed
-- floor/max applies at once to stored state and a missing key starts at the initial rate
-- (inline: a function call per rule costs more than the line).
local function state(key)
  local h = redis.call('HMGET', key, 'r', 't', 'e', 'c', 'x')
  h[1], h[2], h[3], h[4] = tonumber(h[1]), tonumber(h[2]) or 0, tonumber(h[3]) or 0,
    tonumber(h[4]) or 0
  return h
end

-- The expiry a key needs (ms): idle_ttl_ms past the last instant its state matters (TAT
-- or cooldown). A key whose expiry x is at most a tenth of idle_ttl short of it keeps
-- its TTL (no PEXPIRE): it still outlives that instant by 0.9 idle_ttl, long after its
-- state stopped mattering, so an early expiry can only restart an idle rule.
local function expiry(idle_ttl, now, last)
  return floor(now / 1000) + idle_ttl + ceil(max(0, last - now) / 1000)
end

-- An integer as Redis stores it: all digits (tostring would round past 14 of them).
local function int(v) return fmt('%d', v) end
