"""The tuner's link figures: measured as the fastest of repetitions, checked at init against what
runs see now, kept in a file that carries the machine's fingerprint and an age, validated, written
atomically, and never the user's file during the tests.

No assertion here depends on how fast this machine is: timings come from a virtual clock that
the fake communicator advances by the cost each operation is given.
"""
from __future__ import annotations

import copy
import json
import math
import multiprocessing as mp
import os
import time
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyxccl._errors import InvalidArgumentError
from pyxccl.testing import RankPool
from pyxccl import probe
from pyxccl.tuning import Machine, Tuner, linkcache
from pyxccl.tuning.linkcache import LinkCacheWarning

US = 1e-6


class VirtualComm:
    """Rank 0 of a one-host communicator of ``size`` ranks, alone: every broadcast is its own, every
    message and segment round advances ``now`` by what it is set to cost (``seg`` may be a list:
    the cost of each successive round, the last repeating)."""

    def __init__(self, size=2, seg=2.5 * US, alpha=100 * US, beta=1e-10, segment=True):
        self.rank, self.size, self.now, self.segment = 0, size, 1000.0, segment
        self.seg, self.alpha, self.beta, self.rounds = seg, alpha, beta, 0

    def clock(self) -> float:
        self.now += 1e-9             # a numpy add is not free: gamma and copy come out positive
        return self.now

    def link_class(self, a, b):
        return "self" if a == b else "shm"

    def algorithms(self, primitive):
        return ["segment", "ring"] if self.segment else ["ring"]

    def broadcast_object(self, obj=None, root=0):
        return obj

    def barrier(self, algorithm=None):
        if algorithm == "segment":
            seg = self.seg if not isinstance(self.seg, list) else self.seg[min(self.rounds, len(self.seg) - 1)]
            self.rounds += 1
            self.now += seg

    def send(self, buf, peer, tag):          # a round trip is two of these: alpha each way
        self.now += self.alpha + buf.nbytes * self.beta

    recv = send


def entry_json(links, measured=None, fp=None, gamma=3e-11, copy_=2e-11):
    return {"fingerprint": fp or linkcache.fingerprint(), "measured": time.time() if measured is None else measured,
            "gamma": gamma, "copy": copy_, "links": copy.deepcopy(links)}


def write(path, *entries):
    doc = {"format": 2, "entries": {linkcache.digest(e["fingerprint"]): e for e in entries}}
    path.write_text(json.dumps(doc))


def read_entries(path) -> dict:
    entries, problems, ours = linkcache.parse(json.loads(path.read_text()))
    assert not problems and ours, problems
    return entries


def mine(path) -> linkcache.Entry:
    fp = linkcache.fingerprint()
    return read_entries(path)[linkcache.digest(fp)][1]


@pytest.fixture
def links(tmp_path, monkeypatch):
    path = tmp_path / "links.json"
    monkeypatch.setenv("PYXCCL_LINKS", str(path))
    monkeypatch.delenv("PYXCCL_LINKS_MAX_AGE", raising=False)
    return path


def measure(comm) -> Machine:
    with warnings.catch_warnings():
        warnings.simplefilter("error", LinkCacheWarning)      # a valid or missing file never warns
        return probe.measure(comm, clock=comm.clock)


def one_host_tuner(m: Machine) -> Tuner:
    return Tuner(2, [0, 0], lambda a, b: "self" if a == b else "shm", m, [2, 2], segment=(2 << 20, True))


# --- 1. repetitions keep the fastest ---------------------------------------------------------------

def test_the_segment_round_is_the_fastest_batch():
    busy = [85 * US] * 31 + [2.5 * US]       # the first three batches of ten run on a busy machine
    c = VirtualComm(seg=busy)
    assert probe.round_alpha(c, (5, 10), c.clock) == pytest.approx(2.5 * US, rel=1e-3)
    c = VirtualComm(seg=busy)
    assert probe.round_alpha(c, (1, 10), c.clock) == pytest.approx(85 * US, rel=1e-3)    # one batch: fooled


def test_ping_latency_is_the_fastest_batch():
    c = VirtualComm(alpha=900 * US)
    first = iter([900 * US] * 40)

    def send(buf, peer, tag):                # busy for the first 20 round trips, then 60 us
        c.now += next(first, 60 * US)
    c.send = c.recv = send
    assert probe.ping_alpha(c, 1, True, (5, 8), c.clock) == pytest.approx(60 * US, rel=1e-3)


