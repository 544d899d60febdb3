"""Crash under load: kill -9 one component while clients send and read, restart it, and
check what the stores hold afterwards (DESIGN.md invariants 1-4 and 9).

Each scenario starts its own PostgreSQL (fsync on) and Redis (AOF, appendfsync everysec)
in a temp folder, real ``im-server`` processes on them, and four users: two single chats
(A-B, C-D) and one group (A, B, C, D). Every user sends continuously over its WebSocket
with a window of sends in flight, alternating between its single chat and the group; a
send answered ``unavailable`` (or lost with its socket, or unanswered for a while) is
retried with the SAME client_msg_id, on a new socket (the next gateway) if the old one
died. Every user also reports reads (REST and WS, random seqs up to the highest acked
seq of the conversation); the read_seq the server answers, and the ``read`` frames it
pushes, are the confirmed cursors.

Scenarios (``load -> kill -9 -> restart -> load -> stop -> settle -> verify``):

* ``gateway``: two gateways on the same stores, the persister in the second one; the
  first (users A and B connect there) is killed, its clients move to the other one.
* ``persister``: gateways with ``--no-persister`` and ``python -m im_server persister``
  as its own process; killed mid-batch, restarted under the same IM_NODE_NAME (it
  re-reads its own pending entries).
* ``persister-rename``: the same, restarted under another name (XAUTOCLAIM of the dead
  consumer's entries once idle for IM_PERSISTER_CLAIM_IDLE_MS).
* ``redis``: Redis killed, restarted on its AOF (same port, same folder).
* ``postgres``: the postmaster killed, restarted on the same port (crash recovery).
* ``redis-empty``: Redis killed and its AOF deleted, so an EMPTY Redis comes back. The
  acked messages that were still only in the stream are gone with it (no AOF, nothing
  can keep them): they are counted as ``wiped``, not as lost, provided they are the tail
  of each conversation's stream (a hole below a persisted seq would be a real loss).

Verified each time: every ok-acked (conv_id, seq, client_msg_id) is in PostgreSQL exactly
once (``lost``); no (sender, client_msg_id) twice, no (conv_id, seq) twice, no
client_msg_id acked with two seqs and no seq acked for two client_msg_ids
(``duplicated``); per conversation, every seq acked for a send first made after the
restart is above every seq acked before the kill (``seq_violations``); every read cursor
in ``conv_members`` is at least the highest one the server confirmed (``read_regressions``);
resends of old client_msg_ids answer ``duplicate`` with their first seq (``resend_bad``);
the history of each conversation (REST) equals PostgreSQL.

Figures: messages acked under load at the kill (and the stream depth then); the
component's restart time (kill -> back); kill -> first ok ack received after the restart;
kill -> every sender has an ok ack for a send made after the kill (``resume``); the
longest stretch without any ok ack; kill -> everything acked before the kill is in
PostgreSQL (the stream drained of the pre-kill backlog); load stop -> stream empty.

Modules: ``params`` (scenarios, :class:`Params`), ``processes`` (the persister process,
log tails), ``load`` (the clients), ``rig`` (stores, gateways, kill and restart, the
stream monitor), ``checks`` (the invariants), ``report`` (:class:`Result`, the table),
``scenario`` (:func:`run_scenario`). ``./scripts/bench chaos`` runs them with a larger
load; ``tests/integration/test_chaos.py`` with a small one.
"""

from im_server.bench.chaos.params import SCENARIOS, Params
from im_server.bench.chaos.report import Result, print_table
from im_server.bench.chaos.scenario import run_scenario

__all__ = ["SCENARIOS", "Params", "Result", "print_table", "run_scenario"]
