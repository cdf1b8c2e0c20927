"""ember.inductor's settings: the one place ember.inductor reads the environment.

The disk-cache root and ``check`` are ember.aotgraph's settings (one value for both).
A backend option of the same name (``compile(..., options={"cflags": [...]})``) wins
over the setting for that compiled object.

>>> section.get().graph_cache
True
>>> with section.patch(extra_cflags=("-DEMBER_DEMO",)):
...     section.get().extra_cflags
('-DEMBER_DEMO',)
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.aotgraph.section import Section, setting

__all__ = ["InductorSettings", "section"]


@dataclass(frozen=True, slots=True)
class InductorSettings:
    """What ember.inductor reads when it compiles a graph."""

    cxx: str = setting("g++", "the C++ compiler (name or path)", env="CXX")
    cflags: tuple[str, ...] = setting(
        (),
        "flags replacing the default ones (ember.inductor.cache.DEFAULT_CFLAGS); empty:"
        " the defaults. -shared and -fPIC are always added",
        env="EMBER_CFLAGS",
    )
    extra_cflags: tuple[str, ...] = setting(
        (), "flags added after the others, e.g. ('-O2',)", env="EMBER_EXTRA_CFLAGS"
    )
    graph_cache: bool = setting(
        True, "reuse the generated code of graphs seen before (on disk)", env="EMBER_GRAPH_CACHE"
    )
    fallback_random: bool = setting(
        True,
        "random ops run torch's kernels and draw eager's numbers; False: inside the fused"
        " kernels (repeatable under torch.manual_seed, not eager's numbers)",
    )
    trace: bool = setting(
        False, "write each graph's passes to a trace folder", env="EMBER_INDUCTOR_TRACE"
    )
    trace_dir: str = setting(
        "ember_inductor_trace",
        "where the trace folders go (graph000, graph001, ...)",
        env="EMBER_INDUCTOR_TRACE_DIR",
    )
    freezing: bool = setting(
        False,
        "inference graphs read parameters and buffers as constants: batch norm folded into"
        " the conv before it, transposed weights packed, what depends on them alone folded"
        " once; an in-place update of a frozen weight folds again (ember.inductor.freezing)",
        env="EMBER_FREEZING",
    )
    max_autotune: bool = setting(
        False,
        "time a few kernel variants per graph (C++: tile size, parallel threshold, thread"
        " count, matmul path; Triton: block sizes, warps) and keep the fastest, remembered"
        " on disk (mode='max-autotune')",
        env="EMBER_MAX_AUTOTUNE",
    )
    cudagraphs: bool = setting(
        False,
        "graphs of CUDA tensors replay from CUDA graphs, recorded once per shape"
        " (ember.aotgraph.cudagraphs; mode='reduce-overhead')",
        env="EMBER_CUDAGRAPHS",
    )
    cudagraph_copy_outputs: bool = setting(
        False,
        "with cudagraphs: return copies of a replay's outputs, which the next replay would"
        " overwrite (default: the outputs themselves, an error to use once overwritten)",
    )
    conv_channels_last: bool = setting(
        True,
        "graphs with 2-d convolutions on the CPU run them on channels-last activations, as"
        " oneDNN computes them (ember.inductor.layout_conv); outputs keep eager's strides",
        env="EMBER_CONV_CHANNELS_LAST",
    )
    cpu_backend: str = setting(
        "cpp",
        "the printer for graphs of CPU tensors: 'cpp', or 'triton' (Triton's interpreter,"
        " TRITON_INTERPRET=1: for testing the Triton printer without a GPU). CUDA tensors"
        " always get Triton",
        env="EMBER_CPU_BACKEND",
    )
    background_compile: str = setting(
        "cuda",
        "Triton kernels build on a worker thread while the graph's first calls run as aten"
        " calls (ember.inductor.background): 'cuda' (CUDA graphs), 'off', or 'always' (also"
        " Triton's interpreter on the CPU, for tests)",
        env="EMBER_BACKGROUND_COMPILE",
    )
    pure_launch: bool = setting(
        False,
        "wrappers check strides and launch C++ kernels through Python (map and ctypes), not"
        " the C++ launcher ember.inductor._launch (read when a wrapper is bound)",
        env="EMBER_INDUCTOR_PURE_LAUNCH",
    )


#: ember.inductor's settings (``ember.compiler.config.inductor``).
section: Section[InductorSettings] = Section("inductor", InductorSettings)