def test_a_fresh_probe_keeps_the_fastest_of_each_figure(links):
    c = VirtualComm(seg=[85 * US] * 40 + [2.5 * US])     # busy during the first timing of the round
    m = measure(c)
    assert m.source.startswith("measured")
    assert m.link("seg").alpha == pytest.approx(2.5 * US, rel=1e-3)
    assert m.link("shm").alpha == pytest.approx(100 * US, rel=1e-3)
    assert m.link("shm").beta == pytest.approx(1e-10, rel=1e-2)
    assert mine(links).links["seg:2"] == m.link("seg")


# --- 2. figures checked against what runs see: a busy-recorded file ------------------------------------

USER_BUSY = {"shm": [60e-6, 5.2e-10], "tcp_local": [99e-6, 6.6e-10], "seg:2": [85e-6, 0.0]}


def test_a_busy_recorded_cache_costs_one_reprobe_and_the_tuner_picks_the_segment(links):
    write(links, entry_json(USER_BUSY))
    busy = measure(VirtualComm(seg=85 * US, alpha=60 * US))       # still busy: the file is believed
    assert busy.source == "cached" and busy.link("seg").alpha == 85e-6
    assert one_host_tuner(busy).choose("allreduce", 8) != "segment"    # what users saw: 225 us instead of 17.5

    quiet = measure(VirtualComm(seg=2.5 * US, alpha=60 * US))
    assert quiet.source.startswith("re-measured: seg:2 85.0 us cached, 2.5 us now"), quiet.source
    assert quiet.link("seg").alpha == pytest.approx(2.5 * US, rel=1e-3)
    assert mine(links).links["seg:2"].alpha == pytest.approx(2.5 * US, rel=1e-3)      # rewritten
    assert one_host_tuner(quiet).choose("allreduce", 8) == "segment"
    for seg in (2.5 * US, 3.5 * US, 85 * US):        # later inits, quiet or busy: no second re-probe
        again = measure(VirtualComm(seg=seg, alpha=60 * US))
        assert again.source == "cached" and again.link("seg") == quiet.link("seg")


def test_a_reprobe_in_a_busy_moment_keeps_what_the_check_saw(links):
    """The re-measured figure is never above the quick check that found the file wrong, so the next
    init's check cannot find it wrong again (unless the machine got 3x faster still)."""
    write(links, entry_json(USER_BUSY))
    # the check sees 2.5 us, then the probe itself runs in a busy spell
    m = measure(VirtualComm(seg=[2.5 * US] * 25 + [85 * US]))
    assert m.source.startswith("re-measured")
    assert m.link("seg").alpha == pytest.approx(2.5 * US, rel=1e-3)
    assert measure(VirtualComm(seg=2.5 * US)).source == "cached"


def test_a_cache_better_than_now_is_kept(links):
    write(links, entry_json({"shm": [60e-6, 1e-10], "seg:2": [2.5e-6, 0.0]}))
    m = measure(VirtualComm(seg=50 * US, alpha=400 * US))
    assert m.source == "cached" and m.link("seg").alpha == 2.5e-6 and m.link("shm").alpha == 60e-6


def test_a_new_rank_count_measures_its_round_and_keeps_the_rest(links):
    write(links, entry_json({"shm": [60e-6, 1e-10], "seg:2": [2.5e-6, 0.0]}, measured=time.time() - 100))
    m = measure(VirtualComm(size=4, seg=9 * US, alpha=60 * US))
    assert m.source == "cached, measured seg:4"
    assert m.link("seg").alpha == pytest.approx(9 * US, rel=1e-3)
    e = mine(links)
    assert e.links["seg:2"].alpha == 2.5e-6 and e.links["shm"].alpha == 60e-6
    assert e.measured < time.time() - 50          # the age is the oldest figure's


# --- 3. age and fingerprint -----------------------------------------------------------------------------

GOOD = {"shm": [60e-6, 1e-10], "seg:2": [2.5e-6, 0.0]}


@pytest.mark.parametrize("age, limit, used", [(3600, None, True), (8 * 86400, None, False), (7200, "3600", False),
                                              (7200, "86400", True), (-3600, None, False)])
