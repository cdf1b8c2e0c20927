"""Running fuzzed programs against eager: inputs, observations, comparison, repro (issue 16).

``differential(source, calls, backend)`` loads the program twice (fresh code objects and
globals, so eager and ember share no state), runs each call eagerly and compiled under the
same global state, and returns every difference as a "class: detail" line;
``repro`` turns them into an assertion message with a script that reproduces them.
"""

from __future__ import annotations

import contextlib
import itertools
import linecache
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from fuzzgen import INPUTS, enabled
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from ember.compiler.testing import tolerance

# ---------------------------------------------------------------------------------------------
# Inputs: one call's arguments, built twice from the same seed (for eager and for ember).

LAYOUTS = ["contiguous", "transposed", "sliced"]
ALIASING = ["distinct", "same", "overlap", "row"]  # b is a / a, b overlap / c is a row of a


@dataclass(frozen=True)
class CallSpec:
    """How one call's inputs are made: shape, dtype, layout, aliasing, grad, seed."""

    n: int = 4
    m: int = 5
    dtype: str = "float32"
    layout: str = "contiguous"
    aliasing: str = "distinct"
    grad: bool = False
    seed: int = 0


def call_specs() -> st.SearchStrategy[CallSpec]:
    """A call's inputs; aliasing and grad patterns behind their gates."""
    aliasing = [a for a in ALIASING if a == "distinct" or enabled(f"alias_{a}")]
    return st.builds(
        CallSpec,
        n=st.integers(3, 6),
        m=st.integers(3, 6),
        dtype=st.sampled_from(["float32", "float64"]),
        layout=st.sampled_from(LAYOUTS),
        aliasing=st.sampled_from(aliasing),
        grad=st.booleans() if enabled("grad_inputs") else st.just(False),
        seed=st.integers(0, 2**16),
    )


