"""Portable packs: a fresh process loads one and runs the zoo with no compile; a pack that
is tampered with, made for other versions or badly signed is refused and nothing loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import types
import warnings
from pathlib import Path

import models
import pytest
import torch

# benchmarks/bench_pack.py: what running compiled graphs never needs, and how a pack is built
from bench_pack import COMPILING, HEAVY, build_pack
from models import ZOO

import ember.compiler
from ember.capture import prebuilt
from ember.compiler import ArtifactsWarning, artifacts
from ember.compiler.settings import section

MODELS_DIR = str(Path(models.__file__).resolve().parent.parent)

# Runs in a fresh process: load the pack, compile and call each model once, run a backward
# pass, then compare with eager (outputs and parameter gradients); report what was compiled,
# how long it took and which HEAVY modules the compiled calls had imported by then (before
# the comparisons: torch.testing imports sympy itself).
CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from models import ZOO
    backend, path, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    start = time.perf_counter()
    import ember.compiler
    before = set(sys.modules)
    report = ember.compiler.load_artifacts(path) if path != "-" else None
    imported = time.perf_counter() - start
    out = {"imported": imported, "loaded": None if report is None else report.loaded}

    def leaves(o):
        if isinstance(o, torch.Tensor):
            return [o]
        return [v for x in (o.values() if isinstance(o, dict) else o) for v in leaves(x)]

    runs = []
    for name in names:
        model, args = ZOO[name].make()
        opt = ember.compiler.compile(model, backend=backend)
        torch.manual_seed(1)
        t = time.perf_counter()
        got = opt(*args)
        first = time.perf_counter() - t
        out.setdefault("new_modules", sorted(set(sys.modules) - before))  # by the first call
        out.setdefault("dynamo", "torch._dynamo" in sys.modules)
        translator = ("ember.capture.translate", "ember.capture.tracer")
        out.setdefault("translator", [m for m in translator if m in sys.modules])
        sum(x.float().sum() for x in leaves(got)).backward()
        runs.append((name, model, args, got, opt))  # (a pack holds the entries of live ones)
        out[name] = {"first": first, "prebuilt": len(opt.stats.prebuilt),
                     "graphs": opt.stats.graphs}
    out["heavy"] = [m for m in os.environ["HEAVY"].split(",") if m in sys.modules]
    for name, model, args, got, opt in runs:
        reference, _ = ZOO[name].make()
        torch.manual_seed(1)
        want = reference(*args)
        for a, b in zip(leaves(got), leaves(want), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        sum(x.float().sum() for x in leaves(want)).backward()
        for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
    phases = ember.compiler.compile_times().phases
    out["phases"] = {k: v[0] for k, v in phases.items()}
    if os.environ.get("SAVE_TO"):  # the saving process: pack what it compiled
        saved = ember.compiler.save_artifacts(os.environ["SAVE_TO"])
        out["entries"], out["left_out"] = saved.entries, list(saved.left_out)
    print("RESULT " + json.dumps(out))
    """
)


def child(backend: str, pack: str, names: list[str], **env: str) -> dict:
    """Run CHILD in a fresh process with an empty disk cache of its own."""
    with tempfile.TemporaryDirectory(prefix="ember-pack-") as cache:
        environ = {**os.environ, "EMBER_CACHE_DIR": cache, **env}
        environ["HEAVY"] = ",".join(HEAVY)
        environ["PYTHONPATH"] = os.pathsep.join([MODELS_DIR, environ.get("PYTHONPATH", "")])
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, backend, pack, *names],
            capture_output=True, text=True, env=environ, timeout=600,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))  # type: ignore[no-any-return]


def save(backend: str, names: list[str], path: Path) -> ember.compiler.SaveReport:
    """Compile and call each model once in this process, then pack what was compiled."""
    ember.compiler.reset()
    return build_pack(backend, names, path)  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _forget_packs():
    yield
    prebuilt.clear()


@pytest.mark.parametrize(
    "backend,names",
    [("inductor", sorted(ZOO)), ("aot_eager", ["mlp", "transformer-block"]), ("eager", ["rnn"])],
)
def test_fresh_process_runs_the_pack_without_compiling(backend, names, tmp_path):
    """Saved by one fresh process, loaded by another, as a user would: what earlier tests
    leave in this process cannot count (docs/troubleshooting.md's example turns the
    report's call counter on for the rest of the process)."""
    pack = tmp_path / "zoo.ember"
    cache = str(tmp_path / "cache")
    saved = child(backend, "-", names, EMBER_CACHE_DIR=cache, SAVE_TO=str(pack))
    assert saved["entries"] == len(names) and saved["left_out"] == [], saved
    result = child(backend, str(pack), names)
    assert result["loaded"] is True
    for name in names:  # each frame served from the pack, none translated
        assert result[name]["prebuilt"] == 1 and result[name]["graphs"] == 0, (name, result)
    assert not [p for p in COMPILING if result["phases"].get(p)], result["phases"]
    # import, load and first call never import capture's translator, nor torch._dynamo (the
    # kernels' own modules are imported by the first call: ``import ember.compiler`` is lazy)
    assert result["translator"] == [] and result["dynamo"] is False, result["new_modules"]
    # nor, with the backward passes, anything that traces, lowers or prints code (the
    # comparisons with eager come after: torch.testing imports sympy)
    assert result["heavy"] == [], result["heavy"]


