"""Node metadata: nn_module_stack, source_fn_stack and stack_trace on every node capture
makes, in the forms torch's own capture writes; re-capture of a graph module keeps the
metadata (custom keys included) of the nodes it re-creates."""

from __future__ import annotations

import operator

import torch
from torch import nn

from ember.capture import hook
from ember.capture.frame_compiler import FrameCompiler

HERE = __file__


def capture(fn, *args) -> torch.fx.GraphModule:
    """The one graph capture makes of ``fn(*args)`` (a function or a module's forward)."""
    code = (fn.forward if isinstance(fn, nn.Module) else fn).__code__
    compiler = FrameCompiler(lambda gm, example: gm.forward, "eager", entry_codes=(code,))
    with hook.intercepting(compiler):
        fn(*args)
    (compiled,) = compiler.stats.compiled
    return compiled.graph


def ops(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


def paths(node: torch.fx.Node) -> list[tuple[str, str]]:
    """The node's module stack as (path, type name) pairs, outermost first."""
    stack = node.meta.get("nn_module_stack", {})
    return [(path, cls.__name__) for path, cls in stack.values()]


def line_of(text: str) -> int:
    """The line of this file whose code contains ``text``."""
    with open(HERE) as f:
        for i, line in enumerate(f, 1):
            if text in line and not line.lstrip().startswith(("#", '"')):
                return i
    raise AssertionError(text)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x.sin()  # block line


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)  # layer call
        return helper(self.head, x).sum(dim=-1)  # head call


def helper(head, x):
    return head(x) * 2  # helper line


def test_every_node_has_the_keys() -> None:
    gm = capture(Net(), torch.randn(2, 4))
    assert len(ops(gm)) == 12
    for node in gm.graph.nodes:
        if node.op == "output":
            assert "stack_trace" not in node.meta  # as torch: the output node has none
            continue
        assert node.meta["stack_trace"].startswith('  File "'), node
        if node.op != "placeholder":
            (entry,) = node.meta["source_fn_stack"]
            assert entry[0] == node.name


def test_module_stack_of_nested_modules_and_module_list_items() -> None:
    net = Net()
    gm = capture(net, torch.randn(2, 4))
    by_name = {n.name: n for n in gm.graph.nodes}
    assert paths(by_name["linear"]) == [("L['self'].layers.0", "Block"),
                                        ("L['self'].layers.0.lin", "Linear")]  # fmt: skip
    assert paths(by_name["relu"]) == [("L['self'].layers.0", "Block")]
    assert paths(by_name["sin_1"]) == [("L['self'].layers.1", "Block")]
    assert paths(by_name["relu_2"]) == [("L['self'].head", "Sequential"),
                                        ("L['self'].head.0", "ReLU")]  # fmt: skip
    assert "nn_module_stack" not in by_name["sum_1"].meta  # the frame's own module: none
    # Dynamo's keys: the module's id (the same module called again gets "@1")
    keys = list(by_name["linear"].meta["nn_module_stack"])
    assert keys == [str(id(net.layers[0])), str(id(net.layers[0].lin))]
    # a placeholder carries the stack where it was first used
    weight = by_name["self_layers_1__lin_weight"]
    assert paths(weight)[-1] == ("L['self'].layers.1.lin", "Linear")


def test_a_module_called_twice_gets_a_second_key() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.GELU()

        def forward(self, x):
            return self.act(self.act(x))

    twice = Twice()
    gm = capture(twice, torch.randn(3))
    first, second = ops(gm)
    assert list(first.meta["nn_module_stack"]) == [str(id(twice.act))]
    assert list(second.meta["nn_module_stack"]) == [f"{id(twice.act)}@1"]


