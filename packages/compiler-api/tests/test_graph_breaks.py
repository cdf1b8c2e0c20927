"""Graph breaks: the graph so far runs, the instruction runs natively, a resume function goes on."""

from __future__ import annotations

import traceback

import pytest
import torch

import ember.compiler
from ember.compiler.testing import CompileCounter


def run(fn, *args, **kwargs):
    counter = CompileCounter()
    compiled = ember.compiler.compile(fn, backend=counter)
    for _ in range(3):
        got = compiled(*args, **kwargs)
    torch.testing.assert_close(got, fn(*args, **kwargs))
    return compiled, counter


def _line_of(marker: str) -> int:
    with open(__file__) as fh:
        return next(i for i, line in enumerate(fh, 1) if line.rstrip().endswith(marker))


def test_two_breaks_make_three_graphs(capsys):
    def f(x):
        x = x.sin()
        print("first")
        x = x.cos()
        print("second")
        return x.tan()

    compiled, counter = run(f, torch.randn(4))
    assert counter.frame_count == 3 and len(compiled.stats.breaks) == 2
    assert capsys.readouterr().out.count("first") == 4  # three compiled calls and one eager


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_branch_on_a_tensor_takes_the_branch_eager_would(sign):
    def toy_example(a, b):
        x = a / (torch.abs(a) + 1)
        if b.sum() < 0:
            b = b * -1
        return x * b

    a, b = torch.randn(5), torch.ones(5) * sign
    compiled, counter = run(toy_example, a, b)
    assert counter.frame_count == 2
    # the other direction compiles its own resume function, once
    compiled(a, -b)
    compiled(a, -b)
    assert counter.frame_count == 3
    torch.testing.assert_close(compiled(a, -b), toy_example(a, -b))


def test_break_inside_a_loop(capsys):
    def f(x):
        for i in range(3):
            x = x * 2
            print("step", i)
            x = x + i
        return x

    compiled, _ = run(f, torch.ones(3))
    assert len(compiled.stats.breaks) >= 1 and compiled.stats.failures == []


def helper_that_prints(x):
    y = x * 3
    print("inside helper")
    return y + 1


def test_break_inside_an_inlined_call_happens_at_the_call_site(capsys):
    def outer(x):
        a = x.relu()
        b = helper_that_prints(a)  # the callee then runs as its own frame, captured apart
        return b - a

    compiled, counter = run(outer, torch.randn(4))
    assert compiled.stats.breaks[0].location.startswith(f'File "{__file__}"')
    assert counter.frame_count >= 3  # outer before, helper's two halves, outer after
    assert compiled.stats.failures == []


def test_break_at_a_call_with_keyword_arguments(capsys):
    def f(x):
        y = x + 1
        print("value", end="\\n", sep=" ")
        return y * 2

    _, counter = run(f, torch.randn(3))
    assert counter.frame_count == 2


def test_f_string_of_a_tensor_breaks(capsys):
    def f(x):
        y = x.exp()
        label = f"{y.sum()}"
        return y, len(label) > 0

    run(f, torch.randn(2))


def test_breaks_in_functions_with_closures_and_star_arguments(capsys):
    scale = 3.0

    def f(x, *rest, k=2, **opts):
        y = x * scale + sum(rest)
        print("break", opts)
        return y * k

    _, counter = run(f, torch.ones(2), torch.ones(2), k=4, tag="a")
    assert counter.frame_count == 2


def test_attribute_store_on_a_module_runs_natively():
    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            self.calls = self.calls + 1
            return self.lin(x)

    model = Counter()
    compiled = ember.compiler.compile(model)
    for _ in range(3):
        compiled(torch.ones(1, 2))
    assert model.calls == 3


def raises_after_break(x):
    print("before")
    y = x * 2
    if y.shape[0] == 4:
        raise ValueError("too long")  # LINE: after break
    return y


def test_exception_after_a_break_names_the_users_line(capsys):
    compiled = ember.compiler.compile(raises_after_break)
    with pytest.raises(ValueError, match="too long") as info:
        compiled(torch.ones(4))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert (frames[-1].filename, frames[-1].lineno) == (__file__, _line_of("# LINE: after break"))


def test_fullgraph_refuses_to_break(capsys):
    def f(x):
        print("nope")
        return x

    with pytest.raises(ember.compiler.FullGraphError, match="print"):
        ember.compiler.compile(f, fullgraph=True)(torch.ones(1))


def test_frames_with_cells_break_and_carry_the_cells_contents(capsys):
    def f(x, ws):
        scaled = [x * w for w in ws]  # x and k are cells: the comprehension reads them
        k = x.sum()
        print("break here")
        k = k + 1  # the resumed frame rebinds the cell; the closure below sees it
        shifted = [s + k for s in scaled]
        return torch.stack(shifted)

    compiled, counter = run(f, torch.ones(2), [1.0, 2.0])
    assert compiled.stats.failures == [] and len(compiled.stats.breaks) == 1
    assert counter.frame_count == 2


