"""The framework layer: what runs a call once the Communicator has checked it.

- ``context.py``: a communicator's state below the API (ranks, sequence numbers, failure,
  dispatch inline or onto the ordered worker);
- ``engine.py``: the ordered worker and Work handles;
- ``plan.py``: a plan per call shape (algorithm, how it runs, reduction, fingerprint);
- ``messages.py`` and ``onehost.py``: the two executors, of message schedules over the transports
  and of segment schedules on one host's shared segment (and its set-up).
"""
