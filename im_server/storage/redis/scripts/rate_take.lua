-- Per-user token buckets shared by every server process (services' rate limits with
-- more than one process): take one token from each bucket, or refuse.
-- KEYS[i]  a bucket (keys.rate_bucket): hash t = tokens, m = ms of the last change;
--          all under one hash tag, so one call serves a batch in a cluster too
-- ARGV[2i-1], ARGV[2i]  the bucket's rate (tokens per second) and burst
-- Returns one 1 (taken) or 0 (refused) per key. The clock is the server's (TIME), the
-- same for every process.
local now_s = redis.call('TIME')
local now = tonumber(now_s[1]) * 1000 + math.floor(tonumber(now_s[2]) / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  local state = redis.call('HMGET', key, 't', 'm')
  local tokens = tonumber(state[1]) or burst
  local last = tonumber(state[2]) or now
  if now > last then
    tokens = math.min(burst, tokens + (now - last) * rate / 1000)
  end
  if tokens >= 1 then
    tokens = tokens - 1
    out[i] = 1
  else
    out[i] = 0
  end
  redis.call('HSET', key, 't', tostring(tokens), 'm', now)
  -- a full bucket needs no key: gone once it would have refilled
  redis.call('PEXPIRE', key, math.ceil((burst - tokens) / rate * 1000) + 1000)
end
return out
