"""ember.compiler.compile's contract: fallbacks, errors, threads, modules, backends, caches."""

from __future__ import annotations

import operator
import threading
import traceback
import warnings

import pytest
import torch

import ember.compiler
from ember.compiler.testing import CompileCounter
from ember.guards import CacheLimitWarning


def _line_of(marker: str) -> int:
    with open(__file__) as fh:
        return next(i for i, line in enumerate(fh, 1) if line.rstrip().endswith(marker))


# -- frames ember cannot capture -------------------------------------------------------------


def prints(x):
    y = x + 1
    print("side effect")  # LINE: print
    return y * 2


def reads_item(x):
    if x.sum().item() > 0:  # LINE: item
        return x + 1
    return x - 1


def branches_on_tensor(x):
    if x.sum() > 0:  # LINE: tensor branch
        return x + 1
    return x - 1


@pytest.mark.parametrize(
    ("fn", "marker", "words"),
    [
        (prints, "# LINE: print", "print"),
        (reads_item, "# LINE: item", ".item()"),
        (branches_on_tensor, "# LINE: tensor branch", "data-dependent jump (`if x.sum() > 0:"),
    ],
)
def test_fullgraph_error_names_the_users_file_and_line(fn, marker, words):
    compiled = ember.compiler.compile(fn, fullgraph=True)
    with pytest.raises(ember.compiler.FullGraphError) as info:
        compiled(torch.randn(4))
    message = str(info.value)
    assert f'File "{__file__}", line {_line_of(marker)}' in message
    assert words in message


@pytest.mark.parametrize("fn", [prints, reads_item, branches_on_tensor])
def test_unsupported_instructions_break_the_graph_with_a_recorded_reason(fn, capsys):
    x = torch.randn(4)
    counter = CompileCounter()
    compiled = ember.compiler.compile(fn, backend=counter)
    torch.testing.assert_close(compiled(x), fn(x))
    torch.testing.assert_close(compiled(x), fn(x))
    (brk,) = compiled.stats.breaks  # found once; later calls hit the cache
    assert brk.location.startswith(f'File "{__file__}"')
    assert brk.reason and brk.category
    assert compiled.stats.failures == []
    assert counter.frame_count == 2  # the graph before the break, and the resumed one


def test_mutating_an_input_list_is_replayed_after_the_graph():
    def appends(xs):
        xs.append(xs[0] * 2)
        return xs[-1]

    items = [torch.ones(2)]
    compiled = ember.compiler.compile(appends)
    torch.testing.assert_close(compiled(items), torch.ones(2) * 2)
    assert len(items) == 2 and compiled.stats.breaks == [] and compiled.stats.graphs == 1


def test_inplace_mutation_of_an_input_tensor_is_visible_to_the_caller():
    def bump(x):
        x.add_(1)
        return x * 2

    x, y = torch.zeros(3), torch.zeros(3)
    compiled = ember.compiler.compile(bump)
    torch.testing.assert_close(compiled(x), bump(y))
    torch.testing.assert_close(x, y)
    assert compiled.stats.graphs == 1


# -- exceptions and bad input ----------------------------------------------------------------


def raises(x):
    if x.dim() != 2:
        raise ValueError("expected a matrix")  # LINE: raise
    return x.t()


def test_exception_raised_by_user_code_matches_eager():
    compiled = ember.compiler.compile(raises)
    with pytest.raises(ValueError, match="expected a matrix") as info:
        compiled(torch.randn(3))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert (frames[-1].filename, frames[-1].lineno) == (__file__, _line_of("# LINE: raise"))
    torch.testing.assert_close(compiled(torch.ones(2, 3)), torch.ones(3, 2))


def test_shape_errors_are_eagers_errors():
    def mm(a, b):
        return a @ b

    compiled = ember.compiler.compile(mm)
    with pytest.raises(RuntimeError) as mine:
        compiled(torch.randn(2, 3), torch.randn(4, 5))
    with pytest.raises(RuntimeError) as theirs:
        mm(torch.randn(2, 3), torch.randn(4, 5))
    assert str(mine.value) == str(theirs.value)


def test_wrong_arguments_raise_the_same_type_error():
    def f(x, *, k):
        return x * k

    compiled = ember.compiler.compile(f)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument"):
        compiled(torch.ones(2))
    with pytest.raises(TypeError, match="positional argument"):
        compiled(torch.ones(2), 3)