def test_a_closure_alive_at_the_break_runs_the_frame_eagerly_with_the_reason(capsys):
    def f(x):
        k = x.sum()

        def inner():
            return k

        print("break here")
        return x * inner()

    compiled, _ = run(f, torch.ones(2))
    (failure,) = compiled.stats.failures
    assert "cannot be rebuilt" in failure.reason


def test_break_inside_try_runs_eagerly_with_the_reason(capsys):
    def f(x):
        try:
            print("inside try")
            return x + 1
        except ValueError:
            return x

    compiled, _ = run(f, torch.ones(2))
    assert any("try" in f.reason for f in compiled.stats.failures)


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    print("woo")  # LINE: woo
    if b.sum() < 0:  # LINE: jump
        b = b * -1
    return x * b


def test_explain_reads_like_dynamos_troubleshooting_guide(capsys):
    out = ember.compiler.explain(toy_example)(torch.randn(10), torch.randn(10))
    assert (out.graph_count, out.graph_break_count) == (3, 2)
    first, second = out.break_reasons
    assert first.reason == "call to builtin print"
    assert (first.filename, first.lineno) == (__file__, _line_of("# LINE: woo"))
    assert second.reason == "data-dependent jump (`if b.sum() < 0:  # LINE: jump`)"
    assert second.lineno == _line_of("# LINE: jump") and second.hint
    assert out.ops_per_graph[0] == ("abs", "add", "truediv")
    assert len(out.guards) == 3 and out.compile_time > 0
    text = str(out)
    assert "Graph count: 3" in text and "call to builtin print" in text
    # explaining leaves nothing behind in the caches
    from ember.capture import hook

    assert hook.entries(toy_example.__code__) == []


def test_explain_reports_item_with_its_hint(capsys):
    def f(x):
        return x * x.sum().item()

    (reason,) = ember.compiler.explain(f)(torch.ones(3)).break_reasons
    assert "item()" in reason.reason and "torch.where" in reason.hint


def test_graph_break_marker_splits_the_graph():
    def f(x):
        y = x.sin()
        ember.compiler.graph_break()
        return y.cos()

    compiled, counter = run(f, torch.randn(3))
    assert counter.frame_count == 2
    assert compiled.stats.breaks[0].reason == "graph_break() called"


def test_is_compiling_is_true_only_while_capturing():
    def f(x):
        if ember.compiler.is_compiling():
            return x + 1
        return x - 1

    compiled = ember.compiler.compile(f)
    torch.testing.assert_close(compiled(torch.zeros(2)), torch.ones(2))
    assert not ember.compiler.is_compiling()


def test_disable_runs_a_function_without_ember_and_breaks_at_its_call():
    seen = []

    def inner_helper(x):
        seen.append(ember.compiler.is_compiling())
        return x * 2

    quiet = ember.compiler.disable(inner_helper)

    def f(x):
        return quiet(x.sin()) + 1

    compiled, counter = run(f, torch.randn(3))
    assert counter.frame_count == 2 and len(compiled.stats.breaks) == 1
    assert quiet(torch.ones(1)).item() == 2.0


def test_disable_not_recursive_skips_only_that_frame():
    def leaf(x):
        return x.relu()

    def middle(x):
        return leaf(x) * 3

    ember.compiler.disable(middle, recursive=False)

    def top(x):
        return middle(x) + 1

    compiled, _ = run(top, torch.randn(3))
    from ember.capture import hook

    assert hook.is_skipped(middle.__code__)
    captured = {c.code.split(" (")[0].rsplit(".", 1)[-1] for c in compiled.stats.compiled}
    assert "leaf" in captured  # called by the skipped frame: captured on its own
    assert "middle" not in captured


def test_assume_constant_result_folds_the_call():
    calls = []

    @ember.compiler.assume_constant_result
    def factor():
        calls.append(1)
        return 3.0

    def f(x):
        return x * factor()

    _, counter = run(f, torch.ones(2))
    assert counter.frame_count == 1 and len(calls) <= 2  # once while capturing, once eagerly


def test_allow_in_graph_takes_a_list_and_disallow_checks_its_argument():
    def a(x):
        return x.sin()

    def b(x):
        return x.cos()

    ember.compiler.allow_in_graph([a, b])
    try:
        counter = CompileCounter()
        compiled = ember.compiler.compile(lambda x: a(x) + b(x), backend=counter)
        compiled(torch.ones(2))
        targets = {n.target for n in counter.graphs[0].graph.nodes}
        assert a in targets and b in targets
    finally:
        ember.compiler.disallow_in_graph(a)
        ember.compiler.disallow_in_graph(b)
    with pytest.raises(ValueError, match="nothing to disallow"):
        ember.compiler.disallow_in_graph(print)


def test_raise_inside_compiled_code_is_a_terminal_break():
    def f(x):
        y = x * 2
        if x.dim() != 2:
            raise ValueError(f"expected 2-d, got {x.dim()}-d")
        return y

    counter = CompileCounter()
    compiled = ember.compiler.compile(f, backend=counter)
    for _ in range(2):
        with pytest.raises(ValueError, match="expected 2-d, got 1-d"):
            compiled(torch.ones(3))
    assert counter.frame_count == 1 and compiled.stats.breaks[0].category == "exception"
    torch.testing.assert_close(compiled(torch.ones(2, 2)), torch.ones(2, 2) * 2)


