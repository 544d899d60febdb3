-- Per-user token buckets shared by every server process (the rate limits with more than
-- one process): each process takes tokens in small leases and spends them itself.
-- KEYS[i]  a bucket (keys.rate_bucket): hash t = tokens, m = ms of the last change;
--          all under one hash tag, so one call serves a batch in a cluster too
-- ARGV[3i-2], ARGV[3i-1], ARGV[3i]  the bucket's rate (tokens per second), burst, and
--          how many tokens are asked for
-- Returns per key the whole tokens granted (0 .. asked). The clock is the server's
-- (TIME), the same for every process.
local now_s = redis.call('TIME')
local now = tonumber(now_s[1]) * 1000 + math.floor(tonumber(now_s[2]) / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[3 * i - 2])
  local burst = tonumber(ARGV[3 * i - 1])
  local asked = tonumber(ARGV[3 * i])
  local state = redis.call('HMGET', key, 't', 'm')
  local tokens = tonumber(state[1]) or burst
  local last = tonumber(state[2]) or now
  if now > last then
    tokens = math.min(burst, tokens + (now - last) * rate / 1000)
  end
  local granted = math.min(asked, math.floor(tokens))
  tokens = tokens - granted
  out[i] = granted
  redis.call('HSET', key, 't', tostring(tokens), 'm', now)
  -- a full bucket needs no key: gone once it would have refilled
  redis.call('PEXPIRE', key, math.ceil((burst - tokens) / rate * 1000) + 1000)
end
return out
