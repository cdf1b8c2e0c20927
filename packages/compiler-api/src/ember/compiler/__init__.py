"""ember.compiler: part of ember, an independent PyTorch 2-style compiler stack.

The end-user surface: `compile`, backends, `explain`, configuration. Its API arrives
with issue 4 (first `compile()`) and grows with issues 5, 7 and 8.

Until then the distribution installs, imports and reports its version, and
exports nothing public:

>>> import ember.compiler
>>> ember.compiler.__version__
'0.1.0'
"""

__version__ = "0.1.0"
__all__: list[str] = []
