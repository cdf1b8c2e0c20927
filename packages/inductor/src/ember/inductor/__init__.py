"""ember.inductor: part of ember, an independent PyTorch 2-style compiler stack.

Lowers aten-level graphs to a loop-level IR, fuses and schedules it, and generates
C++/OpenMP (CPU) or Triton (GPU) kernels. Its API (`compile_graph`) arrives with
issue 8.

Until then the distribution installs, imports and reports its version, and
exports nothing public:

>>> import ember.inductor
>>> ember.inductor.__version__
'0.1.0'
"""

__version__ = "0.1.0"
__all__: list[str] = []
