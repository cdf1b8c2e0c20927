"""aot_compile on graphs with symbolic sizes: one compile serves many sizes.

Graphs are built as ember's capture hands them to a backend: placeholders carry fake
tensors of one ``FakeTensorMode(shape_env=...)`` (some sizes ``SymInt``s) or a ``SymInt``
for an int argument, in ``meta["val"]`` and ``meta["example_value"]``; example inputs are
real tensors and those ``SymInt``s; calls pass real tensors and plain ints. Outputs,
gradients and mutated inputs are compared with eager over five or more sizes, each with
the compilers run once.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch import nn
from torch._guards import GuardSource, Source
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import (
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)

from ember.aotgraph import aot_compile
from ember.aotgraph.eager_checks import Unsupported

SIZES = (2, 3, 5, 8, 13, 21)


@dataclass(frozen=True)
class _Arg(Source):
    """Names an int argument's symbol."""

    index: int

    @functools.cached_property
    def guard_source(self) -> GuardSource:
        return GuardSource.LOCAL

    @property
    def _name_template(self) -> str:
        return f"arg{self.index}"


def symbolic_graph(
    fn: Callable[..., Any] | nn.Module,
    args: Sequence[Any],
    dynamic: dict[int, Sequence[int]],
) -> tuple[torch.fx.GraphModule, list[Any], ShapeEnv]:
    """``fn`` traced by ``symbolic_trace``, its placeholders' meta set as capture sets it:
    tensor ``i`` gets a fake with dims ``dynamic[i]`` symbolic; an int argument a SymInt of
    its own. Returns the graph, the example inputs (real tensors, SymInts), the ShapeEnv."""
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    gm = torch.fx.symbolic_trace(fn)
    values: list[Any] = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            dims = [
                DimDynamic.DYNAMIC if d in dynamic.get(i, ()) else DimDynamic.STATIC
                for d in range(a.dim())
            ]
            context = StatelessSymbolicContext(dynamic_sizes=dims)
            values.append(mode.from_tensor(a, symbolic_context=context))
        else:
            sym = env.create_unspecified_symbol(a, _Arg(i), dynamic_dim=DimDynamic.DYNAMIC)
            values.append(env.create_symintnode(sym, hint=a, source=_Arg(i)))
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    assert len(placeholders) == len(values)
    for node, value in zip(placeholders, values, strict=True):
        node.meta["val"] = node.meta["example_value"] = value
    example = [v if isinstance(v, torch.SymInt) else a for a, v in zip(args, values, strict=True)]
    return gm, example, env


@dataclass
class Compilers:
    """Compilers that run the aten graphs as they are and keep what they were handed."""

    seen: list[tuple[str, torch.fx.GraphModule, list[Any]]]
    runs: dict[str, int] = field(default_factory=dict)  # calls of each compiled graph

    def __call__(self, name: str) -> Callable[..., Any]:
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
            self.seen.append((name, gm, list(example_inputs)))

            def run(*args: Any) -> Any:
                self.runs[name] = self.runs.get(name, 0) + 1
                return gm(*args)

            return run

        return compile_graph

    def compile(self, gm: torch.fx.GraphModule, example: list[Any], **kw: Any) -> Any:
        return aot_compile(
            gm,
            example,
            fw_compiler=self("forward"),
            bw_compiler=self("backward"),
            inference_compiler=self("inference"),
            **kw,
        )

    def names(self) -> list[str]:
        return [name for name, _, _ in self.seen]


def clone_args(args: Sequence[Any]) -> list[Any]:
    return [
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
        for a in args
    ]


def check_call(compiled: Callable[..., Any], fn: Callable[..., Any], args: Sequence[Any]) -> None:
    """Compiled and eager on copies of ``args``: outputs, gradients of every input that
    requires grad (through the sum of the floating outputs) and the inputs after the call."""
    mine, ref = clone_args(args), clone_args(args)
    got, want = compiled(*mine), fn(*ref)
    torch.testing.assert_close(got, want)
    outs = [o for o in pytree.tree_leaves(want) if isinstance(o, torch.Tensor) and o.requires_grad]
    if outs and torch.is_grad_enabled():
        sum(o.sum() for o in outs).backward()  # type: ignore[union-attr]
        got_outs = [o for o in pytree.tree_leaves(got) if isinstance(o, torch.Tensor)]
        sum(o.sum() for o in got_outs if o.requires_grad).backward()  # type: ignore[union-attr]
    for a, b in zip(mine, ref, strict=True):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a.detach(), b.detach())  # mutations written back
            torch.testing.assert_close(a.grad, b.grad)


