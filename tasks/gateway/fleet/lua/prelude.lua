-- prelude: shared by admit and refuse. store.py puts it in front of each script when it
-- loads it, so both read the clock and their numbers alike.
--
-- An attempt's keys share one hash tag, playrun:gw:{<run id>:<generation>}:
--   :bucket  hash: r request units, b byte units, t the last admission (us)
--   :abuse   hash: l refusal count (units), u the last refusal (ms), x failed until (us),
--            c:<code> refusals of that code
--   :flight  sorted set: request id -> when its hold expires (us)
-- Integers only, every value below 2^53 where doubles are exact; the maths mirror
-- fleet/maths.py. A missing key is a fresh attempt: full buckets, a count of zero.

local floor, ceil, max, min, fmt = math.floor, math.ceil, math.max, math.min, string.format

-- now in us: the test clock when given (tests replay exact times), else Redis TIME, the
-- one clock every gateway host shares.
local function clock(arg)
  if arg and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- The packed numbers of ARGV[1] (little-endian doubles, each an integer) as a table.
local function numbers(packed, count)
  if #packed ~= 8 * count then error('ARGV[1]: want ' .. count .. ' packed numbers') end
  return {struct.unpack('<' .. string.rep('d', count), packed)}
end

-- An integer as Redis stores it: all digits (tostring would round past 14 of them).
local function int(v) return fmt('%d', v) end
