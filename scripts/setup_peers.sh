#!/bin/bash
# Installs the peers of `pyxccl bench --vs` that no pip extra can bring (see README.md, "Benchmark"):
#
#   scripts/setup_peers.sh impi        Intel MPI runtime (impi-rt wheel), used under this Python's mpi4py
#   scripts/setup_peers.sh deepspeed   a venv with CPU torch + DeepSpeed, and DeepSpeed's shm allreduce op built
#   scripts/setup_peers.sh oneccl      oneCCL 2022.2 runtime + headers and the oneccl_bench binary built from
#                                      scripts/peers/oneccl_bench.cpp
#   scripts/setup_peers.sh all         all three
#
# Everything goes to $PYXCCL_PEERS_DIR (default ~/.cache/pyxccl-peers), outside the project's venv: these
# runtimes pin versions (torch+cpu, Intel's libmpi) that must not replace the project's own.
# gloo and mpi (MPICH) come with the pip extra instead: pip install -e '.[peers]'.
# Needs python3 -m venv, pip, g++ (oneccl) and apt-get (libfabric1, for oneccl and impi).
set -euo pipefail
D=${PYXCCL_PEERS_DIR:-$HOME/.cache/pyxccl-peers}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
mkdir -p "$D"

libfabric() {
  # Intel's libmpi and oneCCL dlopen() libfabric.so.1; the pip 'libfabric>=2.6' that the wheels ask for is not
  # on the index, so their deps are skipped (--no-deps) and Debian's libfabric (1.17) is used.
  dpkg -s libfabric1 >/dev/null 2>&1 && return
  if [ "$(id -u)" != 0 ]; then echo "setup_peers.sh: needs Debian's libfabric1: sudo apt-get install libfabric1" >&2; exit 1; fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfabric1 >/dev/null
}

impi() {
  libfabric
  [ -x "$D/impi/bin/python" ] || "$PY" -m venv "$D/impi"
  # The wheel puts lib/libmpi.so.12 and bin/mpiexec (hydra) into the venv's prefix.
  "$D/impi/bin/pip" install -q --no-deps impi-rt==2021.19.0
  test -e "$D/impi/lib/libmpi.so.12" && test -x "$D/impi/bin/mpiexec"
  echo "impi: Intel MPI in $D/impi"
}

deepspeed() {
  [ -x "$D/ds/bin/python" ] || "$PY" -m venv "$D/ds"
  # 'torch==2.13.0+cpu' is the CPU build (this project's machines provide it; elsewhere give pip PyTorch's CPU
  # index in PIP_EXTRA_INDEX_URL); a bare 'torch' would bring the newest CUDA build (GBs).
  # numpy and ml_dtypes: the ranks run pyxccl's own bench code (pyxccl.bench.peers) in this venv.
  "$D/ds/bin/pip" install -q "torch==2.13.0+cpu" "deepspeed==0.19.8" numpy ml_dtypes
  # Build the shm op once now (JIT, a minute), not inside the first timed run.
  DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR="$D/torch_ext" "$D/ds/bin/python" -c \
    "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load()" >/dev/null
  echo "deepspeed: venv $D/ds, shm op in $D/torch_ext"
}

oneccl() {
  libfabric
  [ -x "$D/oneccl/bin/python" ] || "$PY" -m venv "$D/oneccl"
  # --no-deps: oneccl-cpu/impi-rt ask for libfabric>=2.6 (not on the index), oneccl-devel for the SYCL build.
  "$D/oneccl/bin/pip" install -q --no-deps oneccl-cpu==2022.2.0 oneccl-devel==2022.2.0 impi-rt==2021.19.0
  # oneccl-cpu's libccl.so.1 needs libccl.so.2, which only the SYCL wheel 'oneccl' ships: take that one file.
  if [ ! -e "$D/oneccl/lib/libccl.so.2" ]; then
    mkdir -p "$D/whl"
    ls "$D"/whl/oneccl-2022.2.0-*.whl >/dev/null 2>&1 || "$D/oneccl/bin/pip" download -q --no-deps oneccl==2022.2.0 -d "$D/whl"
    "$D/oneccl/bin/python" - "$D" <<'PY'
import glob, os, sys, zipfile
d = sys.argv[1]
data = zipfile.ZipFile(glob.glob(f"{d}/whl/oneccl-2022.2.0-*.whl")[0]).read("oneccl-2022.2.0.data/data/lib/libccl.so.2")
for name in ("libccl.so.2", "libccl.so.2.0"):
    with open(f"{d}/oneccl/lib/{name}", "wb") as f:
        f.write(data)
    os.chmod(f"{d}/oneccl/lib/{name}", 0o755)
PY
  fi
  g++ -O2 -std=c++17 -I"$D/oneccl/include" "$HERE/peers/oneccl_bench.cpp" -o "$D/oneccl_bench" \
      -L"$D/oneccl/lib" -lccl -Wl,-rpath,"$D/oneccl/lib" 2>&1 | grep -v "may conflict" || true
  test -x "$D/oneccl_bench"
  echo "oneccl: $D/oneccl_bench"
}

case "${1:-all}" in
  impi) impi ;;
  deepspeed) deepspeed ;;
  oneccl) oneccl ;;
  all) impi; deepspeed; oneccl ;;
  *) echo "usage: $0 [impi|deepspeed|oneccl|all]" >&2; exit 2 ;;
esac
