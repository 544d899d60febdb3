-- Install a seq block reserved in PostgreSQL: seqs (old_reserved, new_reserved] may now
-- be handed out. A cold counter (missing, or written under another Redis run) restarts
-- just above everything ever reserved before, so no seq is reused after a data loss.
-- KEYS[1] seq hash (keys.seq)
-- ARGV: old_reserved, new_reserved, redis_run_id
-- Returns {cur, lim} after the change.
local s = redis.call('HMGET', KEYS[1], 'cur', 'lim', 'rid')
local old = tonumber(ARGV[1])
local new = tonumber(ARGV[2])
if not s[1] or not s[2] or s[3] ~= ARGV[3] then
  redis.call('HSET', KEYS[1], 'cur', old, 'lim', new, 'rid', ARGV[3])
  return {old, new}
end
local lim = tonumber(s[2])
if new > lim then
  lim = new
  redis.call('HSET', KEYS[1], 'lim', lim)
end
return {tonumber(s[1]), lim}
