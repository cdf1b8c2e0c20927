"""Build the optional C accelerator of ember-guards; metadata lives in pyproject.toml.

The extension is required (ember-capture needs a C compiler too); the pure-Python
twins in ``ember/guards/_accel.py`` remain for ``EMBER_GUARDS_PURE_PYTHON=1`` and
as the reference the tests compare the C code against.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ember.guards._native",
            sources=["src/ember/guards/_native.c"],
        )
    ]
)
