"""Build of ember-capture's C extension (the PEP 523 frame hook).

Project metadata lives in pyproject.toml; setuptools reads both.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ember.capture._eval_frame",
            sources=["src/ember/capture/_eval_frame.c"],
            depends=[
                "src/ember/capture/_frame_311.h",
                "src/ember/capture/_foreign.h",
                "src/ember/capture/_callback_skips.h",
            ],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ],
)