def test_grad_mode_blocks_are_captured_in_the_graph():
    lin = torch.nn.Linear(3, 3)

    def f(x):
        y = lin(x)
        with torch.no_grad():
            z = lin(y) * 2
        with torch.set_grad_enabled(False):
            q = y * 3
        return y + z, z.requires_grad, q.requires_grad

    x = torch.randn(2, 3)
    compiled, counter = run(f, x)
    out, z_grad, q_grad = compiled(x)
    assert (z_grad, q_grad) == (False, False) and out.requires_grad
    assert counter.frame_count == 1 and torch.is_grad_enabled()
    out.sum().backward()
    assert lin.weight.grad is not None


def test_generated_code_is_immune_to_shadowed_builtins(capsys):
    source = (
        "import torch\n"
        "iter = getattr = setattr = None  # a module that shadows builtins\n"
        "class Box:\n"
        "    pass\n"
        "def f(x, box):\n"
        "    for i in range(2):\n"
        "        x = x * 2\n"
        "        print('turn', i)\n"
        "    box.value = x.sum()\n"
        "    return x\n"
    )
    namespace: dict[str, object] = {"__name__": "shadowing"}
    exec(compile(source, "<shadowing>", "exec"), namespace)
    f, box_type = namespace["f"], namespace["Box"]
    compiled = ember.compiler.compile(f)
    eager_box, box = box_type(), box_type()
    torch.testing.assert_close(compiled(torch.ones(2), box), f(torch.ones(2), eager_box))
    torch.testing.assert_close(box.value, eager_box.value)
    assert compiled.stats.failures == []


def test_a_break_with_a_pending_call_below_it(capsys):
    def f(x):
        print(x.sum().item())  # NULL, print below the break at item()
        vals = []
        vals.append(x.max().item())  # a bound list.append below the break
        return x * vals[0] + len(sorted(["bb", "a"], key=len)[0])

    compiled, counter = run(f, torch.ones(3))
    assert compiled.stats.failures == []
    assert [b.reason.split(" with")[0] for b in compiled.stats.breaks] == [
        "reading a tensor's value",
        "call to builtin print",
        "reading a tensor's value",
    ]
    assert counter.frame_count == 3


def test_a_break_inside_a_grad_mode_block_resumes_inside_it(capsys):
    def f(x, w):
        y = x @ w
        with torch.no_grad():
            z = y * 2
            print("inside")  # the block is exited before, and re-entered after, the print
            z = z + torch.is_grad_enabled()
        return y.sum() + z.sum()

    x = torch.randn(3, 3, requires_grad=True)
    w = torch.randn(3, 3)
    compiled, counter = run(f, x, w)
    # The resume function starts under no_grad; y.sum() after the block records grad, so
    # it starts a third graph (aotgraph compiles a graph entered under no_grad without
    # autograd: issue 16).
    assert compiled.stats.failures == [] and counter.frame_count == 3
    compiled(x, w).backward()
    assert torch.is_grad_enabled()
    expected = x.grad.clone()
    x.grad = None
    f(x, w).backward()
    torch.testing.assert_close(x.grad, expected)


def test_a_data_dependent_jump_inside_a_grad_mode_block(capsys):
    def f(x):
        with torch.enable_grad():
            z = x * 2
            if z.sum() > 0:
                z = z + 1
            else:
                z = z - 1
        return z, torch.is_grad_enabled()

    with torch.no_grad():
        compiled, counter = run(f, torch.ones(3))
        assert counter.frame_count == 2
        assert not torch.is_grad_enabled()
    assert compiled.stats.failures == [] and len(compiled.stats.breaks) == 1


def _raises(y):
    raise ValueError("from the native call")


def test_an_exception_at_a_break_inside_a_grad_mode_block_restores_the_mode(capsys):
    def f(x):
        with torch.no_grad():
            y = x * 3
            _raises(y)  # a break: the call runs natively and raises
        return y

    compiled = ember.compiler.compile(f, backend=CompileCounter())
    for _ in range(2):
        with pytest.raises(ValueError, match="from the native call"):
            compiled(torch.ones(2))
        assert torch.is_grad_enabled()
    assert compiled.stats.breaks and compiled.stats.failures == []


class _Managed:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_breaks_inside_other_blocks_run_the_frame_eagerly_with_the_reason(capsys):
    def in_try_with(x):
        try:
            with torch.no_grad():
                print("inside")
                return x + 1
        except ValueError:
            return x

    def in_user_block(x):
        with _Managed():
            print("inside")
            return x + 1

    # a user context manager is entered in the graph; a break inside its block is not taken
    for fn, words in [(in_try_with, "try block"), (in_user_block, "no graph break there")]:
        compiled, _ = run(fn, torch.ones(2))
        (failure,) = compiled.stats.failures
        assert words in failure.reason, failure.reason
