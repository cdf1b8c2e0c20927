"""Build the optional accelerator of ember-inductor; metadata lives in pyproject.toml.

``_launch`` (C++, against torch's headers): a generated wrapper's stride checks and
kernel launches read torch's C++ tensors in one call for all of a call's tensors
(``ember/inductor/wrapper_launch.py``). Built only when torch is importable while
building (``pip install --no-build-isolation``, as every nox session does); otherwise
the Python twins in ``wrapper_launch.py`` serve, with the same results.
"""

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:  # an isolated build without torch: the Python twins serve
    extensions, commands = [], {}
else:
    extensions = [
        CppExtension(
            "ember.inductor._launch",
            sources=["src/ember/inductor/_launch.cpp"],
            extra_compile_args=["-O2", "-std=c++20"],
        )
    ]
    commands = {"build_ext": BuildExtension.with_options(no_python_abi_suffix=False)}

setup(ext_modules=extensions, cmdclass=commands)
