-- Floodgate multi-tier check: one round trip, all or nothing.
--
-- Every key of one call shares one cluster hash tag (a principal's, or one IP
-- prefix's), so Redis Cluster runs the script on one slot. Time comes from Redis
-- TIME unless ARGV[2] carries a fixed time (tests only). Every rule is evaluated
-- first; state is written only when no enforcing rule denies, so a denied request
-- consumes nothing. Shadow rules are evaluated and reported but never deny; they
-- consume only when they would have allowed.
--
-- KEYS[1]          the penalty hash of the tag (field m = multiplier in (0,1])
-- KEYS[2..]        state keys, one per rule (two for a daily quota near midnight)
-- ARGV[1]          mode: "c" check and commit, "r" refund the rules marked in ARGV[4],
--                  "p" check and commit on a replay's clock (see REPLAY_TTL)
-- ARGV[2]          fixed now in ms (a replayed decision's own time; tests), or "" for Redis TIME
-- ARGV[3]          "1" applies the penalty multiplier to this call's rules
-- ARGV[4]          refund mask: one "0"/"1" per rule (mode "r")
-- ARGV[5]          number of rules
-- then per rule:   algorithm code, limit, period_ms, burst (0 = limit), scale,
--                  cost, shadow (0/1), lease (0 = none), number of keys n, then
--                  n UTC day numbers for a "day" rule (one per key)
--
-- Effective limit = floor(limit × scale × penalty), at least 1 (the daily quota
-- is neither scaled nor penalized). A sliding-window log's limit is also capped
-- at LOG_MAX, which bounds its sorted set's size (an override may raise a rule's
-- limit past what the rules loader accepts).
--
-- Returns {allowed, now_ms, multiplier, consumed_mask, then per rule: ok, limit,
-- remaining, reset_after_ms, retry_after_ms (-1 = cannot fit at this limit)},
-- and when a rule leases, then per rule the units it took (a token bucket with
-- a lease of L takes min(L, its whole tokens) when the cost fits: the caller
-- spends the rest in-process).

local now
if ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local mode = ARGV[1]

-- Keys expire on the wall clock (PEXPIRE), not on the script's now. A replay
-- ("p": pkg/whatif, each decision at its own ts) runs faster or slower than
-- the traffic did, so a TTL measured in its event time would drop a bucket
-- mid-replay whenever the replay fell behind the traffic (a bucket of 10 a
-- second, emptied, expiring two wall seconds later while the replay's clock
-- had moved 300 ms: a full bucket instead of three tokens). Every state
-- carries its own time (ts, tat, window, scores, the day), so expiry is only
-- garbage collection: a replay's keys live REPLAY_TTL at least
-- (limiter.ReplayKeyTTL), longer than any replay, and the replay deletes its
-- keyspace when it ends.
local REPLAY_TTL = 3600000
local ttl_floor = 0
if mode == 'p' then mode, ttl_floor = 'c', REPLAY_TTL end
local function expire(key, ms)
  if ms < ttl_floor then ms = ttl_floor end
  redis.call('PEXPIRE', key, ms)
end

local m = 1
if ARGV[3] == '1' then
  m = tonumber(redis.call('HGET', KEYS[1], 'm'))
  if m == nil or m <= 0 or m > 1 then m = 1 end
end

local DAY = 86400000
local LOG_MAX = 10000
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local function fmt(x) return string.format('%.17g', x) end

local n = tonumber(ARGV[5])
local rules = {}
local leasing = false
local a, k = 6, 2
for i = 1, n do
  local r = {
    alg = ARGV[a], limit = tonumber(ARGV[a + 1]), period = tonumber(ARGV[a + 2]),
    burst = tonumber(ARGV[a + 3]), scale = tonumber(ARGV[a + 4]), cost = tonumber(ARGV[a + 5]),
    shadow = ARGV[a + 6] == '1', lease = tonumber(ARGV[a + 7]),
  }
  local nk = tonumber(ARGV[a + 8])
  a = a + 9
  if r.lease > 0 then leasing = true end
  r.key = KEYS[k]
  if r.alg == 'day' or r.alg == 'dayp' then
    local today = floor(now / DAY)
    for j = 0, nk - 1 do
      if tonumber(ARGV[a + j]) == today then r.key = KEYS[k + j] end
    end
    a = a + nk
  end
  k = k + nk
  local function eff(x)
    if r.alg == 'day' or r.alg == 'dayp' then return x end
    return max(1, floor(x * r.scale * m + 1e-9))
  end
  r.lim = eff(r.limit)
  if r.alg == 'swl' then r.lim = min(r.lim, LOG_MAX) end
  if r.burst > 0 then r.cap = eff(r.burst) else r.cap = r.lim end
  rules[i] = r
end

-- Each evaluator returns ok, remaining, reset_after, retry_after and a commit
-- function that writes the consumed state.
local eval = {}

eval.tb = function(r)
  local cap, cost, rate = r.cap, r.cost, r.lim / r.period
  local cur = redis.call('HMGET', r.key, 't', 'ts')
  local tokens, ts = tonumber(cur[1]), tonumber(cur[2])
  if tokens == nil or ts == nil then tokens, ts = cap, now end
  if now > ts then tokens = tokens + (now - ts) * rate end
  if tokens > cap then tokens = cap end
  local ok = tokens >= cost
  local left = tokens
  if ok then
    if r.lease > cost then cost = max(cost, min(r.lease, floor(tokens))) end
    left = tokens - cost
  end
  r.took = cost
  local reset = ceil((cap - left) / rate)
  local retry = 0
  if not ok then
    if cost <= cap then retry = ceil((cost - tokens) / rate) else retry = -1 end
  end
  return ok, floor(left), reset, retry, function()
    redis.call('HSET', r.key, 't', fmt(left), 'ts', now)
    expire(r.key, reset + 1000)
  end
end

eval.lb = function(r)
  local cap, cost, rate = r.cap, r.cost, r.lim / r.period
  local cur = redis.call('HMGET', r.key, 'l', 'ts')
  local level, ts = tonumber(cur[1]), tonumber(cur[2])
  if level == nil or ts == nil then level, ts = 0, now end
  if now > ts then level = level - (now - ts) * rate end
  if level < 0 then level = 0 end
  local ok = level + cost <= cap
  local after = level
  if ok then after = level + cost end
  local reset = ceil(after / rate)
  local retry = 0
  if not ok then
    if cost <= cap then retry = ceil((level + cost - cap) / rate) else retry = -1 end
  end
  return ok, floor(cap - after), reset, retry, function()
    redis.call('HSET', r.key, 'l', fmt(after), 'ts', now)
    expire(r.key, reset + 1000)
  end
end

eval.gcra = function(r)
  local cost, T = r.cost, r.period / r.lim
  local tat = tonumber(redis.call('HGET', r.key, 'tat'))
  if tat == nil or tat < now then tat = now end
  local new_tat = tat + cost * T
  local allow_at = new_tat - r.cap * T
  local ok = allow_at - now <= 1e-6
  if ok then
    local reset = ceil(new_tat - now)
    return true, floor((now - allow_at) / T + 1e-9), reset, 0, function()
      redis.call('HSET', r.key, 'tat', fmt(new_tat))
      expire(r.key, reset + 1000)
    end
  end
  local retry = -1
  if cost <= r.cap then retry = ceil(allow_at - now) end
  return false, max(0, floor((now - (tat - r.cap * T)) / T + 1e-9)), ceil(tat - now), retry, nil
end

eval.fw = function(r)
  local lim, cost, period = r.lim, r.cost, r.period
  local win = now - now % period
  local cur = redis.call('HMGET', r.key, 'w', 'c')
  local c = tonumber(cur[2]) or 0
  if tonumber(cur[1]) ~= win then c = 0 end
  local ok = c + cost <= lim
  local reset = win + period - now
  if ok then
    return true, lim - c - cost, reset, 0, function()
      redis.call('HSET', r.key, 'w', win, 'c', c + cost)
      expire(r.key, reset + 1000)
    end
  end
  local retry = -1
  if cost <= lim then retry = reset end
  return false, max(0, lim - c), reset, retry, nil
end

eval.sw = function(r)
  local lim, cost, period = r.lim, r.cost, r.period
  local win = now - now % period
  local cur = redis.call('HMGET', r.key, 'w', 'c', 'p')
  local w, c, p = tonumber(cur[1]), tonumber(cur[2]) or 0, tonumber(cur[3]) or 0
  if w == nil then
    c, p = 0, 0
  elseif w ~= win then
    if w == win - period then p = c else p = 0 end
    c = 0
  end
  local elapsed = now - win
  local est = p * (period - elapsed) / period + c
  local ok = est + cost <= lim
  if ok then
    local reset = win + 2 * period - now
    return true, floor(lim - est - cost), reset, 0, function()
      redis.call('HSET', r.key, 'w', win, 'c', c + cost, 'p', p)
      expire(r.key, reset + 1000)
    end
  end
  local reset = win + period - now
  if c > 0 then reset = reset + period end
  local retry = -1
  if cost <= lim then
    local need = est + cost - lim
    if p > 0 then
      local t1 = ceil(need * period / p)
      if t1 <= period - elapsed then retry = t1 end
    end
    if retry == -1 then
      retry = period - elapsed
      if c + cost > lim then retry = retry + ceil((c + cost - lim) * period / c) end
    end
  end
  return false, max(0, floor(lim - est)), reset, retry, nil
end

-- Sliding-window log: a sorted set of one member per consumed unit, scored by
-- the Redis time it was consumed. A unit counts while score > now − period.
-- Members are "<ms>:<index>" with the index zero-padded and consecutive from 0
-- among the members of one score (trims drop whole scores, refunds pop the
-- highest index), so new members never collide with live ones.
eval.swl = function(r)
  local lim, cost, period = r.lim, r.cost, r.period
  local lo = '(' .. (now - period)
  local count = redis.call('ZCOUNT', r.key, lo, '+inf')
  local newest = now
  if count > 0 then
    local last = redis.call('ZRANGE', r.key, '+inf', lo, 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
    newest = tonumber(last[2])
  end
  if count + cost <= lim then
    local reset = max(newest, now) + period - now
    return true, lim - count - cost, reset, 0, function()
      redis.call('ZREMRANGEBYSCORE', r.key, '-inf', now - period)
      local base = redis.call('ZCOUNT', r.key, now, now)
      local j = 0
      while j < cost do
        local args = {}
        for x = j, min(cost, j + 1000) - 1 do
          args[#args + 1] = now
          args[#args + 1] = string.format('%d:%06d', now, base + x)
        end
        redis.call('ZADD', r.key, unpack(args))
        j = j + 1000
      end
      expire(r.key, reset)
    end
  end
  local reset = 0
  if count > 0 then reset = newest + period - now end
  local retry = -1
  if cost <= lim then
    -- The need oldest live units must expire first.
    local need = count + cost - lim
    local e = redis.call('ZRANGE', r.key, lo, '+inf', 'BYSCORE', 'LIMIT', need - 1, 1, 'WITHSCORES')
    retry = tonumber(e[2]) + period - now
  end
  return false, max(0, lim - count), reset, retry, nil
end

eval.day = function(r)
  local lim, cost = r.lim, r.cost
  local used = tonumber(redis.call('GET', r.key)) or 0
  local reset = DAY - now % DAY
  if used + cost <= lim then
    return true, lim - used - cost, reset, 0, function()
      redis.call('INCRBY', r.key, cost)
      expire(r.key, reset + 2 * DAY)
    end
  end
  return false, max(0, lim - used), reset, reset, nil
end

-- A candidate's daily quota (rule rollouts): the enforced day usage, read
-- only — judged like "day", never counted (its commit writes nothing, and a
-- refund has nothing to give back).
eval.dayp = function(r)
  local ok, remaining, reset, retry = eval.day(r)
  local commit = nil
  if ok then commit = function() end end
  return ok, remaining, reset, retry, commit
end

if mode == 'r' then
  local mask = ARGV[4]
  for i = 1, n do
    local r = rules[i]
    if string.sub(mask, i, i) == '1' then
      if r.alg == 'tb' then
        local t = tonumber(redis.call('HGET', r.key, 't'))
        if t ~= nil then redis.call('HSET', r.key, 't', fmt(min(r.cap, t + r.cost))) end
      elseif r.alg == 'lb' then
        local l = tonumber(redis.call('HGET', r.key, 'l'))
        if l ~= nil then redis.call('HSET', r.key, 'l', fmt(max(0, l - r.cost))) end
      elseif r.alg == 'gcra' then
        local tat = tonumber(redis.call('HGET', r.key, 'tat'))
        if tat ~= nil then redis.call('HSET', r.key, 'tat', fmt(tat - r.cost * r.period / r.lim)) end
      elseif r.alg == 'fw' or r.alg == 'sw' then
        local cur = redis.call('HMGET', r.key, 'w', 'c')
        if tonumber(cur[1]) == now - now % r.period and tonumber(cur[2]) then
          redis.call('HSET', r.key, 'c', max(0, tonumber(cur[2]) - r.cost))
        end
      elseif r.alg == 'swl' then
        redis.call('ZPOPMAX', r.key, r.cost)
      elseif r.alg == 'day' then
        if redis.call('EXISTS', r.key) == 1 then redis.call('DECRBY', r.key, r.cost) end
      end
    end
  end
  return {1, now, tostring(m), mask}
end

local out = {0, now, tostring(m), ''}
local denied = false
local commits = {}
for i = 1, n do
  local r = rules[i]
  local ok, remaining, reset, retry, commit = eval[r.alg](r)
  if not ok and not r.shadow then denied = true end
  commits[i] = ok and commit or false
  local base = 4 + (i - 1) * 5
  out[base + 1] = ok and 1 or 0
  out[base + 2] = r.lim
  out[base + 3] = remaining
  out[base + 4] = reset
  out[base + 5] = retry
end

local mask = {}
for i = 1, n do
  if not denied and commits[i] then
    commits[i]()
    mask[i] = '1'
  else
    mask[i] = '0'
  end
end
if not denied then out[1] = 1 end
out[4] = table.concat(mask)
if leasing then
  for i = 1, n do
    local took = 0
    if mask[i] == '1' then took = rules[i].took or rules[i].cost end
    out[4 + 5 * n + i] = took
  end
end
return out
