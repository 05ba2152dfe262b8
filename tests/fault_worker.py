"""Run on every emulated host by tests/test_host_faults.py (via ``pyxccl run``): allreduce in a
loop until the test breaks a host, then record what this rank raised and how long after the
break it came (the break time is in the file ``<dir>/broken``)."""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import pyxccl

out = Path(sys.argv[1])
comm = pyxccl.init(timeout=60)
x = np.ones(1 << 14, np.float32)
comm.allreduce(x)
(out / f"ready.{comm.rank}").touch()
record = {"rank": comm.rank, "host": os.uname().nodename}
try:
    while True:
        comm.allreduce(x)
        time.sleep(0.01)
except pyxccl.PyxcclError as e:
    now = time.time()
    broken = out / "broken"
    record.update(error=type(e).__name__, message=str(e), peer=e.peer,
                  after=now - float(broken.read_text()) if broken.exists() else None)
(out / f"tmp.{comm.rank}").write_text(json.dumps(record))
(out / f"tmp.{comm.rank}").rename(out / f"result.{comm.rank}")      # whole, when the test reads it
time.sleep(30)   # stay: a rank that exits would be news to the others (the test tears the hosts down)
os._exit(0)
