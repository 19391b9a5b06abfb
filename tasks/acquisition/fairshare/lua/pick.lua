-- pick: the next starts in fair order (start-time fair queueing by org), atomically.
--
-- KEYS[1]  H: hash 'o:'..org -> the start tag of its next start; '~v' the fleet's
--          virtual time (the tag of the last start picked), '~w' the last window
-- KEYS[2]  G: zset of start messages in flight (published, not yet past their permit):
--          member task id, score the ms it stops counting
-- KEYS[3]  O: hash task id -> org, for each member of G
-- KEYS[4]  C: hash org -> its members in G
-- ARGV[1]  window: most start messages in flight at once
-- ARGV[2]  queued: start messages waiting in the broker queue (counted if above G)
-- ARGV[3]  now_ms, or '' for Redis TIME
-- ARGV[4]  key TTL, ms
-- ARGV[5]  '1': pick nothing unless the last relay pass left no start unsent ('~b' of H
--          is 0): an admission's own start may skip the outbox's queue only then
-- ARGV[4i+2 .. 4i+5]  candidate i: org, weight (1..1000), runs due (at most the
--          window), capacity room (-1: none applies); the room left is that less the
--          org's messages in flight
-- Returns  the orgs picked, in order, one entry per start (at most window - in flight).
--
-- An org's next tag is max(its own, the fleet's): an org idle or at its capacity limit
-- banks no credit, and a weight-w org's tag grows by SCALE // w per start, so backlogged
-- orgs share the starts in proportion to their weights. Ties go to the earlier
-- candidate (the caller sends them in order of name).
-- Integers only, below 2^53. maths: tasks/acquisition/fairshare/order.py.

local SCALE = 7207200
local floor = math.floor
local window, queued = tonumber(ARGV[1]), tonumber(ARGV[2])
local now
if ARGV[3] ~= '' then now = tonumber(ARGV[3]) else
  local t = redis.call('TIME'); now = t[1] * 1000 + floor(t[2] / 1000) end
local ttl = tonumber(ARGV[4])

-- Messages past their time stop counting: a worker that died with one, a lost publish.
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, id in ipairs(stale) do
  local org = redis.call('HGET', KEYS[3], id)
  if org then
    if redis.call('HINCRBY', KEYS[4], org, -1) <= 0 then redis.call('HDEL', KEYS[4], org) end
    redis.call('HDEL', KEYS[3], id)
  end
end
if #stale > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end

if ARGV[5] == '1' and redis.call('HGET', KEYS[1], '~b') ~= '0' then return {} end
redis.call('HSET', KEYS[1], '~w', window)
redis.call('PEXPIRE', KEYS[1], ttl)
local inflight = redis.call('ZCARD', KEYS[2])
if queued > inflight then inflight = queued end
local room = window - inflight
if room <= 0 then return {} end

local v = tonumber(redis.call('HGET', KEYS[1], '~v')) or 0
local orgs, tag, cost, left = {}, {}, {}, {}
local n = 0
for i = 6, #ARGV, 4 do
  n = n + 1
  local org = ARGV[i]
  orgs[n] = org
  local own = tonumber(redis.call('HGET', KEYS[1], 'o:' .. org)) or 0
  tag[n] = own > v and own or v
  cost[n] = floor(SCALE / tonumber(ARGV[i + 1]))
  left[n] = tonumber(ARGV[i + 2])
  local cap = tonumber(ARGV[i + 3])
  if cap >= 0 then
    cap = cap - (tonumber(redis.call('HGET', KEYS[4], org)) or 0)
    if cap < left[n] then left[n] = cap end
  end
end

local picked, served = {}, {}
while #picked < room do
  local best = nil
  for i = 1, n do
    if left[i] > 0 and (best == nil or tag[i] < tag[best]) then best = i end
  end
  if best == nil then break end
  picked[#picked + 1] = orgs[best]
  v = tag[best]
  tag[best] = tag[best] + cost[best]
  left[best] = left[best] - 1
  served[best] = true
end
for i in pairs(served) do
  redis.call('HSET', KEYS[1], 'o:' .. orgs[i], string.format('%d', tag[i]))
end
if #picked > 0 then redis.call('HSET', KEYS[1], '~v', string.format('%d', v)) end
return picked
