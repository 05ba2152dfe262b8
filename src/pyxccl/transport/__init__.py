"""The platform layer: how bytes move between processes.

- ``base.py``: the transport interface (a Peer) and framing; ``tcp.py``, ``shm.py``: transports;
- ``mesh.py``: the connections of one job, made on first use (who dials whom, which transport per
  pair), and the news it passes to communicators (a lost peer, an error found in a call);
- ``progress.py``: the one thread per mesh that reads every connection and runs the acceptor's
  handshakes; ``fds.py``: the descriptor limit;
- ``mailbox.py``: matching messages to posted receives, fingerprints of collectives;
- ``auth.py``: the HMAC handshake every connection starts with; ``topology.py``: host identity,
  NUMA node, the address to listen on;
- ``segment.py``, ``cma.py``: the one-host shared segment and single-copy reads.
"""
