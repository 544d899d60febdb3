-- Give back an attempt counted by attempt_take.lua (it turned out not to be a failure).
-- KEYS[1] counter
-- A counter that expired meanwhile stays absent (a plain DECR would make it -1, forever).
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n > 0 then
  return redis.call('DECR', KEYS[1])
end
return 0
