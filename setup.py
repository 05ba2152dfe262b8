"""The optional compiled helpers, built from source by pip when a C compiler is there:
pyxccl._native (the one-host executor), pyxccl._kernels (the sparsifiers' kernels) and
pyxccl.tuning._simcore (the cost model's walk: the tuner's and the simulator's). Without them pyxccl
runs the same steps in Python and numpy (PYXCCL_NATIVE=0 forces that for the first two)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("pyxccl._native", ["src/pyxccl/_native.c"], optional=True,
                             extra_compile_args=["-O3", "-std=gnu11"]),
                   Extension("pyxccl._kernels", ["src/pyxccl/_kernels.c"], optional=True,
                             extra_compile_args=["-O3", "-std=gnu11"]),
                   Extension("pyxccl.tuning._simcore", ["src/pyxccl/tuning/_simcore.c"], optional=True,
                             extra_compile_args=["-O3", "-std=c99"])])
