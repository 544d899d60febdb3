-- Atomic sends, many per call: for each send, dedupe (sender, client_msg_id), check the
-- sender's permission, allocate the conversation's next seq and queue the message on the
-- stream. One round trip for a whole batch of sends arriving together.
-- KEYS[1] stream      (one partition per call)
-- KEYS[2] the partition's boot marker
-- Per send, the script joins its keys from pieces of the key templates around their
-- parts (keys.send_key_pieces(partition): the layout is spelled in keys.py only), all
-- carrying the partition's {p<N>} tag, so the whole call stays in the stream's slot:
--   ARGV[4..6]   dedupe          sender, client_msg_id -> "conv|seq|server_time", with a TTL
--   ARGV[7..8]   seq hash        conv: fields cur, lim, rid (the run id of the node that
--                                installed the block: extend_seq.lua)
--   ARGV[9..10]  permission hash conv: field <user_id> -> "ok" | code | "muted:<until ms>"
--                (refused while the send's server_time is before until); "_l" = loaded
--   ARGV[11..12] perm epoch      conv
-- ARGV[1] cold ("1": dedupe may be missing here, ask PostgreSQL first), ARGV[2]
-- dedupe_ttl_seconds, ARGV[3] low_water (refill the seq block in the background when
-- fewer seqs than this remain), then from ARGV[13] one value per send:
-- its fields joined by NUL: conv_id, sender_id, client_msg_id, content_type,
-- content_json, server_time, skip_perm ("1" = a server-made message, or a single chat
-- whose lookup failed: fail open), skip_cold ("1" = PostgreSQL was asked). (JSON text
-- never holds a raw NUL, nor do the other fields.) A send that mentions or replies has
-- three more fields, which this script passes on untouched: mentions (comma-joined ids),
-- mention_all ("1"/"0"), reply_to (a seq or empty); see store.encode_extras. A queued
-- send becomes the stream entry {q: seq, d: that value}.
-- Returns one entry per send (parsed by replies.parse_send):
--   {"ok", seq, server_time, low}   queued; low = 1 when the seq block runs short
--   {"dup", "conv|seq|server_time"} a repeat of an earlier send
--   {"denied", code}                not_friends | blocked | not_member | muted
--   {"perm_cold", epoch}            load the permission hash, then call again
--   {"need_block"}                  reserve a seq block in PostgreSQL, then call again
--   {"reset"}                       this Redis lost its data (no boot marker)
--   {"check_pg"}                    look for the dedupe key in PostgreSQL, then call again
local function split(s)
  local f, i = {}, 1
  while true do
    local j = string.find(s, '\0', i, true)
    if not j then
      f[#f + 1] = string.sub(s, i)
      return f
    end
    f[#f + 1] = string.sub(s, i, j - 1)
    i = j + 1
  end
end

-- The run id of the node running this call. A seq counter whose block was installed
-- under another run id is not trusted: the node restarted (its AOF may end before the
-- last increments), or it is a replica promoted by a fail-over (replication is
-- asynchronous). The next send then reserves a fresh block above every seq handed out.
-- Read here, not passed by the client: on a Cluster each partition's node has its own.
local function node_run_id()
  local info = redis.call('INFO', 'server')
  local at = string.find(info, 'run_id:', 1, true)
  return string.sub(info, at + 7, at + 46)
end

local dd1, dd2, dd3 = ARGV[4], ARGV[5], ARGV[6]
local seq1, seq2, perm1, perm2, pe1, pe2 = ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local rid
local out = {}
local booted = redis.call('EXISTS', KEYS[2]) == 1
for i = 13, #ARGV do
  local a = split(ARGV[i])
  local conv, sender, cmid, ts = a[1], a[2], a[3], a[6]
  local kdd = dd1 .. sender .. dd2 .. cmid .. dd3
  local kseq = seq1 .. conv .. seq2
  local kperm = perm1 .. conv .. perm2
  local res
  local dup = redis.call('GET', kdd)
  if dup then
    res = {'dup', dup}
  elseif not booted then
    res = {'reset'}
  else
    if a[7] ~= '1' then
      local st = redis.call('HGET', kperm, sender)
      if not st then
        if redis.call('HEXISTS', kperm, '_l') == 0 then
          res = {'perm_cold', redis.call('GET', pe1 .. conv .. pe2) or '0'}
        else
          res = {'denied', 'not_member'}
        end
      elseif st ~= 'ok' then
        if string.sub(st, 1, 6) == 'muted:' then
          if tonumber(string.sub(st, 7)) > tonumber(ts) then
            res = {'denied', 'muted'}
          end
        else
          res = {'denied', st}
        end
      end
    end
    if not res and ARGV[1] == '1' and a[8] ~= '1' then
      res = {'check_pg'}
    end
    if not res then
      local s = redis.call('HMGET', kseq, 'cur', 'lim', 'rid')
      rid = rid or node_run_id()
      if not s[1] or not s[2] or s[3] ~= rid or tonumber(s[1]) >= tonumber(s[2]) then
        res = {'need_block'}
      else
        local seq = redis.call('HINCRBY', kseq, 'cur', 1)
        -- the entry: its seq, and the send's fields as they came (the persister
        -- reads conv_id, sender_id, client_msg_id, content_type, content, server_time)
        redis.call('XADD', KEYS[1], '*', 'q', seq, 'd', ARGV[i])
        redis.call('SET', kdd, conv .. '|' .. seq .. '|' .. ts, 'EX', tonumber(ARGV[2]))
        local low = 0
        if tonumber(s[2]) - seq < tonumber(ARGV[3]) then
          low = 1
        end
        res = {'ok', seq, ts, low}
      end
    end
  end
  out[#out + 1] = res
end
return out