def make_inputs(spec: CallSpec) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``([a, b, c], leaves)``: leaves are what gradients are taken for (with ``spec.grad``)."""
    g = torch.Generator().manual_seed(spec.seed)
    dtype, leaves = getattr(torch, spec.dtype), []

    def rand(*shape: int) -> torch.Tensor:
        t = torch.randn(*shape, generator=g, dtype=dtype)
        if not spec.grad:
            return t
        leaves.append(t.requires_grad_())
        return t.clone()  # not a leaf, so in-place ops on it are allowed as in eager

    n, m = spec.n, spec.m
    layouts: dict[str, Callable[[], torch.Tensor]] = {
        "contiguous": lambda: rand(n, m),
        "transposed": lambda: rand(m, n).t(),
        "sliced": lambda: rand(n, 2 * m)[:, ::2],
    }
    a = layouts[spec.layout]()
    b, c = layouts[spec.layout](), rand(m)
    if spec.aliasing == "same":
        b = a
    elif spec.aliasing == "overlap":
        base = rand(n + 1, m)
        a, b = base[:-1], base[1:]
    elif spec.aliasing == "row":
        c = a[1]
    return [a, b, c], leaves


# ---------------------------------------------------------------------------------------------
# Observing one call: everything eager's answer is made of.


@dataclass
class Observation:
    """What one call did: its result or exception, inputs after it, aliasing, gradients."""

    raised: str = ""  # the exception type's name, "" when it returned
    message: str = ""
    result: Any = None
    inputs_after: list[torch.Tensor] = field(default_factory=list)
    versions_moved: list[bool] = field(default_factory=list)
    aliasing: list[tuple[int, int, bool, bool]] = field(default_factory=list)
    grads: list[torch.Tensor | None] = field(default_factory=list)
    grad_raised: str = ""


def _tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors in a result, in order (lists, tuples, dict values)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list | tuple):
        return [t for item in obj for t in _tensors(item)]
    return []


def _alias_pattern(tensors: list[torch.Tensor]) -> list[tuple[int, int, bool, bool]]:
    """For each pair of tensors: (i, j, same object, same storage)."""
    out = []
    ptrs = [t.untyped_storage().data_ptr() for t in tensors]
    for i, t in enumerate(tensors):
        for j in range(i + 1, len(tensors)):
            out.append((i, j, t is tensors[j], ptrs[i] == ptrs[j]))
    return out


def observe(fn: Callable[..., Any], spec: CallSpec) -> Observation:
    """Call ``fn`` on fresh inputs for ``spec`` (RNG seeded) and record what happened."""
    args, leaves = make_inputs(spec)
    before = [t._version for t in args]
    obs = Observation()
    torch.manual_seed(1234)
    try:
        obs.result = fn(*args)
    except Exception as e:  # compared by type with eager's
        obs.raised, obs.message = type(e).__name__, str(e).split("\n")[0][:200]
    obs.inputs_after = [t.detach().clone() for t in args]
    obs.versions_moved = [t._version != v for t, v in zip(args, before, strict=True)]
    outs = _tensors(obs.result)
    obs.aliasing = _alias_pattern(args + outs)
    if leaves and not obs.raised:
        _backward(obs, outs, leaves)
    return obs


def _backward(obs: Observation, outs: list[torch.Tensor], leaves: list[torch.Tensor]) -> None:
    outs = [o for o in outs if o.requires_grad and o.is_floating_point()]
    if not outs:
        return
    try:  # using an output can raise too (a view whose base was modified in place)
        torch.autograd.backward([o.double().sum() for o in outs])
    except Exception as e:  # compared by type with eager's
        obs.grad_raised = type(e).__name__
    obs.grads = [leaf.grad for leaf in leaves]


# ---------------------------------------------------------------------------------------------
# Comparing ember's observation with eager's; each problem is "class: detail".


def _close(got: torch.Tensor, want: torch.Tensor) -> str:
    try:
        torch.testing.assert_close(got, want, equal_nan=True, **tolerance(want.dtype))
    except AssertionError as e:
        return str(e).replace("\n", " ")[:300]
    return ""


def _compare_tensor(got: torch.Tensor, want: torch.Tensor, where: str) -> list[str]:
    facts = ["dtype", "shape", "requires_grad"] + (["stride"] if enabled("strides") else [])
    for fact in facts:
        g, w = getattr(got, fact), getattr(want, fact)
        g, w = (g(), w()) if callable(g) else (g, w)
        if g != w:
            return [f"{fact}: {where} eager {w}, ember {g}"]
    if got.dtype != want.dtype or got.shape != want.shape:
        return []
    detail = _close(got.detach(), want.detach())
    return [f"value: {where}: {detail}"] if detail else []


def compare_values(got: Any, want: Any, where: str = "out") -> list[str]:
    """Structure, tensor metadata and values (with :data:`TOLERANCES`)."""
    if type(got) is not type(want):
        return [f"type: {where} eager {type(want).__name__}, ember {type(got).__name__}"]
    if isinstance(want, torch.Tensor):
        return _compare_tensor(got, want, where)
    if isinstance(want, dict):
        if list(got) != list(want):
            return [f"keys: {where} eager {list(want)}, ember {list(got)}"]
        return [p for k in want for p in compare_values(got[k], want[k], f"{where}[{k!r}]")]
    if isinstance(want, list | tuple):
        if len(got) != len(want):
            return [f"length: {where} eager {len(want)}, ember {len(got)}"]
        pairs = zip(got, want, strict=True)
        return [p for i, (g, w) in enumerate(pairs) for p in compare_values(g, w, f"{where}[{i}]")]
    if isinstance(want, float):
        rtol, atol = tolerance(torch.float32).values()
        ok = abs(got - want) <= atol + rtol * abs(want) or (got != got and want != want)
        return [] if ok else [f"value: {where} eager {want}, ember {got}"]
    return [] if got == want else [f"value: {where} eager {want!r}, ember {got!r}"]


def _merged_outputs(want: tuple[int, int, bool, bool], got: tuple[int, int, bool, bool]) -> bool:
    """Two distinct outputs that ember returns as one tensor (gated: GATES["cse_outputs"])."""
    return want[0] >= len(INPUTS) and want[2:] == (False, False) and got[2:] == (True, True)


def compare(got: Observation, want: Observation) -> list[str]:
    """Every way ember's call differed from eager's, as "class: detail" lines."""
    if got.raised != want.raised:
        return [
            f"exception: eager {want.raised or 'returned'} {want.message!r}, "
            f"ember {got.raised or 'returned'} {got.message!r}"
        ]
    problems = [] if want.raised else compare_values(got.result, want.result)
    diff = [(w, g) for w, g in zip(want.aliasing, got.aliasing, strict=False) if w != g]
    diff = [(w, g) for w, g in diff if enabled("cse_outputs") or not _merged_outputs(w, g)]
    if diff and not want.raised:
        problems.append(f"aliasing: (i, j, is, same storage) of inputs+outputs, eager/ember {diff}")
    for i, (g, w) in enumerate(zip(got.inputs_after, want.inputs_after, strict=True)):
        problems += [p.replace("value:", "mutation:", 1) for p in _compare_tensor(g, w, "abc"[i])]
    if got.versions_moved != want.versions_moved and not want.raised:
        problems.append(
            f"version: inputs' _version moved, eager {want.versions_moved}, "
            f"ember {got.versions_moved}"
        )
    if got.grad_raised != want.grad_raised:
        problems.append(f"grad-exception: eager {want.grad_raised!r}, ember {got.grad_raised!r}")
    if len(got.grads) != len(want.grads):
        return [
            *problems,
            f"grad: leaves with grads, eager {len(want.grads)}, ember {len(got.grads)}",
        ]
    for i, (g, w) in enumerate(zip(got.grads, want.grads, strict=True)):
        if (g is None) != (w is None):
            problems.append(f"grad: leaf {i} eager {w is not None}, ember {g is not None}")
        elif g is not None and w is not None:
            problems += [p.replace("value:", "grad:", 1) for p in _compare_tensor(g, w, f"grad{i}")]
    return problems


# ---------------------------------------------------------------------------------------------
# Running a program: eager from one copy of the source, ember from another.


@dataclass(frozen=True)
class GlobalState:
    """The global state a call runs under; the guard fuzzer varies it between calls."""

    grad: bool = True
    default_dtype: str = "float32"
    flag: bool = True  # the program's G_FLAG
    scale: float = 0.5  # the program's G_SCALE


@contextlib.contextmanager
def applied(state: GlobalState, namespaces: list[dict[str, Any]]) -> Iterator[None]:
    old = torch.get_default_dtype()
    for ns in namespaces:
        ns["G_FLAG"], ns["G_SCALE"] = state.flag, state.scale
    torch.set_default_dtype(getattr(torch, state.default_dtype))
    try:
        with torch.set_grad_enabled(state.grad):
            yield
    finally:
        torch.set_default_dtype(old)


_loads = itertools.count()


def load(source: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """A fresh ``f`` (new code objects, own globals) from the program's source."""
    filename = f"<ember-fuzz-{next(_loads)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["f"], namespace