def test_an_old_entry_is_measured_again(links, monkeypatch, age, limit, used):
    if limit:
        monkeypatch.setenv("PYXCCL_LINKS_MAX_AGE", limit)
    write(links, entry_json(GOOD, measured=time.time() - age))
    m = measure(VirtualComm(seg=2.5 * US, alpha=60 * US))
    assert (m.source == "cached") is used, m.source
    if not used:
        assert "ago" in m.source and mine(links).measured > time.time() - 60


@pytest.mark.parametrize("field, value", [("host", "another-host"), ("cpu", "Another CPU"), ("cpus", 64),
                                          ("affinity", 1), ("kernel", "4.0.0"), ("pyxccl", "0.0.1"),
                                          ("python", "3.8.0"), ("numpy", "1.0.0")])
def test_a_foreign_entry_is_ignored_and_kept(links, field, value):
    other = dict(linkcache.fingerprint(), **{field: value})
    write(links, entry_json({"shm": [1e-6, 1e-12], "seg:2": [0.1e-6, 0.0]}, fp=other))
    m = measure(VirtualComm(seg=2.5 * US, alpha=60 * US))
    assert m.source.startswith("measured") and m.link("seg").alpha == pytest.approx(2.5 * US, rel=1e-3)
    entries = read_entries(links)
    assert set(entries) == {linkcache.digest(other), linkcache.digest(linkcache.fingerprint())}
    assert entries[linkcache.digest(other)][1].links["seg:2"].alpha == 0.1e-6      # the other host's, intact


def test_an_entry_filed_under_our_digest_with_another_fingerprint_is_not_ours(links):
    other = dict(linkcache.fingerprint(), host="elsewhere")
    e = entry_json(GOOD, fp=other)
    links.write_text(json.dumps({"format": 2, "entries": {linkcache.digest(linkcache.fingerprint()): e}}))
    assert measure(VirtualComm()).source.startswith("measured")


def test_a_file_of_the_previous_format_is_replaced_quietly(links):
    links.write_text(json.dumps({"links": {"shm": [1.2e-4, 5e-10], "seg": [2.7e-05, 0.0]}, "gamma": 2.7e-11,
                                 "copy": 2.4e-11, "cores": 2}))
    assert measure(VirtualComm()).source == "measured (written by another pyxccl version)"
    assert mine(links).links["seg:2"].alpha == pytest.approx(2.5 * US, rel=1e-3)


# --- 4. malformed files ---------------------------------------------------------------------------

def _valid():
    return {"format": 2, "entries": {"k": entry_json(copy.deepcopy(GOOD))}}


def _with(edit):
    doc = _valid()
    edit(doc["entries"]["k"])
    return json.dumps(doc)


