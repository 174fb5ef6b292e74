-- e2e/bench/failover.lua — wrk script of failover.sh: what the clients saw, with times.
--
-- wrk -t1 ... -s failover.lua URL -- ERRORS LATENCIES FROM TO [FROM TO ...]
--   ERRORS     one line per non-2xx answer: "epoch-ms status"
--   LATENCIES  one line per request sent inside a window [FROM, TO) (epoch ms) that came back
--              from a backend: "sent-epoch-ms latency-ms status". Such a request carries
--              X-Seq: N, which the backends echo; an answer without it (the proxy's own error
--              page) cannot be matched to its request, so it is not here: those requests, and
--              any never answered, are listed by done() in FAILOVER_UNMATCHED.
-- Environment (read by done(), which runs in wrk's main Lua state after the run):
--   FAILOVER_SUMMARY   key=value lines: requests, errors of each kind, latency percentiles (µs)
--   FAILOVER_UNMATCHED one line per window request without a matched answer: "sent-epoch-ms"
-- Outside the windows a request is the pre-built one and only non-2xx answers cost a line,
-- so the load generator does little more than plain wrk. Times are CLOCK_REALTIME in ms,
-- the clock of the backends' $msec and of the script's timeline.
local ffi = require("ffi")
ffi.cdef([[
typedef struct { long tv_sec; long tv_nsec; } failover_timespec;
int clock_gettime(int clk_id, failover_timespec *tp);
]])
local ts = ffi.new("failover_timespec")
local function now_ms()
  ffi.C.clock_gettime(0, ts) -- CLOCK_REALTIME
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local errors, latencies, plain
local windows = {}
seq = 0 -- globals: done() reads them through thread:get
sent = {} -- seq -> send time, until its answer comes back

function init(args)
  errors = assert(io.open(args[1], "w"))
  latencies = assert(io.open(args[2], "w"))
  errors:setvbuf("full", 65536) -- flushed when wrk exits
  latencies:setvbuf("full", 65536)
  for i = 3, #args - 1, 2 do
    windows[#windows + 1] = { tonumber(args[i]), tonumber(args[i + 1]) }
  end
  plain = wrk.format()
end

local function in_window(t)
  for _, w in ipairs(windows) do
    if t >= w[1] and t < w[2] then return true end
  end
  return false
end

function request()
  local t = now_ms()
  if not in_window(t) then return plain end
  seq = seq + 1
  sent[seq] = t
  local h = {}
  for k, v in pairs(wrk.headers) do h[k] = v end
  h["X-Seq"] = tostring(seq)
  return wrk.format(nil, nil, h)
end

function response(status, headers, _)
  local t = now_ms()
  if status < 200 or status > 299 then
    errors:write(string.format("%.3f %d\n", t, status))
  end
  -- hyper and HAProxy send header names in lower case, nginx as configured.
  local s = headers["x-seq"] or headers["X-Seq"]
  if s then
    local i = tonumber(s)
    local t0 = sent[i]
    if t0 then
      sent[i] = nil
      latencies:write(string.format("%.3f %.3f %d\n", t0, t - t0, status))
    end
  end
end

local threads = {}
function setup(thread) threads[#threads + 1] = thread end

function done(summary, latency, _)
  local out = assert(io.open(assert(os.getenv("FAILOVER_SUMMARY")), "w"))
  local e = summary.errors
  local window_requests = 0
  local um = assert(io.open(assert(os.getenv("FAILOVER_UNMATCHED")), "w"))
  for _, t in ipairs(threads) do
    window_requests = window_requests + (t:get("seq") or 0)
    for _, v in pairs(t:get("sent") or {}) do um:write(string.format("%.3f\n", v)) end
  end
  um:close()
  for k, v in pairs({
    requests = summary.requests, duration_us = summary.duration,
    connect = e.connect, read = e.read, write = e.write, status = e.status, timeout = e.timeout,
    p50_us = latency:percentile(50), p99_us = latency:percentile(99), max_us = latency.max,
    mean_us = latency.mean, window_requests = window_requests,
  }) do
    out:write(string.format("%s=%s\n", k, tostring(v)))
  end
  out:close()
end
