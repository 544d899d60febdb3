"""``im-server bench``: a load generator on the Python client, with a bare WebSocket echo
measured in the same run as the baseline (see docs/performance.md). Also what the other
harnesses share: ``cluster`` (stores and server processes of their own) and ``chaos``
(kill -9 under load, the invariants checked afterwards)."""
