-- Run by every node's presence job: take over the entries of dead nodes, then hand out
-- the offlines that are due. Atomic, so each offline is announced by one node only.
-- ARGV[1..6] key pieces (keys.PRESENCE_PIECES), as in presence_set.lua
-- ARGV[7] now (ms), ARGV[8] last_seen TTL (ms), ARGV[9] at most this many users per call
--         (from dead nodes, and again of due offlines), so one call stays short,
-- ARGV[10] a node's TTL (ms): its expiry in the zset is its last beat + this
-- A dead node is one whose expiry in the nodes zset has passed: each of its users that no
-- live node holds gets last_seen = the node's last beat (when it was last known alive:
-- its expiry less its TTL; now for a node marked dead on purpose, expiry 0) and an
-- offline due now; the dead node's field goes
-- from each of its users' devices hashes (readers skip it already). The node leaves the zset
-- once its set is empty.
-- Returns the due offlines: {user_id, last_seen, user_id, last_seen, ...}.
local nodes, pending, upre, npre, lpre = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local dpre = ARGV[6]
local now, ttl, budget = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
local node_ttl = tonumber(ARGV[10])

local function any_live(ukey)
  for _, m in ipairs(redis.call('SMEMBERS', ukey)) do
    local s = redis.call('ZSCORE', nodes, m)
    if s and tonumber(s) > now then
      return true
    end
  end
  return false
end

local max = budget
local dead_nodes = redis.call('ZRANGEBYSCORE', nodes, '-inf', now, 'WITHSCORES', 'LIMIT', 0, 16)
for d = 1, #dead_nodes - 1, 2 do
  local dead = dead_nodes[d]
  if budget <= 0 then
    break
  end
  local seen = tonumber(dead_nodes[d + 1]) - node_ttl
  if seen <= 0 or seen > now then
    seen = now
  end
  seen = string.format('%d', seen)
  local nkey = npre .. dead
  for _, user in ipairs(redis.call('SPOP', nkey, budget)) do
    local ukey = upre .. user
    redis.call('SREM', ukey, dead)
    redis.call('HDEL', dpre .. user, dead)
    if not any_live(ukey) then
      redis.call('SET', lpre .. user, seen, 'PX', ttl)
      redis.call('ZADD', pending, now, user)
    end
    budget = budget - 1
  end
  if redis.call('SCARD', nkey) == 0 then
    redis.call('ZREM', nodes, dead)
  end
end

local out = {}
for _, user in ipairs(redis.call('ZRANGEBYSCORE', pending, '-inf', now, 'LIMIT', 0, max)) do
  redis.call('ZREM', pending, user)
  out[#out + 1] = user
  out[#out + 1] = redis.call('GET', lpre .. user) or ARGV[7]
end
return out