Call = tuple[CallSpec, GlobalState]


def differential(source: str, calls: list[Call], backend: str) -> list[str]:
    """Run the program eagerly and compiled once for ``backend`` over ``calls``; the problems."""
    import ember.compiler

    eager, eager_ns = load(source)
    fn, ns = load(source)
    ember.compiler.reset()
    compiled = ember.compiler.compile(fn, backend=backend)
    problems = []
    for k, (spec, state) in enumerate(calls):
        with applied(state, [eager_ns, ns]):
            want = observe(eager, spec)
            got = observe(compiled, spec)
        problems += [f"call {k}: {p}" for p in compare(got, want)]
    return problems


def repro(source: str, calls: list[Call], backend: str, problems: list[str]) -> str:
    """The assertion message: what differed, then a script that reproduces it."""
    listed = ",\n    ".join(repr(c) for c in calls)
    return (
        "ember differs from eager:\n  " + "\n  ".join(problems) + "\n\n"
        "# --- repro (run from the repository root) ---\n"
        "import sys\n"
        'sys.path.insert(0, "packages/compiler-api/tests")\n'
        "from fuzzcheck import CallSpec, GlobalState, differential\n\n"
        f'SOURCE = """\\\n{source}"""\n'
        f"CALLS = [\n    {listed},\n]\n"
        f"print(differential(SOURCE, CALLS, {backend!r}))\n"
    )


def fuzz_settings(examples: int) -> settings:
    """One fixed-seed Hypothesis profile for both fuzzers. Shrinking is off unless
    ``EMBER_FUZZ_SHRINK=1``: a failing program is reported at once with its repro (unshrunk),
    instead of after minutes of shrinking in CI. ``EMBER_FUZZ_RANDOM=1`` draws new programs
    each run (a campaign) instead of CI's fixed sequence."""
    phases = list(Phase)
    if os.environ.get("EMBER_FUZZ_SHRINK") != "1":
        phases.remove(Phase.shrink)
    return settings(
        max_examples=examples,
        derandomize=os.environ.get("EMBER_FUZZ_RANDOM") != "1",
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=phases,
    )
