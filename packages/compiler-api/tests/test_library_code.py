"""Library code is traced like user code; the trace rules say what runs natively.

Also the Python that libraries lean on: mutations of ``**kwargs`` and dict arguments
replayed with the values the frame read, and zero-argument ``super()`` after a break.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

import ember.compiler
from ember.capture import trace_rules
from ember.compiler.testing import CompileCounter, assert_same, outcome


def _fake_library(name: str, source: str) -> types.ModuleType:
    """A module registered in sys.modules, as an installed package's module would be."""
    module = types.ModuleType(name)
    exec(compile(source, f"/site-packages/{name.replace('.', '/')}.py", "exec"), module.__dict__)
    sys.modules[name] = module
    return module


LIBRARY = """
import torch

def helper(x):
    return torch.relu(x) * 2

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, **kwargs):
        scale = kwargs.pop("scale", 1.0)
        return helper(self.lin(x)) * scale
"""


@pytest.fixture
def library():
    module = _fake_library("fakelib_ember_test", LIBRARY)
    yield module
    del sys.modules["fakelib_ember_test"]
    trace_rules.remove_rule("fakelib_ember_test")


def test_a_third_party_model_is_one_graph(library):
    model = library.Block()
    counter = CompileCounter()
    compiled = ember.compiler.compile(model, backend=counter, fullgraph=True)
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x, scale=3.0), model(x, scale=3.0))
    assert counter.frame_count == 1 and counter.op_count >= 3


def test_a_skip_rule_makes_the_library_call_a_break_there(library):
    ember.compiler.set_trace_rule("fakelib_ember_test", "skip", "for the test")

    def f(x):
        return library.helper(x.sin()).cos()

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), f(x))
    assert counter.frame_count == 2  # before and after the call; the call ran natively
    (only_break,) = compiled.stats.breaks
    assert "fakelib_ember_test: for the test" in only_break.reason
    assert "set_trace_rule" in only_break.hint


def test_trace_rule_table_rows_and_errors():
    assert trace_rules.lookup("threading").action == "skip"
    assert trace_rules.lookup("torch.optim.adam").action == "inline"
    assert trace_rules.lookup("einops.einops").action == "trace"
    with pytest.raises(ValueError, match="action must be"):
        ember.compiler.set_trace_rule("x", "sometimes", "why")
    with pytest.raises(ValueError, match="needs a reason"):
        ember.compiler.set_trace_rule("x", "skip", "")


# -- dict mutations are replayed with the values the frame read -----------------------------


def _check(fn, *make_args):
    """Compile ``fn``; compare result and the mutated arguments with eager, three calls."""
    counter = CompileCounter()
    compiled = ember.compiler.compile(fn, backend=counter)
    for _ in range(3):
        eager_args, ember_args = make_args[0](), make_args[0]()
        expected = fn(*eager_args)
        got = compiled(*ember_args)
        assert_same(got, expected)
        assert_same(ember_args, eager_args)
    return counter


def test_kwargs_pop_then_return_the_popped_value():
    def f(x, **kwargs):
        flag = kwargs.pop("flag")
        other = kwargs.pop("missing", None)
        return x + 1, flag, other, kwargs

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter, fullgraph=True)
    x = torch.ones(2)
    got = compiled(x, flag="on", keep=3)
    assert_same(got, f(x, flag="on", keep=3))
    assert counter.frame_count == 1


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("a"),
        lambda d: d.__setitem__("a", d["b"]),
        lambda d: d.update(c=d["a"]),
        lambda d: d.__delitem__("b"),
        lambda d: d.clear(),
        lambda d: d.setdefault("z", d["a"]),
    ],
    ids=["pop", "setitem", "update", "del", "clear", "setdefault"],
)
def test_dict_argument_mutations_keep_the_values_read(mutate):
    def f(x, d):
        a, b = d["a"], d["b"]
        mutate(d)
        return x * 2, a, b

    _check(f, lambda: (torch.ones(2), {"a": torch.ones(1), "b": torch.zeros(1)}))


def test_dict_held_by_a_module_mutated_and_read():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cache = {"k": torch.ones(2)}

        def forward(self, x):
            old = self.cache.pop("k")
            self.cache["k"] = x + old
            return old * 3

    eager, model = M(), M()
    compiled = ember.compiler.compile(model, backend="eager")
    x = torch.randn(2)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), eager(x))
        assert_same(model.cache, eager.cache)


def test_views_taken_before_a_mutation():
    def f(x, d):
        keys = list(d.keys())
        values = list(d.values())
        d.pop("a")
        d["n"] = x
        return keys, values[0] + x, len(d)

    _check(f, lambda: (torch.ones(2), {"a": torch.full((2,), 2.0), "b": 1}))


