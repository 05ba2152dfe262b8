"""``pyxccl doctor DIR``: who is stuck where, from every rank's flight-recorder dump.

Each rank that saw a failure (or got SIGTERM/SIGUSR1) wrote
``DIR/pyxccl-rank<N>.json`` (``PYXCCL_DUMP_DIR``, see ``core/recorder.py``).
For every communicator in them, the doctor compares the ranks' last
collectives and says in one paragraph which rank never entered the call the
others wait in, which ranks left no dump (killed, or exited first), and what
the ranks' errors were::

    $ pyxccl doctor /tmp/dumps
    communicator 00000000 (world, 8 ranks): rank 3 never entered allreduce #118 (last completed #117);
    ranks 0-2 and 4-7 wait in allreduce #118 for rank 3.
"""
from __future__ import annotations

import glob
import json
import os

from .core.recorder import CSEQ, DONE, ERROR, OP, PEER, QUEUED, SEQ, STATE
from .ranks import ranges


def load(where: str) -> list[dict]:
    """Every rank's dump in directory ``where`` (unreadable files are skipped, and named)."""
    docs = []
    for path in sorted(glob.glob(os.path.join(where, "pyxccl-rank*.json"))):
        try:
            with open(path) as f:
                docs.append(json.load(f))
        except (OSError, ValueError) as e:
            docs.append({"unreadable": f"{os.path.basename(path)}: {e}"})
    return docs


def diagnose(docs: list[dict]) -> list[str]:
    """One paragraph per communicator found in the dumps."""
    comms: dict[str, dict] = {}       # id -> {"size", "world", "ranks": {comm rank: (doc, comm)}}
    notes = [f"skipped {d['unreadable']}" for d in docs if "unreadable" in d]
    for d in docs:
        for c in d.get("communicators", ()):
            e = comms.setdefault(c["id"], {"size": c["size"], "world": c["world"], "ranks": {},
                                           "world_ranks": c["world_ranks"]})
            e["ranks"][c["rank"]] = (d, c)
    out = [_one(cid, e) for cid, e in sorted(comms.items(), key=lambda kv: (not kv[1]["world"], kv[0]))]
    return notes + [p for p in out if p]


def _one(cid: str, e: dict) -> str:
    size, present = e["size"], e["ranks"]
    head = f"communicator {cid} ({'world' if e['world'] else 'sub-communicator'}, {size} ranks)"
    last_in, last_done, current = {}, {}, {}
    for r, (_, c) in present.items():
        colls = [op for op in c["ops"] if op[CSEQ]]
        entered = [op for op in colls if op[STATE] != QUEUED]
        last_in[r] = max((op[CSEQ] for op in entered), default=0)
        last_done[r] = max((op[CSEQ] for op in colls if op[STATE] == DONE), default=0)
        running = [op for op in c["ops"] if op[STATE] not in (DONE, QUEUED)]
        current[r] = running[-1] if running else None
    missing = [r for r in range(size) if r not in present]
    lost = sorted({c["error"]["peer"] for _, c in present.values()
                   if c["error"] and c["error"]["type"] == "PeerLostError" and c["error"]["peer"] is not None})
    errors = [c["error"] for _, c in present.values() if c["error"]]
    k = max(last_in.values(), default=0)
    name = next((op[OP] for _, c in present.values() for op in c["ops"] if op[CSEQ] == k), "collective")
    behind = [r for r in present if last_in[r] < k]
    waiting = [r for r in present if last_in[r] == k and last_done[r] < k]
    says = []
    for r in sorted(behind):
        cur = current[r]
        where = f", and waits in {_p2p(cur)}" if cur and not cur[CSEQ] else ""
        says.append(f"rank {r} never entered {name} #{k} (last completed #{last_done[r]}{where})")
    if missing:
        how = "lost (killed or exited)" if set(missing) <= set(lost) else "left no dump (killed, exited first, or " \
                                                                            "PYXCCL_DUMP_DIR unset there)"
        says.append(f"{ranges(missing)} {how}")
    if waiting:
        blame = behind + missing or sorted({er["peer"] for er in errors if er["peer"] is not None})
        says.append(f"{ranges(waiting)} wait in {name} #{k}" + (f" for {ranges(blame)}" if blame else ""))
    for r in sorted(present):
        cur = current[r]
        if cur is not None and not cur[CSEQ] and r not in behind:
            says.append(f"rank {r} waits in {_p2p(cur)}")
    kinds = sorted({er["type"] for er in errors})
    if "CollectiveMismatchError" in kinds:
        first = next(er for er in errors if er["type"] == "CollectiveMismatchError")
        says.append(f"the ranks disagreed: {first['message']}")
    if not says:
        if not errors:
            return ""
        says.append(f"every rank completed #{k}")
    if errors:
        says.append("errors: " + ", ".join(f"{sum(er['type'] == t for er in errors)} x {t}" for t in kinds))
    return f"{head}: " + "; ".join(says) + "."


def _p2p(op) -> str:
    peer = f" {'from' if 'recv' in op[OP] else 'to'} rank {op[PEER]}" if op[PEER] is not None else ""
    err = f", {op[ERROR]['type']}" if op[ERROR] else ""
    return f"{op[OP]}{peer} (call #{op[SEQ]}{err})"


def main(where: str) -> int:
    docs = load(where)
    if not docs:
        print(f"pyxccl doctor: no dumps (pyxccl-rank*.json) in {where}; run the job with PYXCCL_DUMP_DIR={where}")
        return 1
    ranks = sorted(d["world_rank"] for d in docs if "world_rank" in d)
    print(f"{len(ranks)} dumps ({ranges(ranks) if ranks else 'none readable'}) in {where}")
    for p in diagnose(docs):
        print(p)
    return 0