def test_source_fn_stack_names_the_function_method_or_leaf_module() -> None:
    gm = capture(Net(), torch.randn(2, 4))
    source_fn = {n.name: n.meta["source_fn_stack"][-1][1] for n in ops(gm)}
    assert source_fn["linear"] is nn.Linear  # inside a torch.nn leaf module: its type
    assert source_fn["relu_2"] is nn.ReLU
    assert source_fn["relu"] is torch.relu  # a torch function in the user's module
    assert source_fn["sin"] == "sin"  # a tensor method: its name
    assert source_fn["add"] is operator.add
    assert source_fn["mul"] is operator.mul  # in a plain function, under the Sequential


def test_stack_trace_names_the_users_file_and_lines() -> None:
    gm = capture(Net(), torch.randn(2, 4))
    by_name = {n.name: n for n in gm.graph.nodes}
    trace = by_name["linear_2"].stack_trace
    # outermost first; torch.nn's own forward (Linear, Sequential) left out, as in torch
    assert trace == (
        f'  File "{HERE}", line {line_of("# head call")}, in forward\n'
        f"    return helper(self.head, x).sum(dim=-1)  # head call\n"
        f'  File "{HERE}", line {line_of("# helper line")}, in helper\n'
        f"    return head(x) * 2  # helper line\n"
    )
    assert by_name["add_1"].stack_trace.splitlines()[-2:] == [
        f'  File "{HERE}", line {line_of("# block line")}, in forward',
        "    return torch.relu(self.lin(x)) + x.sin()  # block line",
    ]
    assert f"line {line_of('# layer call')}" in by_name["add_1"].stack_trace


def test_print_readable_shows_the_source_line() -> None:
    gm = capture(Net(), torch.randn(2, 4))
    text = gm.print_readable(print_output=False)
    assert f"# File: {HERE}:{line_of('# block line')} in forward, code: return torch.relu" in text
    assert f"# File: {HERE}:{line_of('# helper line')} in helper, code: return head(x) * 2" in text


def test_grad_mode_nodes_have_the_keys_too() -> None:
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y + x

    gm = capture(f, torch.randn(2, requires_grad=True))
    switches = [n for n in ops(gm) if n.target is torch._C._set_grad_enabled]
    assert len(switches) == 2
    for node in switches:
        assert node.meta["source_fn_stack"] == [(node.name, torch._C._set_grad_enabled)]
        assert node.stack_trace.startswith(f'  File "{HERE}"')


def edited_graph_module() -> torch.fx.GraphModule:
    """A graph module a user edited after tracing: custom keys and stack traces of their own."""

    def f(x, w):
        y = (x @ w).relu()
        a, b = y.chunk(2)
        return (a + 1).sum() + b.mean()

    gm = torch.fx.symbolic_trace(f)
    for node in gm.graph.nodes:
        node.meta["quant"] = ("int8", node.name)
        node.meta["stack_trace"] = f'  File "model.py", line 7, in f\n    {node.name} = ...\n'
        node.meta["nn_module_stack"] = {"k": ("L['self'].block", nn.Linear)}
    gm.recompile()
    return gm


def test_recapture_of_a_graph_module_keeps_each_nodes_meta() -> None:
    gm = edited_graph_module()
    x, w = torch.randn(4, 3), torch.randn(3, 3)
    out = capture(gm, x, w)
    expected = gm(x, w)
    assert torch.allclose(out(x, w)[0], expected)
    kinds = {n.name: n.op for n in gm.graph.nodes}
    for node in out.graph.nodes:
        if node.op == "output":
            continue
        name = node.meta["quant"][1]  # the original node this one re-creates
        assert kinds[name] == node.op or node.op == "call_function", node
        assert node.meta["stack_trace"] == f'  File "model.py", line 7, in f\n    {name} = ...\n'
        assert node.meta["nn_module_stack"] == {"k": ("L['self'].block", nn.Linear)}
        assert "example_value" in node.meta  # capture's own value, not the original's
    recreated = {n.name: n.meta["quant"][1] for n in out.graph.nodes if "quant" in n.meta}
    # the items of chunk's tuple keep the original getitem nodes' meta
    assert recreated["getitem"] == "getitem" and recreated["getitem_1"] == "getitem_1"
    assert recreated["matmul"] == "matmul" and recreated["x"] == "x"