def _imported(code: str) -> list[str]:
    """Which of HEAVY a fresh interpreter that runs ``code`` has imported."""
    watch = f"import json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    proc = subprocess.run([sys.executable, "-c", f"{code}\n{watch}"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_aotgraph_runtime_imports_no_tracer():
    """A pack's runtimes (and the signatures and tangent uses they hold) need torch only."""
    assert _imported("import ember.aotgraph.runtime, ember.aotgraph.tangents") == []


def test_inductor_runtime_imports_no_code_generator():
    """Reading an inductor graph back from its record (``ember.inductor.compiled``) needs
    the wrapper's ``bind`` (``wrapper_bind``) and the kernel cache, not the lowering or the
    printers."""
    assert _imported("import ember.inductor.compiled") == []


def test_environment_variable_loads_the_pack(tmp_path):
    pack = tmp_path / "mlp.ember"
    save("aot_eager", ["mlp"], pack)
    result = child("aot_eager", "-", ["mlp"], EMBER_ARTIFACTS=str(pack))
    assert result["mlp"]["prebuilt"] == 1 and result["mlp"]["graphs"] == 0


def test_a_frame_the_pack_does_not_fit_compiles_as_usual(tmp_path):
    pack = tmp_path / "mlp.ember"
    save("aot_eager", ["mlp"], pack)
    ember.compiler.reset()
    assert ember.compiler.load_artifacts(pack).entries == 1
    model, _ = ZOO["mlp"].make()
    opt = ember.compiler.compile(model, backend="aot_eager")
    x = torch.randn(5, 32)  # the pack's entry was made for 8 rows
    torch.testing.assert_close(opt(x), model(x))
    assert opt.stats.graphs == 1 and opt.stats.prebuilt == []


def test_a_packed_entry_runs_the_guard_code_the_saving_process_compiled(tmp_path, monkeypatch):
    """The loader emits each entry's check (and the fetch of its re-resolved objects) from the
    packed guards, and finds the same text compiled in the pack: nothing is compiled again."""
    from ember.guards import codegen

    pack = tmp_path / "cnn.ember"
    save("aot_eager", ["cnn-eval"], pack)
    ember.compiler.reset()
    compiled: list[str] = []

    def counted(source, filename, *args, **kwargs):
        compiled.append(filename)
        return compile(source, filename, *args, **kwargs)

    monkeypatch.setattr(codegen, "compile", counted, raising=False)
    assert ember.compiler.load_artifacts(pack).entries == 1
    model, args = ZOO["cnn-eval"].make()
    opt = ember.compiler.compile(model, backend="aot_eager")
    torch.testing.assert_close(opt(*args), model(*args))
    assert opt.stats.prebuilt and opt.stats.graphs == 0
    assert compiled == []
    # the guards still check: another batch size is not served this entry
    wider = torch.randn(3, *args[0].shape[1:])
    torch.testing.assert_close(opt(wider), model(wider))
    assert opt.stats.graphs == 1 and compiled  # (that compile's check is compiled here)


def broken(x, k):
    y = x.sin() * k
    ember.compiler.graph_break()
    return y.cos() + k


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_graph_breaks_are_packed_with_their_resume_functions(backend, tmp_path):
    ember.compiler.reset()
    x = torch.randn(4)
    f = ember.compiler.compile(broken, backend=backend)
    f(x, 2)
    assert f.stats.graphs == 2 and len(f.stats.breaks) == 1
    report = ember.compiler.save_artifacts(tmp_path / "broken.ember")
    assert report.entries == 2 and report.left_out == ()
    ember.compiler.reset()  # as a new process: nothing compiled, the codes kept
    ember.compiler.load_artifacts(tmp_path / "broken.ember")
    g = ember.compiler.compile(broken, backend=backend)
    torch.testing.assert_close(g(x, 2), broken(x, 2))
    assert g.stats.graphs == 0 and len(g.stats.prebuilt) == 2  # the code and its resume
    repacked = ember.compiler.save_artifacts(tmp_path / "again.ember")  # entries from a pack
    assert repacked.entries == 2 and repacked.left_out == ()
    torch.testing.assert_close(g(x, 3), broken(x, 3))  # another constant: compiled as usual
    assert g.stats.graphs >= 1


def _refused(path: Path) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = ember.compiler.load_artifacts(path)
    assert not report.loaded and report.entries == 0
    assert [w.category for w in caught] == [ArtifactsWarning]
    assert prebuilt._PACKED == {}  # nothing of it reached the frame hook
    return report.reason


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("pack") / "f.ember"
    ember.compiler.reset()
    ember.compiler.compile(lambda x: x.cos() * 2, backend="eager")(torch.ones(3))
    ember.compiler.save_artifacts(path)
    return path.read_bytes()