# ---- the graphs stay symbolic -----------------------------------------------------------------


def _scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).relu() * x.size(0)


def test_graphs_read_sizes_from_inputs_and_save_them_for_backward() -> None:
    x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    gm, example, _ = symbolic_graph(_scaled, [x, w], {0: [0]})
    compilers = Compilers([])
    compiled = compilers.compile(gm, example, partition="default")
    assert compilers.names() == ["forward", "backward"]
    (_, forward, fw_inputs), (_, backward, bw_inputs) = compilers.seen
    code = forward.code
    assert "sym_size" in code and "4" not in code.replace("primals", ""), code
    part = compiled.partition
    assert part is not None
    saved_values = [n.meta["val"] for n in backward.graph.find_nodes(op="placeholder")]
    symints = [v for v in saved_values if isinstance(v, torch.SymInt)]
    x_meta = next(iter(forward.graph.find_nodes(op="placeholder"))).meta["val"]
    assert isinstance(x_meta.shape[0], torch.SymInt)  # the forward graph's input is symbolic
    assert [s.node.expr for s in symints] == [x_meta.shape[0].node.expr]  # x's size, saved
    assert tuple(fw_inputs[0].shape) == (4, 3)  # the forward compiler gets the real inputs
    assert isinstance(bw_inputs[-1].shape[0], torch.SymInt)  # so is the tangent
    for n in SIZES:
        check_call(compiled, _scaled, [torch.randn(n, 3), w])
    assert len(compilers.seen) == 2  # one compile served every size
    assert compilers.runs == {"forward": len(SIZES), "backward": len(SIZES)}


def test_int_placeholders_are_graph_inputs() -> None:
    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(-1, n) * 2

    gm, example, _ = symbolic_graph(f, [torch.randn(12), 3], {0: [0]})
    compilers = Compilers([])
    compiled = compilers.compile(gm, example)
    ((_, graph, inputs),) = compilers.seen
    names = [n.name for n in graph.graph.find_nodes(op="placeholder")]
    assert names == ["primals_1", "primals_2"]
    assert isinstance(inputs[1], torch.SymInt)  # the compiler sees the symbol, not 3
    for n, k in [(12, 3), (12, 4), (30, 5), (8, 2), (21, 7), (64, 16)]:
        check_call(compiled, f, [torch.randn(n), k])
    assert len(compilers.seen) == 1 and not compiled.variants
    assert compilers.runs == {"inference": 6}


# ---- aot_eager serves many sizes with one compile ----------------------------------------------