@pytest.mark.parametrize("bad", [None, 3, "model"])
def test_compile_rejects_what_it_cannot_wrap(bad):
    with pytest.raises(TypeError):
        ember.compiler.compile(bad)(1) if bad is None else ember.compiler.compile(bad)


# -- threads -----------------------------------------------------------------------------------


def test_threads_share_a_compiled_function():
    def f(x):
        return torch.tanh(x) * 2 + 1

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter, dynamic=False)  # a graph per shape
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(20):
                x = torch.randn(n + i % 2)
                torch.testing.assert_close(compiled(x), f(x))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in (3, 5, 7)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert counter.frame_count == 6  # one per shape, shared by the threads


# -- OptimizedModule -------------------------------------------------------------------------


def test_optimized_module_is_the_original_module_for_everything_but_forward():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = ember.compiler.compile(model)
    assert isinstance(opt, torch.nn.Module) and isinstance(opt, ember.compiler.OptimizedModule)
    assert opt._orig_mod is model
    assert list(opt.state_dict()) == [f"_orig_mod.{k}" for k in model.state_dict()]  # as torch
    assert [id(p) for p in opt.parameters()] == [id(p) for p in model.parameters()]
    assert opt.training is model.training and opt.get_submodule("0") is model[0]
    assert opt.to(torch.float64) is opt and model[0].weight.dtype == torch.float64
    assert opt.eval() is opt and not model.training
    opt.custom = 5
    assert model.custom == 5
    opt.load_state_dict(opt.state_dict())
    assert "OptimizedModule" in repr(opt)


# -- backends and caches ----------------------------------------------------------------------


def test_backends_registry():
    assert "eager" in ember.compiler.list_backends()
    with pytest.raises(ValueError, match="unknown backend"):
        ember.compiler.compile(lambda x: x, backend="no-such-backend")

    @ember.compiler.register_backend(name="test_registry_backend")
    def mine(gm, example_inputs):
        return gm.forward

    try:
        assert "test_registry_backend" in ember.compiler.list_backends()
        with pytest.raises(ValueError, match="already registered"):
            ember.compiler.register_backend(mine, name="test_registry_backend")
    finally:
        from ember.compiler.backends import unregister_backend

        unregister_backend("test_registry_backend")


def test_one_function_under_two_backends_keeps_two_entries():
    def f(x):
        return x.sin() + 1

    first, second = CompileCounter(), CompileCounter()
    a = ember.compiler.compile(f, backend=first)
    b = ember.compiler.compile(f, backend=second)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(a(x), f(x))
        torch.testing.assert_close(b(x), f(x))
    assert (first.frame_count, second.frame_count) == (1, 1)


def test_cache_limit_warns_once_and_then_runs_eagerly():
    def f(x):
        return x * 2

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter, dynamic=False)  # a graph per shape
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 13):
            torch.testing.assert_close(compiled(torch.ones(n)), torch.ones(n) * 2)
    limit_warnings = [w for w in caught if issubclass(w.category, CacheLimitWarning)]
    assert len(limit_warnings) == 1
    assert "size[0]" in str(limit_warnings[0].message)
    assert counter.frame_count == 8
    torch.testing.assert_close(compiled(torch.ones(3)), torch.ones(3) * 2)  # a hit still


def test_reset_forgets_translations():
    def f(x):
        return x + 1

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter)
    compiled(torch.ones(2))
    ember.compiler.reset()
    compiled(torch.ones(2))
    assert counter.frame_count == 2


def test_allow_in_graph_records_one_node():
    def opaque(x):
        return x.cos() + x.sin()

    ember.compiler.allow_in_graph(opaque)
    counter = CompileCounter()
    try:
        compiled = ember.compiler.compile(lambda x: opaque(x) * 2, backend=counter)
        torch.testing.assert_close(compiled(torch.ones(3)), opaque(torch.ones(3)) * 2)
        targets = [n.target for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
        assert opaque in targets
    finally:
        ember.compiler.disallow_in_graph(opaque)


def test_global_rebinding_is_guarded():
    namespace: dict[str, object] = {"torch": torch, "K": 2.0}
    exec("def f(x):\n    return x * K\n", namespace)
    compiled = ember.compiler.compile(namespace["f"])
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), x * 2)
    namespace["K"] = 5.0
    torch.testing.assert_close(compiled(x), x * 5)
    assert compiled.stats.graphs == 2


