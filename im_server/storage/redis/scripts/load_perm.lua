-- Fill a conversation's permission hash from PostgreSQL, unless it changed meanwhile.
-- The loader read the epoch before querying PostgreSQL; every change bumps the epoch
-- and deletes the hash, so a load that raced a change is dropped instead of caching
-- stale rights.
-- KEYS[1] permission hash (keys.perm)
-- KEYS[2] perm epoch      (keys.perm_epoch)
-- ARGV: epoch_seen, ttl_seconds, then pairs user_id, status
-- Returns 1 if written, 0 if dropped.
local cur = redis.call('GET', KEYS[2]) or '0'
if cur ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], '_l', '1')
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
