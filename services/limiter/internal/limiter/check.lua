-- Floodgate multi-tier token-bucket check: one round trip, all or nothing.
--
-- KEYS[1]      the principal's penalty hash (field m = multiplier in (0,1])
-- KEYS[2..n+1] one bucket hash per tier (fields t = tokens, ts = last refill, ms)
-- ARGV[1]      cost of this request
-- ARGV[2i], ARGV[2i+1]  limit and period_ms of tier i
--
-- All keys share the principal's hash tag, so Redis Cluster runs this on one slot.
-- Time comes from Redis TIME, never the caller. Every tier is evaluated first; state
-- is written only when all tiers allow, so a denied request consumes nothing.
--
-- Returns {allowed, tier_index, limit, remaining, reset_after_ms, retry_after_ms,
--          now_ms, multiplier_string}; tier_index is the denying tier, or when
-- allowed the tier with the least room left (the one the headers describe).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cost = tonumber(ARGV[1])

local m = tonumber(redis.call('HGET', KEYS[1], 'm'))
if m == nil or m <= 0 or m > 1 then m = 1 end

local n = #KEYS - 1
local state = {}
local decide, decide_room = 0, nil
local denied = false

for i = 1, n do
  local limit = tonumber(ARGV[2 * i])
  local period = tonumber(ARGV[2 * i + 1])
  local cap = math.max(1, math.floor(limit * m))
  local rate = cap / period -- tokens per millisecond
  local cur = redis.call('HMGET', KEYS[i + 1], 't', 'ts')
  local tokens, ts = tonumber(cur[1]), tonumber(cur[2])
  if tokens == nil or ts == nil then
    tokens, ts = cap, now
  end
  if now > ts then tokens = tokens + (now - ts) * rate end
  if tokens > cap then tokens = cap end

  local ok = tokens >= cost
  local left = tokens
  if ok then left = tokens - cost end
  local s = {cap = cap, rate = rate, tokens = tokens, left = left, period = period}
  if ok then
    s.retry = 0
  elseif cost <= cap then
    s.retry = math.ceil((cost - tokens) / rate)
  else
    s.retry = -1 -- can never fit under the current (penalized) limit
  end
  state[i] = s

  if not ok and not denied then
    denied, decide = true, i
  elseif not denied then
    local room = left / cap
    if decide_room == nil or room < decide_room then decide, decide_room = i, room end
  end
end

if not denied then
  for i = 1, n do
    local s = state[i]
    redis.call('HSET', KEYS[i + 1], 't', tostring(s.left), 'ts', now)
    local full_in = math.ceil((s.cap - s.left) / s.rate)
    redis.call('PEXPIRE', KEYS[i + 1], full_in + 1000)
  end
end

local d = state[decide]
local remaining = math.floor(d.left)
local reset_after = math.ceil((d.cap - d.left) / d.rate)
local retry = d.retry
if retry == -1 then retry = math.max(reset_after, d.period) end
local allowed = 0
if not denied then allowed = 1 end
return {allowed, decide, d.cap, remaining, reset_after, retry, now, tostring(m)}
