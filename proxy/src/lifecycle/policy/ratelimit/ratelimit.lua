-- Tollgate rate limit: one atomic decision (or one cached replica's sync) on one counter.
--
-- This mirrors proxy/src/lifecycle/policy/ratelimit/algo.rs (fresh, advance, admits_n,
-- consume, record, add, idle_ttl) line by line; keep the two in step. A test runs the same request sequences
-- through both and compares every decision.
--
-- KEYS[1]  the counter: a hash with fields <alg><limit>/<window>:a|b|c, one triple per rate
--          (so a reconfigured rate starts a new counter instead of misreading an old one).
-- ARGV     now_ms, mode ('c': decide one request | 's': record a replica's hits |
--          'a': add a cost known after the response),
--          n_rates, n_rates x (alg 'f'|'s'|'t', limit, window_ms),
--          then in mode 'c': need, take (admitted when every rate has room for `need`
--          units; `take` units are then counted),
--          in mode 's': n_segments, n_segments x (at_ms, hits),
--          in mode 'a': units (counted at now_ms whether they fit or not)
-- Returns  {allowed (1|0, always 1 in modes 's' and 'a'), a1, b1, c1, ..., an, bn, cn}: the states
--          after the call, from which the caller computes the numbers it reports.
local now = tonumber(ARGV[1])
local mode = ARGV[2]
local n = tonumber(ARGV[3])

local specs, fields = {}, {}
for i = 1, n do
  local j = 3 + (i - 1) * 3
  specs[i] = { alg = ARGV[j + 1], l = tonumber(ARGV[j + 2]), w = tonumber(ARGV[j + 3]) }
  local p = ARGV[j + 1] .. ARGV[j + 2] .. '/' .. ARGV[j + 3] .. ':'
  fields[3 * i - 2] = p .. 'a'
  fields[3 * i - 1] = p .. 'b'
  fields[3 * i] = p .. 'c'
end

local segs = {}
local base = 4 + 3 * n
local need, take, units = 1, 1, 0
if mode == 's' then
  for k = 1, tonumber(ARGV[base]) do
    segs[k] = { tonumber(ARGV[base + 2 * k - 1]), tonumber(ARGV[base + 2 * k]) }
  end
elseif mode == 'c' then
  need, take = tonumber(ARGV[base]), tonumber(ARGV[base + 1])
else
  units = tonumber(ARGV[base])
end

local function align(t, w)
  return t - t % w
end

local function fresh(sp, t)
  if sp.alg == 't' then
    return { sp.l * sp.w, t, 0 }
  end
  return { align(t, sp.w), 0, 0 }
end

local function advance(sp, s, t)
  if sp.alg == 'f' then
    local start = align(t, sp.w)
    if start > s[1] then
      s[1], s[2], s[3] = start, 0, 0
    end
  elseif sp.alg == 's' then
    local start = align(t, sp.w)
    if start == s[1] + sp.w then
      s[1], s[2], s[3] = start, 0, s[2]
    elseif start > s[1] + sp.w then
      s[1], s[2], s[3] = start, 0, 0
    end
  elseif t > s[2] then
    s[1] = math.min(sp.l * sp.w, s[1] + (t - s[2]) * sp.l)
    s[2] = t
  end
end

local function admits_n(sp, s, t, k)
  if sp.alg == 'f' then
    return s[2] + k <= sp.l
  elseif sp.alg == 's' then
    local e = math.max(0, math.min(sp.w, t - s[1]))
    return s[3] * (sp.w - e) + s[2] * sp.w + k * sp.w <= sp.l * sp.w
  end
  return s[1] >= k * sp.w
end

local function consume(sp, s, k)
  if sp.alg == 't' then
    s[1] = s[1] - k * sp.w
  else
    s[2] = s[2] + k
  end
end

local function record(sp, s, at, k)
  if sp.alg == 't' then
    advance(sp, s, at)
    consume(sp, s, k)
    return
  end
  local start = align(at, sp.w)
  if start >= s[1] then
    advance(sp, s, at)
    consume(sp, s, k)
  elseif sp.alg == 's' and start == s[1] - sp.w then
    s[3] = s[3] + k
  end
end

local function idle_ttl(sp, s, t)
  local v = 0
  if sp.alg == 'f' then
    v = s[1] + sp.w - t
  elseif sp.alg == 's' then
    v = s[1] + 2 * sp.w - t
  elseif sp.l > 0 then
    v = math.ceil((sp.l * sp.w - s[1]) / sp.l)
  end
  return math.max(v, 0)
end

-- A counter nobody has written yet starts fresh at the earliest time it is asked about, so
-- a sync's oldest hits still land in their own window.
local t0 = now
if segs[1] and segs[1][1] < now then
  t0 = segs[1][1]
end
local raw = redis.call('HMGET', KEYS[1], unpack(fields))
local states = {}
for i = 1, n do
  if raw[3 * i - 2] then
    states[i] = { tonumber(raw[3 * i - 2]), tonumber(raw[3 * i - 1]), tonumber(raw[3 * i]) }
  else
    states[i] = fresh(specs[i], t0)
  end
end

local allowed = 1
if mode == 'c' then
  for i = 1, n do
    advance(specs[i], states[i], now)
  end
  for i = 1, n do
    if not admits_n(specs[i], states[i], now, need) then
      allowed = 0
    end
  end
  if allowed == 1 then
    for i = 1, n do
      consume(specs[i], states[i], take)
    end
  end
elseif mode == 'a' then
  for i = 1, n do
    advance(specs[i], states[i], now)
    consume(specs[i], states[i], units)
  end
else
  for _, seg in ipairs(segs) do
    for i = 1, n do
      record(specs[i], states[i], seg[1], seg[2])
    end
  end
  for i = 1, n do
    advance(specs[i], states[i], now)
  end
end

local out, set, keep = { allowed }, {}, 1
for i = 1, n do
  local s = states[i]
  for f = 1, 3 do
    out[#out + 1] = s[f]
    set[#set + 1] = fields[3 * i - 3 + f]
    set[#set + 1] = s[f]
  end
  keep = math.max(keep, idle_ttl(specs[i], s, now))
end
-- A refusal changes nothing that the next call's advance would not redo: skip the write.
-- The key outlives the time it takes to become fresh by a slack, because that time is
-- counted on the callers' clocks and the expiry on Redis's: a replica whose clock is behind
-- must still find the counter.
if allowed == 1 then
  redis.call('HSET', KEYS[1], unpack(set))
  redis.call('PEXPIRE', KEYS[1], keep + 5000)
end
return out
