-- Atomic send: dedupe (sender, client_msg_id), check the sender's permission, allocate the
-- conversation's next seq and queue the message on the stream. One round trip per send.
-- KEYS[1] dedupe key      im:dd:<sender>:<client_msg_id>
-- KEYS[2] seq hash        im:seq:{conv}   fields cur, lim, rid
-- KEYS[3] permission hash im:perm:{conv}  field <user_id> -> "ok" | error code; "_l" = loaded
-- KEYS[4] stream          im:stream:<partition>
-- KEYS[5] boot marker     im:boot
-- KEYS[6] perm epoch      im:pe:{conv}
-- ARGV: conv_id, sender_id, client_msg_id, content_type, content_json, server_time,
--       redis_run_id, skip_perm ("1" = lookup failed, fail open), skip_cold ("1" = the
--       caller checked PostgreSQL for a duplicate already), cold ("1" = dedupe may be
--       missing here, check PostgreSQL first), dedupe_ttl_seconds
-- Returns one of:
--   {"ok", seq, server_time, low}   queued; low = 1 when the seq block runs short
--   {"dup", "conv|seq|server_time"} a repeat of an earlier send
--   {"denied", code}                not_friends | blocked | not_member
--   {"perm_cold", epoch}            load the permission hash, then call again
--   {"need_block"}                  reserve a seq block in PostgreSQL, then call again
--   {"reset"}                       this Redis lost its data (no boot marker)
--   {"check_pg"}                    look for the dedupe key in PostgreSQL, then call again
local dup = redis.call('GET', KEYS[1])
if dup then
  return {'dup', dup}
end
if redis.call('EXISTS', KEYS[5]) == 0 then
  return {'reset'}
end
if ARGV[8] ~= '1' then
  local st = redis.call('HGET', KEYS[3], ARGV[2])
  if not st then
    if redis.call('HEXISTS', KEYS[3], '_l') == 0 then
      return {'perm_cold', redis.call('GET', KEYS[6]) or '0'}
    end
    return {'denied', 'not_member'}
  end
  if st ~= 'ok' then
    return {'denied', st}
  end
end
if ARGV[10] == '1' and ARGV[9] ~= '1' then
  return {'check_pg'}
end
local s = redis.call('HMGET', KEYS[2], 'cur', 'lim', 'rid')
if not s[1] or not s[2] or s[3] ~= ARGV[7] or tonumber(s[1]) >= tonumber(s[2]) then
  return {'need_block'}
end
local seq = redis.call('HINCRBY', KEYS[2], 'cur', 1)
redis.call('XADD', KEYS[4], '*', 'c', ARGV[1], 'q', seq, 's', ARGV[2], 'm', ARGV[3],
  't', ARGV[4], 'b', ARGV[5], 'ts', ARGV[6])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. seq .. '|' .. ARGV[6], 'EX', tonumber(ARGV[11]))
local low = 0
if tonumber(s[2]) - seq < tonumber(ARGV[12]) then
  low = 1
end
return {'ok', seq, ARGV[6], low}
