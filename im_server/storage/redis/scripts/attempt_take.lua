-- Count one attempt against a limit, unless the limit is reached: the check and the
-- count are one step, so parallel attempts cannot all pass the check first.
-- KEYS[1] counter (keys.login_fails_user or keys.login_fails_addr)
-- ARGV[1] limit, ARGV[2] window in seconds (the counter's TTL, set when it is created)
-- Returns 1 when the attempt was counted, 0 when the limit is reached (nothing counted).
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[1]) then
  return 0
end
if redis.call('INCR', KEYS[1]) == 1 then
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return 1
