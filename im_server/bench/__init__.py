"""``im-server bench``: a load generator on the Python client, with a bare WebSocket echo
measured in the same run as the baseline (see docs/performance.md)."""
