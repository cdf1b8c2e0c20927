"""Export with ember.capture, then lower to aten with ember.aotgraph: the two meet in plain data.

compiler-api depends on both packages, so the end-to-end workflow is tested here:
``ember.capture.export`` -> ``ep.signature.to_json()`` -> ``ember.aotgraph.lower_exported``
(inference and joint IR) -> run, for every zoo model, against eager (outputs, buffer
updates, gradients); and export -> save -> load -> lower -> save the aten program -> load.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from models import ZOO

import ember.capture as ec
from ember.aotgraph import lower_exported
from ember.capture.export_program import CheckError, ExportedProgram, ExportSignature

CASES = sorted(ZOO)


def _assert_same(got: Any, want: Any) -> None:
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    assert got_spec == want_spec
    for a, b in zip(got_leaves, want_leaves, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _lower(ep: ExportedProgram, **options: Any) -> Any:
    return lower_exported(
        ep.graph_module, ep.signature.to_json(), ep.state_dict, ep.constants, **options
    )


def _as_capture_program(lowered: Any) -> ExportedProgram:
    """The aten program as capture's ExportedProgram (its signature is capture's format), with
    its own copy of the parameters and buffers."""
    sig = ExportSignature.from_json(lowered.signature.to_json())
    state = copy.deepcopy(lowered.state_dict)
    return ExportedProgram(lowered.graph_module, sig, state, lowered.constants)


def _is_aten(gm: torch.fx.GraphModule) -> bool:
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    return all(isinstance(t, torch._ops.OpOverload) or t.__name__ == "getitem" for t in targets)


@pytest.mark.parametrize("name", CASES)
def test_zoo_lowered_to_aten_runs_as_eager(name):
    model, args = ZOO[name].make()
    eager = copy.deepcopy(model)
    lowered = _lower(ec.export(model, args))
    assert _is_aten(lowered.graph_module)
    mods = (lowered.module(), _as_capture_program(lowered).module())
    for seed in (1, 2):  # dropout draws eager's numbers; buffers update on each call
        torch.manual_seed(seed)
        want = eager(*args)
        for mod in mods:
            torch.manual_seed(seed)
            _assert_same(mod(*args), want)
    for mod in mods:
        state = mod.state_dict()
        for key, value in eager.state_dict().items():  # BatchNorm statistics included
            if key in state:
                torch.testing.assert_close(state[key], value, msg=key)


@pytest.mark.parametrize("name", CASES)
def test_zoo_joint_ir_gives_eager_gradients(name):
    model, args = ZOO[name].make()
    eager = copy.deepcopy(model)
    lowered = _lower(ec.export(model, args), joint=True)
    sig = lowered.signature
    torch.manual_seed(1)
    outs = pytree.tree_leaves(eager(*args))
    cotangents = [torch.randn_like(o) for o in outs]
    params = dict(eager.named_parameters())
    want = torch.autograd.grad(outs, list(params.values()), cotangents, allow_unused=True)
    torch.manual_seed(1)
    got = lowered.graph_module(*lowered.inputs(args), *cotangents)
    by_target = {s.target: v for s, v in zip(sig.outputs, got, strict=True) if s.target}
    user = [v for s, v in zip(sig.outputs, got, strict=True) if s.kind == "user_output"]
    _assert_same(user, outs)
    grads = sig.outputs_of("gradient_to_parameter")
    assert grads and {s.target for s in grads} <= set(params)
    for fqn, grad in zip(params, want, strict=True):
        if grad is not None:
            torch.testing.assert_close(by_target[fqn], grad, rtol=1e-4, atol=1e-5, msg=fqn)


def test_saved_program_lowered_after_load_and_the_aten_program_saved_again(tmp_path):
    model, args = ZOO["cnn-train"].make()
    eager = copy.deepcopy(model)
    ec.export(model, args).save(str(tmp_path / "torch-level"))
    loaded = ec.load(str(tmp_path / "torch-level"))  # placeholders carry summaries, no fakes
    lowered = _lower(loaded)
    _as_capture_program(lowered).save(str(tmp_path / "aten"))
    again = ec.load(str(tmp_path / "aten")).module()  # aten targets by name, through the allowlist
    torch.manual_seed(0)
    want = eager(*args)
    _assert_same(again(*args), want)
    state = again.state_dict()
    torch.testing.assert_close(state["bn1.running_mean"], eager.bn1.running_mean)
    assert int(state["bn1.num_batches_tracked"]) == 1


@pytest.mark.parametrize(
    "name", ["cnn-eval", "gpt", "mlp", "moduledict", "rnn", "transformer-block"]
)
def test_zoo_with_a_dynamic_batch_runs_at_other_batch_sizes(name):
    model, args = ZOO[name].make()
    eager = copy.deepcopy(model)
    batch = ec.Dim("batch", min=2, max=64)
    ep = ec.export(model, args, dynamic_shapes=({0: batch},))
    lowered = _lower(ep, args=args)
    assert lowered.signature.extra["checks"][0]["sizes"][0] == "batch"
    bigger = (torch.cat([args[0], args[0], args[0]]),)
    mods = (lowered.module(), _as_capture_program(lowered).module())
    if name == "cnn-eval":  # tracing aten.convolution guards on the batch size: a relation
        assert lowered.signature.extra["relations"][-1]["expr"].endswith("< 16")
        with pytest.raises(CheckError, match="the exported graph needs s"):
            mods[1](torch.cat([args[0]] * 8))  # 16
    for mod in mods:
        torch.manual_seed(1)
        want = eager(*bigger)
        torch.manual_seed(1)
        _assert_same(mod(*bigger), want)
    with pytest.raises(CheckError, match="above its max 64"):
        mods[1](torch.cat([args[0]] * 40))
