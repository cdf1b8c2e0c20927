"""ember.aotgraph: part of ember, an independent PyTorch 2-style compiler stack.

Turns a captured torch.fx graph into aten-level forward and backward graphs ahead of
time (functionalized, decomposed, partitioned by `default` or `min_cut`) and wraps
them in an autograd.Function. Its API (`aot_compile`, the partitioners,
`default_decompositions`) arrives with issue 7.

Until then the distribution installs, imports and reports its version, and
exports nothing public:

>>> import ember.aotgraph
>>> ember.aotgraph.__version__
'0.1.0'
"""

__version__ = "0.1.0"
__all__: list[str] = []
