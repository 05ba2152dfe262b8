"""Naming sets of ranks in messages ("ranks 0-2, 4-5 and 7"): for errors of the framework and for
the doctor's reports, so it sits below both."""
from __future__ import annotations


def ranges(ranks) -> str:
    """[0, 1, 2, 4, 5, 7] -> "ranks 0-2, 4-5 and 7" ("rank 3" for one)."""
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    parts, start = [], rs[0]
    for a, b in zip(rs, rs[1:] + [None]):
        if b != a + 1:
            parts.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return "ranks " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0])