def test_models_compiled_in_a_loop_are_freed_and_never_fill_the_cache():
    import gc
    import weakref

    from ember.capture import hook

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).relu()

    alive = []
    for _ in range(12):  # more than cache_size_limit models, one after another
        model = Net()
        opt = ember.compiler.compile(model)
        torch.testing.assert_close(opt(torch.ones(2, 4)), model(torch.ones(2, 4)))
        assert opt.stats.graphs == 1 and not opt.stats.failures
        alive.append(weakref.ref(model))
        del model, opt
    gc.collect()
    assert not any(ref() for ref in alive), "a cache entry kept a model alive"
    assert hook.entries(Net.forward.__code__) == []


_GETTER = operator.itemgetter(0)


def _picks(xs):
    return _GETTER(xs) * 2


def test_a_rebound_global_getter_recompiles():
    global _GETTER
    compiled = ember.compiler.compile(_picks)
    xs = [torch.ones(2), torch.zeros(2)]
    torch.testing.assert_close(compiled(xs), torch.ones(2) * 2)
    _GETTER = operator.itemgetter(1)
    try:
        torch.testing.assert_close(compiled(xs), torch.zeros(2))
    finally:
        _GETTER = operator.itemgetter(0)
    assert compiled.stats.breaks == [] and len(compiled.stats.compiled) == 2


@torch.no_grad()
def _no_grad_step(p, g):
    p.sub_(0.1 * g)
    return p * 2


def test_a_grad_decorated_helper_is_inlined_in_its_mode():
    def f(p, g):
        return _no_grad_step(p, g), torch.is_grad_enabled()

    p = torch.ones(3, requires_grad=True)
    compiled = ember.compiler.compile(f, backend=CompileCounter())
    out, enabled = compiled(p, torch.ones(3))
    assert enabled and not out.requires_grad and torch.is_grad_enabled()
    torch.testing.assert_close(p.detach(), torch.full((3,), 0.9))
    assert compiled.stats.breaks == [] and compiled.stats.failures == []


def test_globals_of_another_module_are_guarded_and_read_at_call_time(monkeypatch):
    import sys
    import types

    helpers = types.ModuleType("ember_test_helpers")
    exec(
        "import torch\nSCALE = 2.0\nW = torch.ones(3)\n"
        "def helper(x):\n    return x * SCALE + W + len([1, 2])\n",
        helpers.__dict__,
    )
    monkeypatch.setitem(sys.modules, "ember_test_helpers", helpers)

    def f(x):
        return helpers.helper(x)

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter)
    x = torch.ones(3)
    torch.testing.assert_close(compiled(x), torch.full((3,), 5.0))
    helpers.SCALE = 3.0  # a constant of the other module: guarded, so it recompiles
    torch.testing.assert_close(compiled(x), torch.full((3,), 6.0))
    helpers.W = torch.zeros(3)  # a tensor of the other module: a graph input, read anew
    torch.testing.assert_close(compiled(x), torch.full((3,), 5.0))
    assert counter.frame_count == 2


def test_a_graph_that_raises_inside_a_grad_mode_block_restores_the_mode():
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y + 1

    def raising_backend(gm, example_inputs):
        def run(*args):
            gm(*args)
            torch._C._set_grad_enabled(False)  # as a graph stopped inside the block would
            raise RuntimeError("the kernel failed")

        return run

    compiled = ember.compiler.compile(f, backend=raising_backend)
    with pytest.raises(RuntimeError, match="the kernel failed"):
        compiled(torch.ones(2))
    assert torch.is_grad_enabled()


def test_autocast_and_inference_mode_blocks_are_captured():
    def mixed(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
        with torch.inference_mode():
            z = y.float() * 2
        return z, y.dtype, z.is_inference()

    counter = CompileCounter()
    compiled = ember.compiler.compile(mixed, backend=counter)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    got, want = compiled(x, w), mixed(x, w)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:] == (torch.bfloat16, True)
    assert counter.frame_count == 1 and compiled.stats.breaks == []
    assert not torch.is_autocast_enabled("cpu") and not torch.is_inference_mode_enabled()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_a_break_inside_an_autocast_block_resumes_inside_it(backend, capsys):
    def f(x, w):
        y = x.sin()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = y @ w
            print("inside")
            z2 = z @ w
            inside = torch.is_autocast_enabled("cpu")
        after = y @ w  # outside the block again: float32
        out = (z2.float().cos(), z.dtype, z2.dtype, after.dtype)
        return (*out, inside, torch.is_autocast_enabled("cpu"))

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter if backend == "eager" else backend)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(2):
        got = compiled(x, w)
    want = f(x, w)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:] == (torch.bfloat16, torch.bfloat16, torch.float32, True, False)
    assert not compiled.stats.failures  # no frame ran eagerly
    (only_break,) = compiled.stats.breaks  # the print; the resume leaves the block in-graph
    assert "print" in only_break.reason
    if backend == "eager":
        assert counter.frame_count == 2
    assert capsys.readouterr().out.count("inside") == 3
    assert not torch.is_autocast_enabled("cpu")