# -- zero-argument super() --------------------------------------------------------------------


class _Base(torch.nn.Module):
    def scale(self, x):
        return x * 2


class _Child(_Base):
    def scale(self, x):
        x = x + 1
        print("break")  # a graph break: the rest runs in a resume function
        return super().scale(x) - 1


def test_zero_argument_super_in_a_resume_function(capsys):
    model = _Child()
    compiled = ember.compiler.compile(model.scale, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), model.scale(x))
    assert len(compiled.stats.breaks) == 1 and not compiled.stats.failures


# -- what libraries do when they see a compiler ----------------------------------------------


def test_compiler_queries_fold_inside_a_capture():
    import torch._dynamo  # the test may import the peer; ember's product code never does

    def f(x):
        compiling = torch.compiler.is_compiling() and torch._dynamo.is_compiling()
        exporting = torch.compiler.is_exporting()
        scripted = torch.jit.is_scripting() or torch.jit.is_tracing()
        if compiling and not exporting and not scripted:
            return x + 1  # the compile-friendly path libraries take
        return x - 1

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter, fullgraph=True)
    x = torch.zeros(2)
    torch.testing.assert_close(compiled(x), x + 1)
    torch.testing.assert_close(f(x), x - 1)  # eager: not compiling
    assert counter.frame_count == 1


def test_torch_dynamo_graph_break_and_disable_and_check():
    import torch._dynamo

    @torch.compiler.disable
    def native(x):
        return x * 3

    def f(x):
        torch._check(x.shape[0] == 2)
        y = x.sin()
        torch._dynamo.graph_break()
        return native(y).cos()

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter)
    x = torch.randn(2)
    torch.testing.assert_close(compiled(x), f(x))
    reasons = [b.reason for b in compiled.stats.breaks]
    assert len(reasons) == 2, reasons  # at graph_break(), then at the disabled call
    assert "graph_break" in reasons[0]  # torch's own graph_break runs natively: a break there
    assert "runs natively" in reasons[1]
    with pytest.raises(ember.compiler.FullGraphError):
        ember.compiler.compile(f, backend="eager", fullgraph=True)(x)


def test_torch_check_that_fails_raises_as_eager_does():
    def f(x, n):
        torch._check(n > 0, lambda: f"n must be positive, got {n}")
        return x * n

    compiled = ember.compiler.compile(f, backend="eager")
    torch.testing.assert_close(compiled(torch.ones(2), 2), torch.full((2,), 2.0))
    with pytest.raises(RuntimeError, match="n must be positive, got -1"):
        f(torch.ones(2), -1)
    with pytest.raises(RuntimeError, match="n must be positive, got -1"):
        compiled(torch.ones(2), -1)


CHECKS = {
    "check": torch._check,
    "check_index": torch._check_index,
    "check_value": torch._check_value,
    "check_type": torch._check_type,
    "check_not_implemented": torch._check_not_implemented,
}
MESSAGES = {"callable": lambda: "no kernel for n", "object": lambda: 7, "none": None, "str": "no"}


@pytest.mark.parametrize("message", sorted(MESSAGES))
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_failed_torch_checks_raise_as_eager_does(name, message):
    # each polyfilled torch._check_* raises eager's error type and text: the message called
    # (and str()-ed), torch's default text without one, TypeError for a non-callable one
    check, msg = CHECKS[name], MESSAGES[message]

    def f(x, n):
        check(n > 0, msg)
        return x * n

    compiled = ember.compiler.compile(f, backend="eager")
    torch.testing.assert_close(compiled(torch.ones(2), 2), torch.full((2,), 2.0))
    want = outcome(f, torch.ones(2), -1)
    got = outcome(compiled, torch.ones(2), -1)
    assert want[0] == "raise" and got == want


ERRORS = {"check": RuntimeError, "check_index": IndexError, "check_value": ValueError,
          "check_type": TypeError, "check_not_implemented": NotImplementedError}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_failed_torch_check_caught_inside_the_compiled_frame(name):
    # the error is caught by the function itself: the polyfill's own exception is what the
    # handler sees, so its type and text must be eager's
    check, error = CHECKS[name], ERRORS[name]

    def f(x, n):
        try:
            check(n > 0, lambda: f"bad n {n}")
        except error as e:
            return x - 1, str(e)
        return x * n, ""

    compiled = ember.compiler.compile(f, backend="eager")
    for n in (2, -1):
        assert_same(compiled(torch.ones(2), n), f(torch.ones(2), n))


