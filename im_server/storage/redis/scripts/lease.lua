-- Take or renew a lease: one persister at a time consumes a stream partition, so the
-- messages of a conversation are written in seq order.
-- KEYS[1] lease key (keys.persister_lease)
-- ARGV[1] owner, ARGV[2] ttl_ms, ARGV[3] "1" to release instead
-- Returns 1 when the caller holds the lease (or released it), 0 otherwise.
local cur = redis.call('GET', KEYS[1])
if ARGV[3] == '1' then
  if cur == ARGV[1] then
    redis.call('DEL', KEYS[1])
  end
  return 1
end
if not cur or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
return 0
