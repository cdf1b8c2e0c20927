"""Build the accelerators of ember-guards; metadata lives in pyproject.toml.

- ``_native`` (C, Python C API only): tensor, module, state and aliasing checks, and
  stamps (``_stamps.c``: which long-lived objects changed since the guards last passed).
  Required: ember-capture needs a C compiler too. The pure-Python twins in
  ``ember/guards/_accel.py`` remain for ``EMBER_GUARDS_PURE_PYTHON=1`` and as the
  reference the tests compare the native code against.
- ``_tensor_match`` (C++, against torch's headers): the tensor check read straight
  from torch's C++ tensors, about 10x faster than through torch's Python getters.
  Built only when torch is importable while building (``pip install
  --no-build-isolation``, as every nox session does); otherwise the C check serves.
"""

from setuptools import Extension, setup

extensions = [
    Extension(
        "ember.guards._native", sources=["src/ember/guards/_native.c", "src/ember/guards/_stamps.c"]
    )
]

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:  # an isolated build without torch: the C tensor check serves
    commands = {}
else:
    extensions.append(
        CppExtension(
            "ember.guards._tensor_match",
            sources=["src/ember/guards/_tensor_match.cpp"],
            extra_compile_args=["-O2", "-std=c++20"],
        )
    )
    commands = {"build_ext": BuildExtension.with_options(no_python_abi_suffix=False)}

setup(ext_modules=extensions, cmdclass=commands)