def test_recapture_without_custom_meta_points_at_the_generated_code() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x.cos() + 1)
    out = capture(gm, torch.randn(3))
    (cos, _add) = ops(out)
    assert "quant" not in cos.meta
    assert cos.stack_trace.startswith('  File "<eval_with_key>')


def test_recapture_gives_a_call_modules_meta_to_the_ops_of_its_forward() -> None:
    class Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(3, 3)
            self.scale = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return self.proj(x) * self.scale

    gm = torch.fx.symbolic_trace(Small())  # proj: a call_module node, scale: a get_attr
    for node in gm.graph.nodes:
        node.meta["quant"] = node.name
    x = torch.randn(2, 3)
    out = capture(gm, x)
    assert [p.name for p in out.graph.find_nodes(op="placeholder")][1:] == [
        "self_proj_weight", "self_proj_bias", "self_scale"]  # fmt: skip
    assert torch.allclose(out(x, gm.proj.weight, gm.proj.bias, gm.scale)[0], gm(x))
    quant = {n.name: n.meta.get("quant") for n in out.graph.nodes}
    assert quant["linear"] == "proj"  # made inside Linear.forward, called from proj's line
    assert quant["mul"] == "mul"
    assert quant["x"] == "x"
    assert quant["self_scale"] == "scale"  # the get_attr, now an input
    assert quant["self_proj_weight"] is None  # read inside Linear.forward: no node of gm's


class Explicit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def helper(self, x):
        return x.cos()  # method line

    def forward(self, x):
        return self.helper(self.block.forward(x))  # explicit forward


def test_explicit_forward_calls_push_the_module_and_methods_add_frames() -> None:
    gm = capture(Explicit(), torch.randn(2, 4))
    by_name = {n.name: n for n in gm.graph.nodes}
    assert paths(by_name["relu"]) == [("L['self'].block", "Block")]  # m.forward(x) as m(x)
    assert paths(by_name["linear"])[-1] == ("L['self'].block.lin", "Linear")
    cos = by_name["cos"]
    assert "nn_module_stack" not in cos.meta  # a method of the frame's own module
    assert cos.stack_trace.splitlines() == [
        f'  File "{HERE}", line {line_of("# explicit forward")}, in forward',
        "    return self.helper(self.block.forward(x))  # explicit forward",
        f'  File "{HERE}", line {line_of("# method line")}, in helper',
        "    return x.cos()  # method line",
    ]


def squares(x):
    for _ in range(2):
        yield x * x  # generator line


def test_a_generator_resumed_from_two_lines_names_each() -> None:
    def f(x):
        g = squares(x)
        a = next(g)  # first resume
        b = next(g)  # second resume
        return a + b

    gm = capture(f, torch.randn(3))
    first, second = (n for n in ops(gm) if n.target is operator.mul)
    assert f"line {line_of('# first resume')}," in first.stack_trace
    assert f"line {line_of('# second resume')}," in second.stack_trace
    assert second.stack_trace.endswith("    yield x * x  # generator line\n")


def test_checkpoint_regions_are_tagged_for_recompute() -> None:
    """torch.utils.checkpoint's function: its nodes carry torch's recompute tags, one
    region number per call; what runs outside carries none."""
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint

    lin = nn.Linear(4, 4)

    def f(x):
        h = checkpoint(lambda t: lin(t).relu().sin(), x, use_reentrant=False)
        g = checkpoint(lambda t: t.cos() * 2, h, use_reentrant=False)
        return g.exp()

    gm = capture(f, torch.randn(3, 4, requires_grad=True))
    tags = [(n.meta.get("recompute"), n.meta.get("ac_graph_id")) for n in ops(gm)]
    prefer = CheckpointPolicy.PREFER_RECOMPUTE
    assert tags == [(prefer, 1)] * 3 + [(prefer, 2)] * 2 + [(None, None)]
