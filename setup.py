"""The compiled cores of torchestimator (everything else is in pyproject.toml).

Both extensions are plain C against the Python C API (no numpy headers, so the
build needs nothing but a C compiler and Python's headers) and both are
optional: where no compiler is found or a build fails, setuptools warns and the
install goes on without them; torchestimator then runs its pure-Python paths
(torchestimator._native says which path is active).
"""

from setuptools import Extension, setup

_FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(
    ext_modules=[
        Extension("torchestimator._native._records", ["src/torchestimator/_native/records.c"],
                  extra_compile_args=_FLAGS, optional=True),
        Extension("torchestimator._native._examples", ["src/torchestimator/_native/examples.c"],
                  extra_compile_args=_FLAGS, optional=True),
    ],
)
