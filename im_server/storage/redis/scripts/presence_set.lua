-- Record which users (and which of their devices) hold a connection on this node, and find
-- who went online or offline across all nodes. A user is online while some live node (a
-- member of the presence nodes zset whose expiry is in the future) lists it.
-- ARGV[1..6] key pieces (keys.PRESENCE_PIECES): nodes zset, pending zset, user-set prefix,
--            node-set prefix, last-seen prefix, devices-hash prefix
-- ARGV[7] this node, ARGV[8] now (ms), ARGV[9] offline grace (ms), ARGV[10] last_seen TTL (ms)
-- ARGV[11..] pairs: user_id, the user's device ids with a connection here joined by spaces
--            ("" when it has none here any more)
-- The devices hash gets this node's field set to the list (or removed), whatever else
-- changed: the list changes while the user stays online (a second device connects here).
-- A user that goes online everywhere is returned (announce it now) unless an offline of
-- it is still pending: then that offline is dropped and nothing is announced (a flap).
-- A user that goes offline everywhere gets its last_seen and a pending offline, due
-- after the grace (the sweep announces it unless the user is back by then).
-- Returns the user ids to announce online.
local nodes, pending, upre, npre, lpre = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local dpre = ARGV[6]
local node, now, grace, ttl = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10]

local function others_live(ukey)
  for _, m in ipairs(redis.call('SMEMBERS', ukey)) do
    if m ~= node then
      local s = redis.call('ZSCORE', nodes, m)
      if s and tonumber(s) > now then
        return true
      end
    end
  end
  return false
end

local online = {}
for i = 11, #ARGV - 1, 2 do
  local user = ARGV[i]
  local ukey = upre .. user
  local devices = ARGV[i + 1]
  if devices ~= '' then
    redis.call('HSET', dpre .. user, node, devices)
    if redis.call('SADD', ukey, node) == 1 then
      redis.call('SADD', npre .. node, user)
      if not others_live(ukey) and redis.call('ZREM', pending, user) == 0 then
        online[#online + 1] = user
      end
    end
  else
    redis.call('HDEL', dpre .. user, node)
    if redis.call('SREM', ukey, node) == 1 then
      redis.call('SREM', npre .. node, user)
      if not others_live(ukey) then
        redis.call('SET', lpre .. user, ARGV[8], 'PX', ttl)
        redis.call('ZADD', pending, now + grace, user)
      end
    end
  end
end
return online