MALFORMED = {
    "not json": "{links: ",
    "empty": "",
    "binary": b"\xff\xfe\x00garbage",
    "a list": "[1, 2]",
    "a string": '"links"',
    "format as a string": '{"format": "2", "entries": {}}',
    "entries a list": '{"format": 2, "entries": []}',
    "entries missing": '{"format": 2}',
    "entry a number": '{"format": 2, "entries": {"k": 3}}',
    "alpha a string": _with(lambda e: e["links"].update(shm=["60e-6", 1e-10])),
    "gamma a list": _with(lambda e: e.update(gamma=[3e-11])),
    "negative alpha": _with(lambda e: e["links"].update(shm=[-60e-6, 1e-10])),
    "zero alpha": _with(lambda e: e["links"].update({"seg:2": [0, 0]})),
    "negative beta": _with(lambda e: e["links"].update(shm=[60e-6, -1e-10])),
    "NaN": _with(lambda e: e["links"].update(shm=[math.nan, 1e-10])),
    "infinity": _with(lambda e: e.update(copy=math.inf)),
    "huge alpha": _with(lambda e: e["links"].update(shm=[1e300, 1e-10])),
    "a bool": _with(lambda e: e.update(gamma=True)),
    "missing gamma": _with(lambda e: e.pop("gamma")),
    "missing links": _with(lambda e: e.pop("links")),
    "links a list": _with(lambda e: e.update(links=[[60e-6, 1e-10]])),
    "a link of three": _with(lambda e: e["links"].update(shm=[60e-6, 1e-10, 0])),
    "a link a number": _with(lambda e: e["links"].update(shm=60e-6)),
    "unknown class": _with(lambda e: e["links"].update(infiniband=[1e-6, 1e-11])),
    "seg of one rank": _with(lambda e: e["links"].update({"seg:1": [1e-6, 0]})),
    "measured a string": _with(lambda e: e.update(measured="yesterday")),
    "fingerprint a string": _with(lambda e: e.update(fingerprint="vm")),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_file_warns_once_and_is_rewritten(links, name):
    content = MALFORMED[name]
    links.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.warns(LinkCacheWarning) as got:
        m = probe.measure(c := VirtualComm(), clock=c.clock)
    msgs = [str(w.message) for w in got if issubclass(w.category, LinkCacheWarning)]
    assert len(msgs) == 1, msgs
    assert str(links) in msgs[0] and "measures the links again and rewrites the file" in msgs[0], msgs[0]
    assert m.source.startswith("measured") and m.link("seg").alpha == pytest.approx(2.5 * US, rel=1e-3)
    assert mine(links).links["seg:2"] == m.link("seg")       # rewritten, valid
    assert measure(VirtualComm()).source == "cached"         # and no warning the next time


def test_one_bad_entry_leaves_the_others(links):
    doc = _valid()
    doc["entries"]["bad"] = dict(entry_json(GOOD), gamma="fast")
    good_fp = dict(linkcache.fingerprint())
    doc["entries"][linkcache.digest(good_fp)] = entry_json(GOOD)
    links.write_text(json.dumps(doc))
    with pytest.warns(LinkCacheWarning, match=r"entries\['bad'\].gamma is str 'fast', not a number"):
        m = probe.measure(c := VirtualComm(), clock=c.clock)
    assert m.source == "cached"


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.floats(allow_nan=True, allow_infinity=True),
                     st.text(max_size=4))
_json = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids,
                                                                                          max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(["gamma", "copy", "measured", "links", "fingerprint", "shm", "seg:2", "alpha", "beta",
                              "entry", "entries", "doc"]), value=_json)
def test_any_value_anywhere_is_used_only_if_valid(where, value):
    """Whatever a file holds, reading it never raises, and what it yields is a set of finite,
    positive figures of known link classes."""
    doc = _valid()
    e = doc["entries"]["k"]
    if where in ("gamma", "copy", "measured", "links", "fingerprint"):
        e[where] = value
    elif where in ("shm", "seg:2"):
        e["links"][where] = value
    elif where in ("alpha", "beta"):
        e["links"]["shm"][where == "beta"] = value
    elif where == "entry":
        doc["entries"]["k"] = value
    elif where == "entries":
        doc["entries"] = value
    else:
        doc = value
    entries, problems, ours = linkcache.parse(json.loads(json.dumps(doc)))
    for fp, entry in entries.values():
        assert isinstance(fp, dict)
        for k, link in entry.links.items():
            assert k in ("shm", "tcp_local") or k.startswith("seg:")
            assert type(link.alpha) is float and 0 < link.alpha <= 1 and math.isfinite(link.alpha)
            assert type(link.beta) is float and 0 <= link.beta <= 1e-6
        assert 0 < entry.gamma <= 1e-6 and 0 < entry.copy <= 1e-6 and 0 <= entry.measured
    assert entries or problems or not ours or doc == {"format": 2, "entries": {}}