def _view_n(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.view(-1, n).sin().sum(1)


def _reshape_half(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0] // 2, -1).cos()


def _arange(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.sum() * torch.arange(n, dtype=torch.float32)


def _reductions(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.softmax(-1).amax(0), x.mean() + x.var(0).sum()


def _mutate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return (x * w).sum(0)


def _aliases(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x[1:], x.t(), x * 2


def _view_of_output(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x.exp()
    return y, y.view(-1)


def _times_int(x: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    return x * n, x.size(0) + n  # backward needs n; the second output is a number


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x).relu()).log_softmax(-1)


def rand(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_(grad)


@dataclass(frozen=True)
class Case:
    fn: Callable[..., Any]
    inputs: Callable[[int], list[Any]]  # the inputs for size n of the dynamic dim
    dynamic: dict[int, Sequence[int]]
    # sizes the joint trace's guards exclude: they run eagerly (on both paths: each checks
    # every guard the traces of one graph added)
    eager: tuple[int, ...] = ()


CASES = {
    "view_by_int_input": Case(_view_n, lambda n: [rand(n * 3), 3], {0: [0]}),
    "view_by_varying_int": Case(_view_n, lambda n: [rand(n * (n + 1)), n + 1], {0: [0]}),
    "reshape_half": Case(_reshape_half, lambda n: [rand(2 * n, 3)], {0: [0]}),
    "arange": Case(_arange, lambda n: [rand(n, 2), n], {0: [0]}),
    "reductions": Case(_reductions, lambda n: [rand(n, n + 2)], {0: [0, 1]}),
    "matmul_param": Case(_scaled, lambda n: [rand(n, 3, grad=False), rand(3, 4)], {0: [0]}),
    "mutation": Case(_mutate, lambda n: [rand(n, 4, grad=False), rand(4)], {0: [0]}),
    # x[1:] has one row at n=2: compiled too. make_fx's tensor_meta used to ask whether
    # each output is contiguous, which guarded Ne(s0 - 1, 1) and sent n=2 to eager; symbolic
    # traces leave the memory format out (ember.aotgraph.symbolic.make_fx)
    "aliases": Case(_aliases, lambda n: [rand(n, n + 1)], {0: [0, 1]}),
    "int_in_backward": Case(_times_int, lambda n: [rand(n, 2), n + 1], {0: [0]}),
    "view_of_output": Case(_view_of_output, lambda n: [rand(n, 3)], {0: [0]}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_compile_many_sizes(name: str) -> None:
    case = CASES[name]
    gm, example, _ = symbolic_graph(case.fn, case.inputs(4), case.dynamic)
    compilers = Compilers([])
    compiled = compilers.compile(gm, example)
    built = len(compilers.seen)
    for n in SIZES:
        check_call(compiled, case.fn, case.inputs(n))
    assert len(compilers.seen) == built  # no size compiled again
    compiled_sizes = len(SIZES) - len(case.eager)
    assert compilers.runs == {"forward": compiled_sizes, "backward": compiled_sizes}
    assert compiled.training is not None and compiled.training.shapes is not None


@pytest.mark.parametrize("name", sorted(CASES))
def test_inference_many_sizes(name: str) -> None:
    """Forward-only graphs: under no_grad, and with no input requiring grad."""
    case = CASES[name]
    gm, example, _ = symbolic_graph(case.fn, case.inputs(4), case.dynamic)
    compilers = Compilers([])
    compiled = compilers.compile(gm, clone_args(example))
    for n in SIZES:
        with torch.no_grad():
            check_call(compiled, case.fn, case.inputs(n))
        plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in case.inputs(n)]
        check_call(compiled, case.fn, plain)
    assert compilers.names().count("inference") == 1
    assert compilers.runs["inference"] == 2 * (len(SIZES) - len(case.eager))


def test_undefined_output_gradients_stay_undefined() -> None:
    """An output no gradient reaches: its tangent is zeros of this call's size where the
    backward graph needs one, and an input reached only through it keeps ``grad is None``."""

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x.sin(), x.cos() * 2, y.exp()

    gm, example, _ = symbolic_graph(f, [rand(4), rand(5)], {0: [0], 1: [0]})
    compilers = Compilers([])
    compiled = compilers.compile(gm, example)
    for n in SIZES:
        mine, ref = [rand(n), rand(n + 1)], [rand(n), rand(n + 1)]
        with torch.no_grad():
            for a, b in zip(mine, ref, strict=True):
                a.copy_(b)
        compiled(*mine)[0].sum().backward()
        f(*ref)[0].sum().backward()
        torch.testing.assert_close(mine[0].grad, ref[0].grad)
        assert mine[1].grad is None and ref[1].grad is None
    # the backward pass runs the graph pruned for the undefined tangents, compiled once by
    # the backward compiler (the full graph, compiled with the forward, never runs)
    assert compilers.names() == ["forward", "backward", "backward"]
    full, pruned = (gm for name, gm, _ in compilers.seen[1:])
    assert len(pruned.graph.nodes) < len(full.graph.nodes)  # cos's formula is gone
    assert compilers.runs == {"forward": len(SIZES), "backward": len(SIZES)}


def test_module_with_parameters() -> None:
    model = _MLP()
    gm, example, _ = symbolic_graph(model, [torch.randn(4, 6)], {0: [0]})
    compilers = Compilers([])
    compiled = compilers.compile(gm, example)
    for n in SIZES:
        x = torch.randn(n, 6)
        got = compiled(x)
        got.sum().backward()
        mine = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
        model.zero_grad()
        want = model(x)
        want.sum().backward()
        torch.testing.assert_close(got, want)
        for a, p in zip(mine, model.parameters(), strict=True):
            torch.testing.assert_close(a, p.grad)
        model.zero_grad()
    assert compilers.names() == ["forward", "backward"]


MODULES: dict[str, tuple[Callable[[], nn.Module], Callable[[int], tuple[int, ...]], list[int]]] = {
    # buffers written back (running statistics) with a symbolic batch
    "batchnorm": (
        lambda: nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU()),
        lambda n: (n, 4),
        [0],
    ),
    # random masks drawn in eager's order: same seed, same numbers
    "dropout": (lambda: nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.3)), lambda n: (n, 4), [0]),
    # two symbolic dims through a convolution and a pooling
    "conv": (
        lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.AdaptiveAvgPool2d(1)),
        lambda n: (n, 2, n + 3, 5),
        [0, 2],
    ),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_many_sizes(name: str) -> None:
    make, shape, dims = MODULES[name]
    torch.manual_seed(0)
    model = make()
    ref = copy.deepcopy(model)
    gm, example, _ = symbolic_graph(model, [torch.randn(*shape(4))], {0: dims})
    compilers = Compilers([])
    compiled = compilers.compile(gm, example)
    for n in SIZES:
        x = torch.randn(*shape(n))
        torch.manual_seed(n)
        got = compiled(x)
        got.sum().backward()
        torch.manual_seed(n)
        want = ref(x)
        want.sum().backward()
        torch.testing.assert_close(got, want)
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
        for b, c in zip(model.buffers(), ref.buffers(), strict=True):
            torch.testing.assert_close(b, c)
    runs = compilers.runs["forward"]
    # torch's fake convolution picks its backend (the output's layout) by batch < 16: the
    # trace guarded it, so batch 21 runs eagerly
    assert runs == len(SIZES) - (name == "conv"), runs


# ---- assumptions are checked: other sizes run eagerly -----------------------------------------


def test_sizes_outside_the_traced_range_run_eagerly() -> None:
    gm, example, _ = symbolic_graph(_scaled, [torch.randn(4, 3), rand(3, 5)], {0: [0]})
    compilers = Compilers([])
    compiled = compilers.compile(gm, example)
    check_call(compiled, _scaled, [torch.randn(1, 3), rand(3, 5)])  # size 1: traced for >= 2
    assert compilers.runs == {}  # eager ran it, right
    check_call(compiled, _scaled, [torch.randn(6, 3), rand(3, 5)])
    assert compilers.runs == {"forward": 1, "backward": 1}
    check_call(compiled, _scaled, [torch.randn(3, 6).t(), rand(3, 5)])
    assert compilers.runs == {"forward": 1, "backward": 1}  # other strides than traced: eager


def test_guards_the_trace_added_are_checked() -> None:
    """``view(-1, n)`` assumes ``n`` divides the size: a call where it does not runs eagerly,
    and so raises eager's error, not a wrong answer."""
    gm, example, _ = symbolic_graph(_view_n, [rand(12), 3], {0: [0]})
    compiled = Compilers([]).compile(gm, example)
    assert compiled.training is not None and compiled.training.shapes is not None
    conditions = [str(c) for c in compiled.training.shapes.conditions]
    assert any("Mod" in c for c in conditions), conditions
    with pytest.raises(RuntimeError, match="invalid for input of size 10"):
        compiled(rand(10), 3)
    with pytest.raises(RuntimeError, match="invalid for input of size 10"):
        _view_n(rand(10), 3)


def test_each_path_checks_every_guard_the_traces_added() -> None:
    """The inference trace may rely on a guard the training trace added (the ShapeEnv then
    knows it and adds it no more): the inference path checks it too."""
    gm, example, _ = symbolic_graph(_view_n, [rand(12), 3], {0: [0]})
    compiled = Compilers([]).compile(gm, example)
    with torch.no_grad():
        check_call(compiled, _view_n, [rand(15), 5])
    assert compiled.training is not None and compiled.inference is not None
    for runtime in (compiled.training, compiled.inference):
        assert runtime.shapes is not None
        assert any("Mod" in str(c) for c in runtime.shapes.conditions)


def _view_mm(x: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    return (x.view(-1, n) @ w).relu() * x.size(0)


def test_an_int_the_trace_fixed_is_checked() -> None:
    """``view(-1, n) @ w`` with ``w`` of 3 rows fixes ``n`` to 3: the ShapeEnv replaces its
    symbol by 3, and a call with another ``n`` runs eagerly (and fails as eager does)."""
    w = rand(3, 5)
    gm, example, _ = symbolic_graph(_view_mm, [rand(12), w, 3], {0: [0]})
    compilers = Compilers([])
    compiled = compilers.compile(gm, example)
    for n in SIZES:
        check_call(compiled, _view_mm, [rand(6 * n), w, 3])
    assert compilers.runs == {"forward": len(SIZES), "backward": len(SIZES)}
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        compiled(rand(16), w, 4)
    assert compilers.runs["forward"] == len(SIZES)


def test_guards_from_before_are_checked_where_inputs_hold_their_symbols() -> None:
    gm, example, _ = symbolic_graph(_scaled, [torch.randn(4, 3), rand(3, 5)], {0: [0]})
    fake = next(iter(gm.graph.find_nodes(op="placeholder"))).meta["val"]
    assert bool(fake.shape[0] > 3)  # capture's guard: the size is above 3
    compilers = Compilers([])
    compiled = compilers.compile(gm, example)
    check_call(compiled, _scaled, [torch.randn(3, 3), rand(3, 5)])
    check_call(compiled, _scaled, [torch.randn(5, 3), rand(3, 5)])
    assert compilers.runs == {"forward": 1, "backward": 1}  # size 3 ran eagerly


def test_duck_sized_dims_must_stay_equal() -> None:
    """Two dims of one size get one symbol: a call where they differ runs eagerly."""
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    gm = torch.fx.symbolic_trace(lambda a, b: a * 2 + b)
    fakes = [mode.from_tensor(torch.zeros(4)), mode.from_tensor(torch.zeros(4))]
    assert fakes[0].shape[0] is not None and str(fakes[0].shape[0]) == str(fakes[1].shape[0])
    for node, fake in zip(gm.graph.find_nodes(op="placeholder"), fakes, strict=True):
        node.meta["val"] = fake
    compiled = aot_compile(gm, [torch.zeros(4), torch.zeros(4)], fw_compiler=lambda g, e: g)
    a, b = torch.randn(6), torch.randn(6)
    torch.testing.assert_close(compiled(a, b), a * 2 + b)
    with pytest.raises(RuntimeError, match="must match the size"):
        compiled(torch.randn(5), torch.randn(6))


# ---- the disk cache (ember.aotgraph.symbolic_store) -------------------------------------------
# A graph compiled again with a ShapeEnv of the same layout (as a new process makes it)
# skips tracing, its guards come back into the ShapeEnv as the trace added them, and a
# record whose guards do not hold for the new example sizes is traced again, never reused.


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder of the test's own."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("EMBER_AOT_CACHE", raising=False)
    return tmp_path / "aotgraph"


def _halves(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # the trace guards that 3 * x.size(0) splits in two (Eq(Mod(3*s0, 2), 0), ...)
    return (x.reshape(2, -1) * 2).sum(0) + w.sum()


def _first_pair(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # the number of pieces split makes is fixed by the trace: a guard per example size
    return torch.split(x @ w, 2)[0] * 2


def _compile(fn: Callable[..., Any], n: int) -> tuple[Any, list[str]]:
    """``fn`` compiled for inference with size ``n`` symbolic, in a new ShapeEnv; the
    compiled function and the ShapeEnv's guards after the compile."""
    args = [torch.randn(n, 3), torch.randn(3, 3)]
    gm, example, env = symbolic_graph(fn, args, {0: [0]})
    with torch.no_grad():
        compiled = Compilers([]).compile(gm, example)
    return compiled, [str(g.expr) for g in env.guards]


def _records(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.json"))


def test_a_symbolic_graph_compiled_again_skips_its_trace(cache: Path, traces: list[str]) -> None:
    first, traced_guards = _compile(_halves, 4)
    assert first.cache_hit is False and "trace_inference" in traces
    assert len(_records(cache)) == 1
    traces.clear()
    again, replayed_guards = _compile(_halves, 6)  # another example of the same layout
    assert again.cache_hit is True and traces == []
    assert replayed_guards == traced_guards and any("Mod" in g for g in traced_guards)
    with torch.no_grad():
        for n in [4, 6, 8, 10]:
            check_call(again, _halves, [torch.randn(n, 3), torch.randn(3, 3)])
        # the replayed guards are checked on each call: an odd size runs eagerly, as eager fails
        assert again.inference.shapes.explain([torch.randn(5, 3), torch.randn(3, 3)])
        with pytest.raises(RuntimeError, match="invalid for input of size 15"):
            again(torch.randn(5, 3), torch.randn(3, 3))


def test_a_record_whose_guards_fail_for_the_example_is_traced_again(
    cache: Path, traces: list[str]
) -> None:
    _compile(_first_pair, 4)
    traces.clear()
    same, _ = _compile(_first_pair, 4)
    assert same.cache_hit is True and traces == []
    other, guards = _compile(_first_pair, 6)  # the record says Eq((s0 + 1)//2, 2): false here
    assert other.cache_hit is False and "trace_inference" in traces
    assert any("3)" in g for g in guards)  # guarded as its own trace found, not as the record
    with torch.no_grad():
        for n in (5, 6):
            check_call(other, _first_pair, [torch.randn(n, 3), torch.randn(3, 3)])


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda r: r.update(changes=["Eq(s0, 7)"]),  # the replay leaves another ShapeEnv
        lambda r: r.update(shape_guards=[["Equality", "s999", 3]]),  # a symbol no input has
        lambda r: r.update(shape_guards=[["os.system", "s0"]]),  # not an expression we write
        lambda r: r["forward"]["nodes"][0].update(val={"tensor": [[{"sym": ["Bad"]}]]}),
    ],
)
def test_a_bad_record_is_traced_again_and_written_again(
    cache: Path, traces: list[str], corrupt: Callable[[dict[str, Any]], None]
) -> None:
    _compile(_halves, 4)
    (path,) = _records(cache)
    record = json.loads(path.read_text())
    corrupt(record)
    path.write_text(json.dumps(record))
    traces.clear()
    compiled, _ = _compile(_halves, 6)
    assert compiled.cache_hit is False and "trace_inference" in traces
    with torch.no_grad():
        for n in (4, 6):
            check_call(compiled, _halves, [torch.randn(n, 3), torch.randn(3, 3)])
    again, _ = _compile(_halves, 8)  # written again: the next compile hits
    assert again.cache_hit is True


def test_symbolic_training_graphs_are_not_written(cache: Path) -> None:
    for size in (4, 6):
        x, w = torch.randn(size, 3), rand(3, 5)
        gm, example, _ = symbolic_graph(_first_pair, [x, w], {0: [0]})
        compiled = Compilers([]).compile(gm, example)
        assert compiled.cache_hit is None
        for n in SIZES[1:3]:
            check_call(compiled, _first_pair, [torch.randn(n, 3), rand(3, 5)])
    assert _records(cache) == []


# ---- what is not compiled symbolically yet says why -------------------------------------------


def _transpose_input(x: torch.Tensor) -> torch.Tensor:
    x.t_()
    return x * 2


def _data_dependent(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(x.sum().int().item()) + 1


@pytest.mark.parametrize(
    ("fn", "args", "reason"),
    [
        (_transpose_input, [torch.randn(4, 3)], "restrided"),
        (_data_dependent, [torch.ones(4)], "symbolic sizes"),
        (lambda a, b: a + b, "shared", "share storage"),
    ],
)
def test_unsupported_says_why(fn: Callable[..., Any], args: Any, reason: str) -> None:
    if args == "shared":
        base = torch.randn(8)
        gm, example, _ = symbolic_graph(fn, [base[:4], base[4:]], {0: [0], 1: [0]})
    else:
        gm, example, _ = symbolic_graph(fn, args, {0: [0]})
    with pytest.raises(Unsupported, match=reason):
        Compilers([]).compile(gm, example)


def test_two_shape_envs_are_refused() -> None:
    gm = torch.fx.symbolic_trace(lambda a, b: a + b)
    for node in gm.graph.find_nodes(op="placeholder"):
        node.meta["val"] = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(torch.zeros(3))
    with pytest.raises(Unsupported, match="2 shape environments"):
        aot_compile(gm, [torch.zeros(3), torch.zeros(3)], fw_compiler=lambda g, e: g)


def test_shape_check_refuses_other_layouts() -> None:
    gm, example, _ = symbolic_graph(_view_n, [rand(12), 3], {0: [0]})
    compiled = Compilers([]).compile(gm, example)
    assert compiled.training is not None
    check = compiled.training.shapes
    assert check is not None
    assert check.ok([torch.zeros(15), 5])
    assert not check.ok([torch.zeros(15), torch.tensor(5)])  # a tensor is not the int input
    assert not check.ok([torch.zeros(15, 1), 5])  # another number of dims
    assert not check.ok([torch.zeros(30)[::2], 5])  # another stride
    assert not check.ok([torch.zeros(15), 0])  # n % 0


def test_guards_a_compiler_adds_are_checked() -> None:
    """A compiler that specialises a size (``int()`` of a SymInt guards it in the ShapeEnv)
    gets only that size: others run eagerly instead of through its specialised code."""

    def specialising(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        fake = next(iter(gm.graph.find_nodes(op="placeholder"))).meta["val"]
        rows = int(fake.shape[0])  # a compiler that bakes the size in

        def run(*args: Any) -> Any:
            assert args[0].shape[0] == rows, "run with a size it was not compiled for"
            return gm(*args)

        return run

    gm, example, _ = symbolic_graph(_scaled, [torch.randn(4, 3), rand(3, 5)], {0: [0]})
    compiled = aot_compile(gm, example, fw_compiler=specialising, bw_compiler=as_is)
    for n in SIZES:
        check_call(compiled, _scaled, [torch.randn(n, 3), rand(3, 5)])
    check_call(compiled, _scaled, [torch.randn(4, 3), rand(3, 5)])


def as_is(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    return gm


def test_a_miss_is_explained_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    gm, example, _ = symbolic_graph(_view_n, [rand(12), 3], {0: [0]})
    compiled = Compilers([]).compile(gm, example)
    assert compiled.training is not None and compiled.training.shapes is not None
    check = compiled.training.shapes
    assert check.explain([torch.zeros(15), 5]) is None
    assert "is false for input sizes (10,), 3" in str(check.explain([torch.zeros(10), 3]))
    assert "do not have the traced layout" in str(check.explain([torch.zeros(10), 3.0]))
    with caplog.at_level("DEBUG", logger="ember.aotgraph"), pytest.raises(RuntimeError):
        compiled(rand(10), 3)  # 3 does not divide 10: eager runs it, and raises
    messages = [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    assert len(messages) == 1 and "Mod" in messages[0], messages


def _eval_dropout(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.1, training=False) * 2 + torch.dropout(x, 0.0, True)


def test_a_dropout_eager_skips_leaves_no_copy() -> None:
    """Training off, or ``p == 0``: eager returns the input itself, and so does the graph
    (torch's Python decomposition, which symbolic traces take, would copy it)."""
    x = torch.randn(4, 3)
    gm, example, _ = symbolic_graph(_eval_dropout, [x], {0: [0]})
    compilers = Compilers([])
    compiled = compilers.compile(gm, clone_args(example))
    ((name, graph, _),) = compilers.seen
    assert name == "inference" and "clone" not in graph.code, graph.code
    for n in SIZES:
        check_call(compiled, _eval_dropout, [torch.randn(n, 3)])
    assert len(compilers.seen) == 1


def _means(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        x.mean(-1, keepdim=True),  # the lean decomposition: a static count
        x.mean([0, 2]),
        x.mean(1),  # over a symbolic size: torch's reference
        x.half().mean(-1),  # float16: torch's reference
    )


def test_means_with_symbolic_sizes_decompose_as_eager_computes() -> None:
    """A table decomposing ``aten.mean.dim`` (inductor's does) gets ember's lean version
    in symbolic traces (``decompositions.mean_dim``), torch's reference where it falls
    back: the same graph ops as the reference's, and eager's numbers."""
    table = {torch.ops.aten.mean.dim: torch._decomp.decomposition_table[torch.ops.aten.mean.dim]}
    x = torch.randn(4, 5, 6)
    gm, example, _ = symbolic_graph(_means, [x], {0: [0, 1]})
    compilers = Compilers([])
    compiled = compilers.compile(gm, clone_args(example), decompositions=table)
    ((_, graph, _),) = compilers.seen
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert "aten.mean.dim" not in targets and targets.count("prims.sum.default") == 4
    for n in SIZES:
        check_call(compiled, _means, [torch.randn(n, n + 1, 6)])
    assert len(compilers.seen) == 1
