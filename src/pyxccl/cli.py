"""The ``pyxccl`` command: ``pyxccl run -n 4 script.py`` (more subcommands register below)."""
from __future__ import annotations

import argparse
import sys

_COMMANDS = {}


def command(name: str, help: str):
    """Register ``setup(subparser)`` returning the function that runs the subcommand."""
    def deco(setup):
        _COMMANDS[name] = (help, setup)
        return setup
    return deco


@command("run", "start this host's ranks of a script or command (like torchrun; one host or several)")
def _run(p: argparse.ArgumentParser):
    p.description = ("Start this host's ranks, like torchrun with a static rendezvous. One host: "
                     "pyxccl run -n 4 script.py. Several hosts: on host i of H, pyxccl run --nnodes H "
                     "--node-rank i --nproc-per-node L --master-addr ADDR_OF_HOST_0 --master-port P script.py. "
                     "Output lines are prefixed with [global rank].")
    p.add_argument("-n", "--nproc-per-node", "--nproc_per_node", "--nproc", dest="nproc", type=_nproc,
                   required=True, metavar="L", help="ranks on this host; or every host's count, in node order "
                   "(2,1,2), the same list on every host")
    p.add_argument("--nnodes", type=_nnodes, default=1, help="number of hosts (default 1)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0,
                   help="this host's index, 0..nnodes-1 (default 0); node 0 holds rank 0 and the store")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default="127.0.0.1",
                   help="address of node 0 as every host reaches it: rank 0 serves the store there")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=None,
                   help="port of rank 0's store (default on one host: a free one; required with --nnodes > 1)")
    p.add_argument("--standalone", action="store_true",
                   help="one host, a free port (torchrun's flag; the default with --nnodes 1)")
    p.add_argument("--keep-going", action="store_true",
                   help="a rank that fails does not stop the others (jobs that recover with comm.shrink())")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="script.py args..., -m module args..., or a command")

    def go(a) -> int:
        from .launcher import run
        cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
        if not cmd:
            p.error("give a script or command to run")
        if a.standalone and a.nnodes != 1:
            p.error(f"--standalone is one host; it does not go with --nnodes {a.nnodes}")
        from . import _env
        from ._errors import InvalidArgumentError
        try:
            _env.check()        # a bad variable refused here once, not by every rank as it starts
            return run(a.nproc, cmd, nnodes=a.nnodes, node_rank=a.node_rank, master_addr=a.master_addr,
                       master_port=a.master_port, keep_going=a.keep_going)
        except InvalidArgumentError as e:
            p.error(str(e).removeprefix("pyxccl run: "))
    return go


def _nproc(text: str):
    """torchrun's --nproc-per-node as a count, or pyxccl's list of every node's count ("2,1,2")."""
    parts = text.split(",")
    if not all(x.strip().isdecimal() and int(x) > 0 for x in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of ranks, or one per node (2,1,2)")
    return int(parts[0]) if len(parts) == 1 else [int(x) for x in parts]


def _nnodes(text: str) -> int:
    """A number of hosts; torchrun's "MIN:MAX" only when MIN == MAX (pyxccl run has no elastic rendezvous)."""
    lo, _, hi = text.partition(":")
    hi = hi or lo
    if not (lo.strip().isdecimal() and hi.strip().isdecimal() and int(lo) == int(hi) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of hosts (elastic ranges such as "
                                         f"1:4 are torchrun's, not pyxccl's)")
    return int(lo)


_RUN_VALUE_OPTIONS = {"-n", "--nproc-per-node", "--nproc_per_node", "--nproc", "--nnodes", "--node-rank",
                      "--node_rank", "--master-addr", "--master_addr", "--master-port", "--master_port"}
_RUN_FLAGS = {"-h", "--help", "--standalone", "--keep-going"}


def _split_run_command(argv: list[str]) -> list[str]:
    """Put "--" before the command of `pyxccl run`, so `run -n 2 -m mod -x` keeps -m and -x for it."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv
        if a in _RUN_VALUE_OPTIONS:
            i += 2
        elif a.startswith("--") and "=" in a or a.startswith("-n") and a[2:].replace(",", "").isdigit() \
                or a in _RUN_FLAGS:
            i += 1
        else:
            return argv[:i] + ["--"] + argv[i:]
    return argv


def main(argv=None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the subcommand, return its exit code."""
    parser = argparse.ArgumentParser(prog="pyxccl", description="pyxccl collective communication")
    sub = parser.add_subparsers(dest="command", required=True)
    runners = {}
    for name, (help_, setup) in _COMMANDS.items():
        runners[name] = setup(sub.add_parser(name, help=help_, description=help_))
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        argv = _split_run_command(argv)
    args = parser.parse_args(argv)
    return runners[args.command](args)


@command("info", "print the topology, the measured link figures and the tuner's choices")
def _info(p: argparse.ArgumentParser):
    p.add_argument("-n", "--nproc", type=int, default=None,
                   help="start this many local ranks and report on them (default: the launcher's ranks)")

    def go(a) -> int:
        import os
        if a.nproc and "RANK" not in os.environ:
            from .launcher import run
            return run(a.nproc, [sys.executable, "-m", "pyxccl", "info"])
        from .info import report
        report()
        return 0
    return go


@command("bench", "nccl-tests style benchmark of the collectives on local ranks")
def _bench(p: argparse.ArgumentParser):
    from .bench import add_arguments, main
    add_arguments(p)
    return main


@command("doctor", "say who is stuck where, from the ranks' flight-recorder dumps (PYXCCL_DUMP_DIR)")
def _doctor(p: argparse.ArgumentParser):
    p.add_argument("dir", help="the directory the ranks dumped to (their PYXCCL_DUMP_DIR)")

    def go(a) -> int:
        from .doctor import main
        return main(a.dir)
    return go


@command("trace", "merge or summarize the timelines that PYXCCL_TRACE=DIR wrote (a Chrome/Perfetto trace per rank)")
def _trace(p: argparse.ArgumentParser):
    sub = p.add_subparsers(dest="action", required=True)
    text = "merge every rank's trace into one file (open it in ui.perfetto.dev)"
    m = sub.add_parser("merge", help=text, description=text)
    m.add_argument("dir", help="the PYXCCL_TRACE directory")
    m.add_argument("-o", "--output", default=None, help="the merged file (default DIR/trace.json)")
    text = ("per rank: communication time, the part not overlapped with compute, its share of the step; flags "
            "a share above 30%% with what to try")
    s = sub.add_parser("summary", help=text, description=text)
    s.add_argument("dir", help="the PYXCCL_TRACE directory (or one trace file)")

    def go(a) -> int:
        from . import trace
        try:
            if a.action == "merge":
                print(trace.merge(a.dir, a.output))
            else:
                print(trace.format_summary(trace.summary(a.dir)))
        except (OSError, ValueError) as e:      # no such directory, no traces in it, cannot write -o
            (m if a.action == "merge" else s).error(str(e))
        return 0
    return go


@command("sim", "simulate collectives on a modelled cluster: time, algbw and busbw per algorithm")
def _sim(p: argparse.ArgumentParser):
    from .sim import report
    report.add_arguments(p)
    p.epilog = "Runs the algorithms' real schedules through pyxccl's cost model (docs/sim.md)."
    return report.main


@command("plan", "estimate a training step's communication per rank: primitives, calls, bytes, time, share")
def _plan(p: argparse.ArgumentParser):
    from .plan.cli import add_arguments, main
    add_arguments(p)
    return main


if __name__ == "__main__":      # after every @command, so all subcommands are registered
    sys.exit(main())
