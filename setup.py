"""The optional compiled helper (pyxccl._native): built from source by pip when a C compiler is
there; without it pyxccl runs the same schedules in pure Python (PYXCCL_NATIVE=0 forces that)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("pyxccl._native", ["src/pyxccl/_native.c"], optional=True,
                             extra_compile_args=["-O3", "-std=gnu11"]),
                   Extension("pyxccl.sim._simcore", ["src/pyxccl/sim/_simcore.c"], optional=True,
                             extra_compile_args=["-O3", "-std=c99"])])
