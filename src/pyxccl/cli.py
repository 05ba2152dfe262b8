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


@command("run", "start N local ranks of a script or command (like torchrun --standalone)")
def _run(p: argparse.ArgumentParser):
    p.add_argument("-n", "--nproc-per-node", "--nproc", dest="nproc", type=int, required=True,
                   help="number of ranks")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of rank 0's store")
    p.add_argument("--master-port", type=int, default=None, help="port of rank 0's store (default: a free one)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="script.py args..., -m module args..., or a command")

    def go(a) -> int:
        from .launcher import run
        cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
        if not cmd:
            p.error("give a script or command to run")
        from ._errors import InvalidArgumentError
        try:
            return run(a.nproc, cmd, master_addr=a.master_addr, master_port=a.master_port)
        except InvalidArgumentError as e:
            p.error(str(e))
    return go


_RUN_VALUE_OPTIONS = {"-n", "--nproc-per-node", "--nproc", "--master-addr", "--master-port"}


def _split_run_command(argv: list[str]) -> list[str]:
    """Put "--" before the command of `pyxccl run`, so `run -n 2 -m mod -x` keeps -m and -x for it."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv
        if a in _RUN_VALUE_OPTIONS:
            i += 2
        elif a.startswith("--") and "=" in a or (a.startswith("-n") and a[2:].isdigit()) or a in ("-h", "--help"):
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


if __name__ == "__main__":      # after every @command, so all subcommands are registered
    sys.exit(main())
