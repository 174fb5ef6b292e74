-- wrk script: every request asks for a key no request asked for before (the process's
-- start second, a random number and a counter in the query), so a cache misses every time.
-- Used by cache.sh and cache-memory.sh.
local prefix = tostring(os.time()) .. "-" .. tostring(math.random(1, 1000000000))
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, "/?k=" .. prefix .. "-" .. n)
end
