"""The wire contract, in one place and without I/O.

- ``types``: the named, bounded types (ids, seqs, ``conv_id``, ``client_msg_id``...).
- ``client_frames``: the frames a client sends, and their parser.
- ``server_frames``: the frames the server sends, and their builders.
- ``close_codes``: the WebSocket close codes.
- ``session``: one connection's protocol state (frames in, commands out).
- ``schema``: the JSON Schema of every frame, generated from the models.

Nothing is imported here, so that ``protocol.ids`` can use ``types`` cheaply."""