def test_a_block_split_inside_an_enclosing_autocast_is_left_natively():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
            print("inside")
            z = y @ w
        return z.dtype, (x @ w).dtype, torch.is_autocast_enabled("cpu")

    compiled = ember.compiler.compile(f, backend="eager")
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # on before the block: kept on after
        assert compiled(x, w) == f(x, w) == (torch.bfloat16, torch.bfloat16, True)
    assert not compiled.stats.failures


def test_a_break_inside_inference_mode_resumes_inside_it():
    def f(x):
        with torch.inference_mode():
            y = x * 2
            print("inside")
            z = y + 1
        return z.is_inference(), (x + 1).is_inference(), torch.is_inference_mode_enabled()

    compiled = ember.compiler.compile(f, backend="eager")
    x = torch.ones(2)
    assert compiled(x) == f(x) == (True, False, False)
    assert len(compiled.stats.breaks) == 1 and not compiled.stats.failures


def test_an_exception_after_a_break_inside_autocast_leaves_autocast():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
            print("inside")
            raise ValueError(str(y.dtype))

    compiled = ember.compiler.compile(f, backend="eager")
    with pytest.raises(ValueError, match="bfloat16"):
        compiled(torch.randn(2, 2))
    assert not torch.is_autocast_enabled("cpu")


def test_torch_compile_arguments_are_accepted_and_options_reach_the_backend():
    seen = []

    def configurable(gm, example_inputs, options=None):
        seen.append(options)
        return gm.forward

    def f(x):
        return x * 2

    x = torch.ones(2)
    for options in ({"a": 1}, {"a": 2}):
        compiled = ember.compiler.compile(
            f, backend=configurable, mode="max-autotune", dynamic=False, options=options
        )
        torch.testing.assert_close(compiled(x), x * 2)
    assert seen == [{"a": 1, "mode": "max-autotune"}, {"a": 2, "mode": "max-autotune"}]
    with pytest.raises(ValueError, match="unknown mode"):
        ember.compiler.compile(f, mode="fastest")
    with pytest.raises(TypeError, match="takes no options"):
        ember.compiler.compile(f, backend="eager", options={"a": 1})
    decorated = ember.compiler.compile(mode="default")(f)
    torch.testing.assert_close(decorated(x), x * 2)


def test_a_backend_that_refuses_a_graph_leaves_the_frame_eager_with_the_reason():
    def f(x, y):
        x.t_()  # aotgraph refuses a metadata change on an input that requires grad
        return x * y

    compiled = ember.compiler.compile(f, backend="aot_eager")
    leaf = torch.arange(6.0).view(2, 3).requires_grad_()
    x, x_eager, y = leaf * 1, leaf * 1, torch.ones(3, 2, requires_grad=True)
    torch.testing.assert_close(compiled(x, y), f(x_eager, y))
    assert x.shape == x_eager.shape == (3, 2)
    (failure,) = compiled.stats.failures
    assert failure.category == "backend" and "metadata is changed in place" in failure.reason

    def g(x, y):  # a frame of its own: f is now marked to run eagerly
        x.t_()
        return x * y

    with pytest.raises(ember.compiler.FullGraphError, match="backend 'aot_eager' failed"):
        ember.compiler.compile(g, backend="aot_eager", fullgraph=True)(leaf * 1, y)


def test_an_unknown_inductor_option_is_an_error_at_compile_time():
    def f(x):
        return x + 1

    with pytest.raises(ValueError, match="has no option 'cflagz'; its options are cflags, cxx"):
        ember.compiler.compile(f, options={"cflagz": ["-O1"]})
    ember.compiler.compile(f, options={"cflags": ["-O1"]}, mode="max-autotune")  # known: fine
