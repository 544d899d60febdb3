-- A partition's boot marker, against the run id of the node serving the partition (on a
-- Cluster each partition's node has its own): read it, and with ARGV[1] = "set" write
-- that run id into it.
-- KEYS[1] the partition's boot marker (keys.boot)
-- Returns {marker or "" when missing, this node's run id}.
local info = redis.call('INFO', 'server')
local at = string.find(info, 'run_id:', 1, true)
local rid = string.sub(info, at + 7, at + 46)
local old = redis.call('GET', KEYS[1]) or ''
if ARGV[1] == 'set' then
  redis.call('SET', KEYS[1], rid)
end
return {old, rid}
