-- Where frames for these users go: the nodes listed now in each user's registry entry
-- (keys.user_nodes: a zset node -> expiry), the origin left out. One call instead of a
-- ZRANGEBYSCORE each: a big group's message asks for thousands of users.
-- ARGV[1] the entries' key prefix, ARGV[2] now (ms), ARGV[3] the origin node,
-- ARGV[4] the user ids, comma-separated
-- Returns a flat list: user id, node, user id, node, ... (a user on two nodes twice;
-- a user on no other node not at all).
local prefix, now, origin = ARGV[1], ARGV[2], ARGV[3]
local out = {}
for user in string.gmatch(ARGV[4], '[^,]+') do
  for _, n in ipairs(redis.call('ZRANGEBYSCORE', prefix .. user, now, '+inf')) do
    if n ~= origin then
      out[#out + 1] = user
      out[#out + 1] = n
    end
  end
end
return out