def test_an_unwritable_file_warns_and_the_figures_still_come(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = blocker / "links.json"          # a directory that is a file: cannot be created
    monkeypatch.setenv("PYXCCL_LINKS", str(path))
    with pytest.warns(LinkCacheWarning, match=f"cannot write link figures to {path}.*Set PYXCCL_LINKS"):
        m = probe.measure(c := VirtualComm(), clock=c.clock)
    assert m.link("seg").alpha == pytest.approx(2.5 * US, rel=1e-3)


def test_a_bad_max_age_is_refused_and_unset_is_a_week(monkeypatch):
    monkeypatch.setenv("PYXCCL_LINKS_MAX_AGE", "a week")
    with pytest.raises(InvalidArgumentError, match="PYXCCL_LINKS_MAX_AGE='a week' is not a number from 0 "
                                                   "\\(seconds cached link figures stay valid\\); fix or unset it"):
        linkcache.max_age()
    monkeypatch.delenv("PYXCCL_LINKS_MAX_AGE")
    assert linkcache.max_age() == linkcache.DEFAULT_MAX_AGE


def _hammer(path: str, who: int, rounds: int) -> None:
    """Store this writer's entry ``rounds`` times and read the file between: never a partial file."""
    warnings.simplefilter("error", LinkCacheWarning)
    fp = dict(linkcache.fingerprint(), host=f"writer{who}")
    for i in range(rounds):
        e = linkcache.Entry({"seg:2": linkcache.Link((i + 1) * 1e-6, 0.0)}, 3e-11, 2e-11, time.time())
        assert linkcache.store(path, fp, e)
        got, why = linkcache.load(path, fp)
        assert got is not None, why


def test_concurrent_writers_neither_corrupt_nor_lose_entries(tmp_path):
    path = str(tmp_path / "links.json")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(path, w, 30)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    entries, problems, _ = linkcache.parse(json.loads(open(path).read()))
    assert not problems
    assert sorted(fp["host"] for fp, _ in entries.values()) == [f"writer{w}" for w in range(4)]
    assert all(e.links["seg:2"].alpha == pytest.approx(30e-6) for _, e in entries.values())
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


# --- the collective: real ranks, virtual clock ---------------------------------------------------------

_STEP = 20 * US        # per clock reading: a segment check batch of 8 rounds reads 2.5 us a round


def _step_clock():
    t = [0.0]

    def clock():
        t[0] += _STEP
        return t[0]
    return clock


def remeasure(comm, path):
    old = os.environ.get("PYXCCL_LINKS")
    os.environ["PYXCCL_LINKS"] = path
    try:
        return [probe.measure(comm, clock=_step_clock()) for _ in range(2)]
    finally:
        os.environ["PYXCCL_LINKS"] = old


def test_ranks_agree_on_a_reprobe_of_a_busy_file(pools, tmp_path):
    path = tmp_path / "links.json"
    write(path, entry_json(USER_BUSY))
    first, second = zip(*pools(2).run(remeasure, str(path), transport="shm"))
    assert first[0] == first[1] and second[0] == second[1]        # the same figures on both ranks
    assert [m.source.split(":")[0] for m in first] == ["re-measured"] * 2
    assert [m.source for m in second] == ["cached"] * 2
    assert first[0].link("seg").alpha == pytest.approx(_STEP / 10)       # the probe's batches of 10
    assert mine(path).links["seg:2"] == first[0].link("seg")
    assert "tcp_local" not in mine(path).links      # measured in the same busy moment: gone too


# --- 5. the test suite never touches the user's cache -----------------------------------------------------

def where_figures_go(comm):
    return linkcache.cache_path(), comm.link_figures().source


def test_the_suite_keeps_its_figures_away_from_the_users_cache(tmp_path):
    session = os.environ["PYXCCL_LINKS"]          # conftest's
    assert os.path.basename(os.path.dirname(session)).startswith("pyxccl-test-links-"), session
    assert not session.startswith(os.path.expanduser("~/.cache")), session
    home = tmp_path / "home"
    home.mkdir()
    # rank processes as the suite makes them, with a home of their own to look at
    with RankPool(2, transports=("shm",), env={"HOME": str(home), "XDG_CACHE_HOME": ""}) as pool:
        paths = pool.run(where_figures_go, transport="shm")
    assert [p for p, _ in paths] == [os.environ["PYXCCL_LINKS"]] * 2
    assert os.path.exists(os.environ["PYXCCL_LINKS"])
    assert list(home.iterdir()) == []                      # nothing under ~/.cache/pyxccl
    # the control: without PYXCCL_LINKS the same processes write to the home's cache
    with RankPool(2, transports=("shm",), env={"HOME": str(home), "XDG_CACHE_HOME": "", "PYXCCL_LINKS": ""}) as pool:
        paths = pool.run(where_figures_go, transport="shm")
    assert [p for p, _ in paths] == [str(home / ".cache" / "pyxccl" / "links.json")] * 2
    assert (home / ".cache" / "pyxccl" / "links.json").exists()


def test_the_default_path_follows_xdg_and_ignores_a_relative_one(monkeypatch, tmp_path):
    monkeypatch.delenv("PYXCCL_LINKS")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")
    assert linkcache.cache_path() == str(tmp_path / ".cache" / "pyxccl" / "links.json")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert linkcache.cache_path() == str(tmp_path / "xdg" / "pyxccl" / "links.json")

