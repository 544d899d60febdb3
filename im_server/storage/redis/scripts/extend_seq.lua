-- Install a seq block reserved in PostgreSQL: seqs (old_reserved, new_reserved] may now
-- be handed out. A cold counter (missing, or written under another Redis run) restarts
-- just above everything ever reserved before, so no seq is reused after a data loss.
-- KEYS[1] seq hash (keys.seq)
-- ARGV: old_reserved, new_reserved
-- The counter is marked with the run id of the node running this (see send_batch.lua).
-- Returns {cur, lim} after the change.
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
local rid = string.sub(info, at + 7, at + 46)
local s = redis.call('HMGET', KEYS[1], 'cur', 'lim', 'rid')
local old = tonumber(ARGV[1])
local new = tonumber(ARGV[2])
if not s[1] or not s[2] or s[3] ~= rid then
  redis.call('HSET', KEYS[1], 'cur', old, 'lim', new, 'rid', rid)
  return {old, new}
end
local lim = tonumber(s[2])
if new > lim then
  lim = new
  redis.call('HSET', KEYS[1], 'lim', lim)
end
return {tonumber(s[1]), lim}