class _Config:
    def __init__(self, **fields):
        for name, value in fields.items():
            setattr(self, name, value)


def test_delattr_on_objects_made_in_the_trace_and_on_real_ones():
    def f(x, real):
        made = _Config(a=2.0, b=3.0)
        del made.a
        delattr(made, "b")
        missing = not hasattr(made, "a") and not hasattr(made, "b")
        del real.scale  # a real object's attribute: runs natively (a break)
        return x * 2, missing, hasattr(real, "scale")

    compiled = ember.compiler.compile(f, backend="eager")
    got = compiled(torch.ones(2), _Config(scale=1))
    assert_same(got, f(torch.ones(2), _Config(scale=1)))
    with pytest.raises(AttributeError):
        compiled(torch.ones(2), _Config())  # as eager raises


# -- torch's predicates and the memo sets of Module's iterators (diffusers' UNet) -----------------


def _timestep_embedding(x, t):
    if not torch.is_tensor(t):  # diffusers' UNet2DModel.forward
        t = torch.tensor([t], dtype=torch.long)
    elif torch.is_tensor(t) and len(t.shape) == 0:
        t = t[None]
    scale = torch.numel(x) if torch.is_floating_point(x) else 1
    return x.to(torch.get_default_dtype()) * t.float().mean() / scale


@pytest.mark.parametrize("t", [3, torch.tensor(3), torch.tensor([1, 5])], ids=str)
def test_torch_predicates_fold_and_give_eagers_branch(t):
    counter = CompileCounter()
    compiled = ember.compiler.compile(_timestep_embedding, backend=counter, fullgraph=True)
    x = torch.randn(2, 3)
    torch.testing.assert_close(compiled(x, t), _timestep_embedding(x, t))
    assert counter.frame_count == 1


def test_torch_predicates_raise_as_eager_does_on_a_non_tensor():
    def f(x):
        return x + torch.numel([1, 2])

    compiled = ember.compiler.compile(f, backend="eager")
    with pytest.raises(TypeError, match="must be Tensor, not list"):
        compiled(torch.ones(2))
    with pytest.raises(TypeError, match="must be Tensor, not list"):
        f(torch.ones(2))


def test_default_dtype_is_read_once_and_guarded():
    def f(x):
        return x.to(torch.get_default_dtype()) + 1

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter, fullgraph=True)
    x = torch.ones(2, dtype=torch.float16)
    assert compiled(x).dtype == torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert compiled(x).dtype == torch.float64  # a new default: the guard misses
    finally:
        torch.set_default_dtype(previous)
    assert counter.frame_count == 2


class _Tower(torch.nn.Module):
    """Reads its dtype as diffusers' ModelMixin does (the first parameter's), and walks its
    modules and parameters: each iterator keeps a memo set of what it has seen."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        self.shared = self.a  # visited twice: the memo set drops the second one

    @property
    def dtype(self):
        return next(self.parameters()).dtype

    def forward(self, x):
        count = len(list(self.modules()))
        total = sum(p.sum() for p in self.parameters())
        names = [n for n, _ in self.named_parameters()]
        return self.b(self.a(x)).to(dtype=self.dtype) * count + total + len(names)


def test_module_and_parameter_iterators_with_memo_sets_are_one_graph():
    model = _Tower()
    counter = CompileCounter()
    compiled = ember.compiler.compile(model, backend=counter, fullgraph=True)
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1


def test_sets_of_modules_and_tensors_follow_identity():
    lin, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    def f(x, y):
        seen = {lin}
        both = set([lin, other])
        tensors = set()
        tensors.add(x)
        flags = (lin in seen, other in seen, other in both)
        flags += (x in tensors, y in tensors, x.clone() in tensors)
        members = [m(x) for m in seen]
        return x * sum(flags) + members[0], tensors

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter)
    x, y = torch.randn(2), torch.randn(2)
    out, tensors = compiled(x, y)
    expected, _ = f(x, y)
    torch.testing.assert_close(out, expected)
    assert tensors == {x} and next(iter(tensors)) is x  # the set made in the trace, rebuilt
    assert counter.frame_count == 1


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_fullgraph_names_the_error_eager_raises_at_a_failed_check(name):
    # the polyfill raises eager's error type: fullgraph's diagnostic names it
    check, error = CHECKS[name], ERRORS[name]

    def f(x, n):
        check(n > 0, lambda: f"bad n {n}")
        return x * n

    compiled = ember.compiler.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(ember.compiler.FullGraphError, match=f"raising {error.__name__}\\b"):
        compiled(torch.ones(2), -1)
