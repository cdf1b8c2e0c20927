"""The IR checker: well-formed programs pass; corrupted ones fail naming the node."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.inductor.check import IRError, check
from ember.inductor.ir import Expr, Pointwise, Program, Reduction
from ember.inductor.lowering import lower_graph
from ember.inductor.ops import Op


def _program() -> Program:
    x = torch.randn(4, 8)
    gm = make_fx(lambda x: ((x.exp() + 1).sum(1), x * 2))(x)
    prog = lower_graph(gm, [x])
    check(prog)
    return prog


def _swap_body(prog: Program, k: int, body: Expr) -> Program:
    nodes = list(prog.nodes)
    nodes[k] = dataclasses.replace(nodes[k], body=body)
    return dataclasses.replace(prog, nodes=nodes)


def test_load_of_undefined_buffer() -> None:
    prog = _program()
    node = prog.nodes[1]
    assert isinstance(node, Pointwise)
    bad = Expr(Op.LOAD, torch.float32, (), ("buf9", node.body.args[0].arg[1], ()))
    with pytest.raises(IRError, match="buf1: load of buf9 before it is defined"):
        check(_swap_body(prog, 1, bad))


def test_out_of_bounds_load() -> None:
    prog = _program()
    load = next(e for e in [prog.nodes[1].body.args[0]] if e.op is Op.LOAD)
    name, index, ind = load.arg
    bad = dataclasses.replace(load, arg=(name, index + 40, ind))
    with pytest.raises(IRError, match="buf1: load of x_1 reaches index 71, past its 32 elements"):
        check(
            _swap_body(
                prog,
                1,
                dataclasses.replace(prog.nodes[1].body, args=(bad, prog.nodes[1].body.args[1])),
            )
        )


def test_mixed_dtypes() -> None:
    prog = _program()
    body = prog.nodes[1].body
    bad = dataclasses.replace(body, args=(body.args[0], Expr(Op.CONST, torch.float64, (), 2.0)))
    with pytest.raises(IRError, match=r"buf1: MUL mixes torch.float32 and torch.float64"):
        check(_swap_body(prog, 1, bad))


def test_unbound_loop_variable() -> None:
    prog = _program()
    red = prog.nodes[0]
    assert isinstance(red, Reduction)
    nodes = list(prog.nodes)
    nodes[0] = dataclasses.replace(red, reduce_ranges=())
    with pytest.raises(IRError, match=r"buf0: load of x_1 uses unbound \['r0'\]"):
        check(dataclasses.replace(prog, nodes=nodes))


def test_ranges_must_match_buffer() -> None:
    prog = _program()
    nodes = list(prog.nodes)
    nodes[1] = dataclasses.replace(nodes[1], ranges=(8, 4))
    with pytest.raises(IRError, match=r"buf1: ranges \[8, 4\] differ from sizes \[4, 8\]"):
        check(dataclasses.replace(prog, nodes=nodes))


def test_written_twice_and_comparison_dtype() -> None:
    prog = _program()
    with pytest.raises(IRError, match="buf1: written twice"):
        check(dataclasses.replace(prog, nodes=[*prog.nodes, prog.nodes[1]]))
    body = prog.nodes[1].body
    bad = Expr(Op.LT, torch.float32, (body.args[0], body.args[1]))
    with pytest.raises(IRError, match="buf1: LT must give bool"):
        check(_swap_body(prog, 1, bad))
