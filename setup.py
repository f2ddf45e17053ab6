"""The native scanner (faultline/_scan.c) is the one thing pyproject.toml cannot declare. It is optional:
where it does not build (no C compiler), faultline reads files with its Polars path (bench/README.md)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("faultline._scan", ["faultline/_scan.c"], optional=True,
                             extra_compile_args=["-O2", "-std=c11"], extra_link_args=["-pthread"])])
