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
-- Commands per send: the dedupe check and claim are one SET NX GET (the key is written
-- only where it was free, with the seq the send is about to take), then XADD. The
-- permission hash is read once per (conversation, sender) and the seq counter once per
-- conversation in a call, and the counter is written once per conversation at the end
-- (nothing else runs while a script does). A send that is refused or has to wait (cold
-- caches, no seq left) looks for its dedupe key first: a repeat of an earlier send is
-- answered as such whatever changed since. Why no write can fail half way: Redis checks
-- for out of memory before a script's first write only; an XADD error is caught, frees
-- its send's key, stores the counters of what was queued, and is the call's answer.
-- Returns one entry per send (parsed by replies.parse_send):
--   {"ok", seq, server_time, low}   queued; low = 1 when the seq block runs short
--   {"dup", "conv|seq|server_time"} a repeat of an earlier send
--   {"denied", code}                not_friends | blocked | not_member | muted
--   {"perm_cold", epoch}            load the permission hash, then call again
--   {"need_block"}                  reserve a seq block in PostgreSQL, then call again
--   {"reset"}                       this Redis lost its data (no boot marker)
--   {"check_pg"}                    look for the dedupe key in PostgreSQL, then call again
-- A send's fields but the content type and content (the script never looks at those, and
-- copying a long text into a Lua string costs more than finding its ends).
local function fields(s)
  local a = string.find(s, '\0', 1, true)
  local b = string.find(s, '\0', a + 1, true)
  local c = string.find(s, '\0', b + 1, true)
  local d = string.find(s, '\0', c + 1, true)
  local e = string.find(s, '\0', d + 1, true)
  local f = string.find(s, '\0', e + 1, true)
  local g = string.find(s, '\0', f + 1, true)
  local h = string.find(s, '\0', g + 1, true) or (#s + 1)
  return string.sub(s, 1, a - 1), string.sub(s, a + 1, b - 1), string.sub(s, b + 1, c - 1),
    string.sub(s, e + 1, f - 1), string.sub(s, f + 1, g - 1), string.sub(s, g + 1, h - 1)
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
local ttl, low_water, cold = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[1] == '1'
local rid
local out = {}
-- Read once per call, not once per send: nothing else runs while a script does, so a
-- value read earlier in this call is still the value. The counters that moved are
-- written by flush(), at the end of the call or before it answers an XADD error.
local perms = {}   -- conv NUL sender -> status, or false when the cache lacks the sender
local loaded = {}  -- conv -> whether its permission cache is loaded ('_l')
local seqs = {}    -- conv -> {cur, lim} of a usable counter, or false
local moved = {}   -- conv -> true once its counter moved in this call
local function flush()
  for conv in pairs(moved) do
    redis.call('HSET', seq1 .. conv .. seq2, 'cur', seqs[conv][1])
  end
end
local booted = redis.call('EXISTS', KEYS[2]) == 1
for i = 13, #ARGV do
  local v = ARGV[i]
  local conv, sender, cmid, ts, skip_perm, skip_cold = fields(v)
  local kdd = dd1 .. sender .. dd2 .. cmid .. dd3
  local res
  if not booted then
    res = {'reset'}
  elseif skip_perm ~= '1' then
    local pk = conv .. '\0' .. sender
    local st = perms[pk]
    if st == nil then
      st = redis.call('HGET', perm1 .. conv .. perm2, sender)
      perms[pk] = st
    end
    if not st then
      local l = loaded[conv]
      if l == nil then
        l = redis.call('HEXISTS', perm1 .. conv .. perm2, '_l') == 1
        loaded[conv] = l
      end
      if l then
        res = {'denied', 'not_member'}
      else
        res = {'perm_cold', redis.call('GET', pe1 .. conv .. pe2) or '0'}
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
  if not res and cold and skip_cold ~= '1' then
    res = {'check_pg'}
  end
  local sq
  if not res then
    sq = seqs[conv]
    if sq == nil then
      local s = redis.call('HMGET', seq1 .. conv .. seq2, 'cur', 'lim', 'rid')
      rid = rid or node_run_id()
      sq = s[1] and s[2] and s[3] == rid and {tonumber(s[1]), tonumber(s[2])}
      seqs[conv] = sq
    end
    if not sq or sq[1] >= sq[2] then
      res = {'need_block'}
    end
  end
  if res then
    -- a repeat of an earlier send is answered as such, whatever else changed since
    local dup = redis.call('GET', kdd)
    if dup then
      res = {'dup', dup}
    end
  else
    -- the dedupe check and the claim in one command: written only where it was free
    local seq = sq[1] + 1
    local dup = redis.call('SET', kdd, conv .. '|' .. seq .. '|' .. ts, 'NX', 'GET', 'EX', ttl)
    if dup then
      res = {'dup', dup}
    else
      -- the entry: its seq, and the send's fields as they came (the persister
      -- reads conv_id, sender_id, client_msg_id, content_type, content, server_time)
      local added = redis.pcall('XADD', KEYS[1], '*', 'q', seq, 'd', v)
      if type(added) == 'table' and added.err then
        -- not queued: free the key, keep the counter of what was queued, answer the error
        redis.call('DEL', kdd)
        flush()
        return added
      end
      moved[conv] = true
      sq[1] = seq
      local low = 0
      if sq[2] - seq < low_water then
        low = 1
      end
      res = {'ok', seq, ts, low}
    end
  end
  out[#out + 1] = res
end
flush()
return out