def test_a_tampered_pack_is_refused(small_pack, tmp_path):
    path = tmp_path / "bad.ember"
    data = bytearray(small_pack)
    data[-10] ^= 0xFF  # one byte of the body
    path.write_bytes(bytes(data))
    assert "corrupt" in _refused(path)
    path.write_bytes(b"not a pack at all")
    assert "not an ember pack" in _refused(path)


def test_a_pack_for_other_versions_is_ignored(small_pack, tmp_path):
    head, _, body = small_pack[len(artifacts.MAGIC) :].partition(b"\n")
    header = json.loads(head)
    header["key"]["torch"] = "1.0.0"
    path = tmp_path / "old.ember"
    path.write_bytes(artifacts.MAGIC + json.dumps(header).encode() + b"\n" + body)
    assert "torch '1.0.0' != " in _refused(path)


def test_a_reresolved_object_of_another_shape_is_not_served(tmp_path):
    pack = tmp_path / "mlp.ember"
    save("eager", ["mlp"], pack)
    gelu = torch.nn.GELU.forward

    def patched(self, x):  # GELU.forward patched in the new process: another function
        return gelu(self, x) * 2

    for change in ("act", "layers", "patched"):
        ember.compiler.reset()
        ember.compiler.load_artifacts(pack)
        model, args = ZOO["mlp"].make()
        if change == "act":  # another class where the pack had a GELU
            model.act = torch.nn.ReLU()
        elif change == "layers":  # one more layer in the ModuleList (the tensors still match)
            model.layers.append(torch.nn.Linear(10, 10))
        else:
            torch.nn.GELU.forward = patched
        try:
            opt = ember.compiler.compile(model, backend="eager")
            torch.testing.assert_close(opt(*args), model(*args))
        finally:
            torch.nn.GELU.forward = gelu
        assert opt.stats.prebuilt == [] and opt.stats.graphs == 1, change


def test_signed_packs(tmp_path):
    ember.compiler.reset()
    ember.compiler.compile(lambda x: x.exp() - 1, backend="eager")(torch.ones(3))
    unsigned = tmp_path / "unsigned.ember"
    ember.compiler.save_artifacts(unsigned)
    signed = tmp_path / "signed.ember"
    with section.patch(artifacts_key="secret one"):
        ember.compiler.save_artifacts(signed)
        assert ember.compiler.load_artifacts(signed).loaded
        prebuilt.clear()
        assert "not signed" in _refused(unsigned)
    with section.patch(artifacts_key="another"):
        assert "signature does not match" in _refused(signed)


def test_every_guard_of_a_model_round_trips_by_name_or_from_the_frame():
    from ember.capture.frame_compiler import code_cache
    from ember.compiler.artifacts_codec import decode_guard, encode_guard
    from ember.guards import FrameSpec, GuardKind, WeakIdentity
    from ember.guards.codegen import build_fetch

    ember.compiler.reset()
    model, args = ZOO["moduledict"].make()
    ember.compiler.compile(model, backend="eager")(*args)
    forward = type(model).forward
    [entry] = code_cache(forward.__code__).entries
    spec = FrameSpec.from_function(forward)
    frame_args = (model, *args, ("cls", "reg"))  # the argument slots: self, x, which
    kinds = set()
    for guard in entry.guards.guards:
        data = json.loads(json.dumps(encode_guard(guard)))  # plain JSON all the way
        back, *pins = decode_guard(data, lambda s: build_fetch(s, spec)(*frame_args))
        kinds.add(guard.kind)
        if guard.kind is GuardKind.ID_MATCH:
            want = guard.expected
            want = want.get() if isinstance(want, WeakIdentity) else want
            got = back.expected.get() if isinstance(back.expected, WeakIdentity) else back.expected
            assert got is want, guard
            if isinstance(want, types.CodeType | types.FunctionType):  # checked by its code
                assert data["expected"]["code"] == prebuilt.code_key(
                    getattr(want, "__code__", want)
                )
            elif "reresolve" in data["expected"]:  # the class and children it implied, pinned
                assert pins[0].kind is GuardKind.TYPE_MATCH and pins[0].expected is type(want)
        else:
            assert back == guard and pins == [], guard
    assert {GuardKind.ID_MATCH, GuardKind.TENSOR_MATCH, GuardKind.MODULE_STATE} <= kinds


def test_counted_calls_still_pack_the_compiled_kernels():
    """With the report's call counter on (``count_calls()``, ``EMBER_REPORT``), each
    compiled graph is wrapped in a counter: the pack still holds the compiled kernels
    (the backward's too, built before packing), not the captured graph for the loading
    process to compile again."""
    ember.compiler.reset()
    ember.compiler.count_calls(True)
    try:
        model, args = ZOO["mlp"].make()
        opt = ember.compiler.compile(model, backend="inductor")
        opt(*args)
        frames, left_out = artifacts._frames()
    finally:
        ember.compiler.count_calls(False)
    assert left_out == [] and json.dumps(frames).count('"inductor": {') >= 2, frames
