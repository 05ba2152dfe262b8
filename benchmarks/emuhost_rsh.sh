#!/bin/sh
# MPICH hydra's remote shell for emulated hosts (benchmarks/scale.py --emulated): "emuhost_rsh.sh HOST CMD..."
# runs CMD on emulated host HOST through inhost.sh ($EMU_INHOST), entered from scale.py's mount namespace
# ($EMU_ROOT_MNT): mpiexec itself runs on host 0, whose /dev/shm hides the other hosts' directories.
h=$1; shift
exec nsenter --mount="$EMU_ROOT_MNT" -- "$EMU_INHOST" "$h" sh -c "$*"
