"""The compiled bulk handlers (``spark_jetstream/client/_speedups.c``, decision 0029), an optional extension: where no C
compiler is, or the build fails, the package installs without it and uses its pure-Python twins. Everything else is
in ``setup.cfg``."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "spark_jetstream.client._speedups",
            ["spark_jetstream/client/_speedups.c"],
            optional=True,  # a failed build is a warning: the pure-Python package still installs
            py_limited_api=True,  # CPython 3.11's stable ABI (Py_LIMITED_API in the source): a wheel per platform
        )
    ],
)
