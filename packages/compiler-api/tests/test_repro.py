"""The minifiers (issue 17 §4): after capture and after AOT, on planted bugs.

Each planted backend sits in ``planted_backends.py`` (a relu that raises, a gelu 0.1% off).
The compiled program must still give eager's result (the frame falls back with a reason),
and ``repro.py`` must be at most 20 code lines, run standalone, and fail the same way.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ember.compiler
from ember.compiler.minifier import Check, ddmin, minify
from ember.compiler.repro_settings import ReproSettings
from ember.compiler.testing import assert_same

sys.path.insert(0, str(Path(__file__).parent))
import planted_backends as planted

BACKENDS = ["eager", "aot_eager", "inductor"]
PLANTED = {  # (bug, after) -> the backend given to compile()
    ("relu", "capture"): planted.relu_bug,
    ("relu", "aot"): planted.aot_relu_bug,
    ("gelu", "capture"): planted.gelu_bug,
    ("gelu", "aot"): planted.aot_gelu_bug,
}
# How the standalone script fails: the exception's name on its last stderr line.
FAILS_WITH = {"relu": "PlantedReluError", "gelu": "AssertionError"}


@pytest.fixture(autouse=True)
def fresh() -> None:
    """A frame that failed runs eagerly from then on: each test starts with no such decision."""
    ember.compiler.reset()


def code_lines(path: Path) -> list[str]:
    """The non-blank, non-comment lines of a script."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def run_script(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, cwd=path.parent
    )


def compiled_mlp(backend: object, tmp_path: Path, **options: object) -> tuple[object, object]:
    torch.manual_seed(0)
    model = planted.MLP()
    opts = {"repro_dir": str(tmp_path), **options}
    return model, ember.compiler.compile(model, backend=backend, options=opts)


@pytest.mark.parametrize("after", ["capture", "aot"])
@pytest.mark.parametrize("bug", ["relu", "gelu"])
def test_planted_bug_minified(bug: str, after: str, tmp_path: Path) -> None:
    level = 4 if bug == "gelu" else 2
    model, fast = compiled_mlp(PLANTED[bug, after], tmp_path, repro_after=after, repro_level=level)
    x = torch.randn(3, 8)
    assert_same(fast(x), model(x))  # the frame fell back to eager: no wrong result
    [failure] = fast.stats.failures
    assert ("PlantedReluError" if bug == "relu" else "AccuracyError") in failure.reason
    repro, full = tmp_path / "repro.py", tmp_path / "repro_full.py"
    lines = code_lines(repro)
    assert len(lines) <= 20, repro.read_text()
    ops = [line for line in lines if line.startswith(("relu", "gelu", "linear", "add", "mul"))]
    assert len(ops) == 1 and ops[0].startswith(bug), repro.read_text()  # one op: the bug
    assert f"after {after}" in repro.read_text()
    assert "softmax" in full.read_text()  # the whole graph
    assert_fails_alone(repro, bug)


def assert_fails_alone(script: Path, bug: str) -> None:
    """The script runs in a fresh interpreter and fails the way the program did."""
    done = run_script(script)
    assert done.returncode != 0, script.read_text()
    assert FAILS_WITH[bug] in done.stderr.strip().splitlines()[-1] or (
        bug == "gelu" and "not within tolerance" in done.stderr
    ), done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("after", ["capture", "aot"])
@pytest.mark.parametrize("bug", ["relu", "gelu"])
def test_whole_graph_script_fails_too(bug: str, after: str, tmp_path: Path) -> None:
    level = 4 if bug == "gelu" else 2
    _, fast = compiled_mlp(PLANTED[bug, after], tmp_path, repro_after=after, repro_level=level)
    fast(torch.randn(3, 8))
    assert_fails_alone(tmp_path / "repro_full.py", bug)


def test_planted_gelu_is_really_wrong(tmp_path: Path) -> None:
    """Without the accuracy check the planted gelu gives a wrong answer: the test above
    checks something real."""
    model, fast = compiled_mlp(planted.gelu_bug, tmp_path)
    x = torch.randn(3, 8)
    with pytest.raises(AssertionError):
        assert_same(fast(x), model(x))
    assert not list(tmp_path.iterdir())


def test_level_1_writes_the_whole_graph_only(tmp_path: Path) -> None:
    model, fast = compiled_mlp(planted.relu_bug, tmp_path, repro_after="capture", repro_level=1)
    x = torch.randn(3, 8)
    assert_same(fast(x), model(x))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repro.py"]
    assert "softmax" in (tmp_path / "repro.py").read_text()  # not minified
    assert "PlantedReluError" in run_script(tmp_path / "repro.py").stderr


def test_level_3_writes_before_compiling(tmp_path: Path) -> None:
    """Level 3 leaves repro_full.py even when the backend succeeds (a crash would leave it)."""
    model, fast = compiled_mlp("eager", tmp_path, repro_after="capture", repro_level=3)
    x = torch.randn(3, 8)
    assert_same(fast(x), model(x))
    assert fast.stats.failures == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repro_full.py"]
    assert run_script(tmp_path / "repro_full.py").returncode == 0  # eager does not fail


def test_environment_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_REPRO_AFTER", "aot")
    monkeypatch.setenv("EMBER_REPRO_LEVEL", "2")
    monkeypatch.setenv("EMBER_REPRO_DIR", str(tmp_path / "env"))
    torch.manual_seed(0)
    model = planted.MLP()
    fast = ember.compiler.compile(model, backend=planted.aot_relu_bug)
    x = torch.randn(3, 8)
    assert_same(fast(x), model(x))
    assert "after aot forward" in (tmp_path / "env" / "repro.py").read_text()


@pytest.mark.parametrize("backend", BACKENDS)
def test_correct_backends_pass_the_accuracy_check(backend: str, tmp_path: Path) -> None:
    """Level 4 on ember's own backends: no false accuracy failure, nothing written, gradients
    as eager's."""
    after = "capture" if backend == "eager" else "aot"
    model, fast = compiled_mlp(backend, tmp_path, repro_after=after, repro_level=4)
    x = torch.randn(3, 8)
    want = model(x)
    got = fast(x)
    assert_same(got, want)
    assert fast.stats.failures == [] and fast.stats.graphs == 1
    got.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want.sum().backward()
    assert_same(grads, [p.grad for p in model.parameters()])
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("bad", [{"repro_level": 7}, {"repro_after": "link"}])
def test_bad_settings_are_errors_at_compile(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        ember.compiler.compile(lambda x: x + 1, backend="eager", options=bad)


def test_bad_environment_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_REPRO_LEVEL", "high")
    with pytest.raises(ValueError, match="EMBER_REPRO_LEVEL='high'"):
        ember.compiler.compile(lambda x: x + 1, backend="eager")


def test_settings_from_env_and_options() -> None:
    s = ReproSettings.from_env({"EMBER_REPLAY_RECORD": "1", "EMBER_REPRO_DIR": "d"})
    assert (s.replay_record, s.directory, s.after) == (True, "d", None)
    s, rest = s.with_options({"repro_after": "aot", "graph_cache": False})
    assert s.after == "aot" and rest == {"graph_cache": False}


def test_ddmin_finds_a_one_minimal_set() -> None:
    calls = []

    def test(items: list[str]) -> bool:
        calls.append(items)
        return {"b", "g"} <= set(items)

    assert ddmin(list("abcdefghij"), test) == ["b", "g"]
    assert len(calls) < 40


def test_minify_keeps_a_graph_that_does_not_fail() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x.sin() + 1)
    small = minify(gm, [torch.ones(2)], Check("raises", RuntimeError), lambda g, i: g)
    assert not small.fails and small.tests == 1
    assert [n.op for n in small.gm.graph.nodes] == [
        "placeholder",
        "call_method",
        "call_function",
        "output",
    ]


def test_a_failure_at_run_time_writes_a_repro(tmp_path: Path) -> None:
    """A compiled graph that raises when called (not when compiled): the error reaches the
    caller as it would without the minifier, and the repro is written from that call."""
    _, fast = compiled_mlp(planted.late_relu_bug, tmp_path, repro_after="capture")
    with pytest.raises(planted.PlantedReluError):
        fast(torch.randn(3, 8))
    text = (tmp_path / "repro.py").read_text()
    assert "at run time, minified from 11 to 1 operations" in text
    assert len(code_lines(tmp_path / "repro.py")) <= 20
    assert "PlantedReluError" in run_script(tmp_path / "repro.py").stderr


@pytest.mark.slow
def test_inductor_after_aot_script_names_compile_graph(tmp_path: Path) -> None:
    """Level 3 leaves the aten graphs inductor's compile_graph gets as scripts that import
    it; the last one written runs standalone and does not fail."""
    model, fast = compiled_mlp("inductor", tmp_path, repro_after="aot", repro_level=3)
    x = torch.randn(3, 8)
    assert_same(fast(x), model(x))
    text = (tmp_path / "repro_full.py").read_text()
    assert "from ember.inductor.compile import compile_graph" in text
    done = run_script(tmp_path / "repro_full.py")
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_saved_values_when_random_ones_do_not_fail(tmp_path: Path) -> None:
    """The minified graph's input is x * 1000 (x = 200): random values (about 1) do not
    fail, so the script loads the values saved next to it."""
    fast = ember.compiler.compile(
        planted.scaled_up,
        backend=planted.big_value_bug,
        options={"repro_after": "capture", "repro_dir": str(tmp_path)},
    )
    with pytest.raises(OverflowError):
        fast(torch.full((4,), 200.0))
    text = (tmp_path / "repro.py").read_text()
    assert "repro_inputs.pt" in text and (tmp_path / "repro_inputs.pt").exists()
    assert len(code_lines(tmp_path / "repro.py")) <= 20
    assert "OverflowError" in run_script(tmp_path / "repro.py").stderr


def test_backward_graph_after_aot(tmp_path: Path) -> None:
    """The backward compiler gets fake inputs: the repro's are random with their metadata."""
    model, fast = compiled_mlp(planted.aot_backward_bug, tmp_path, repro_after="aot")
    x = torch.randn(3, 8)
    assert_same(fast(x), model(x))
    text = (tmp_path / "repro.py").read_text()
    assert "after aot backward, minified from" in text and "to 1 operations" in text
    assert "threshold_backward.default(" in text
    assert len(code_lines(tmp_path / "repro.py")) <= 20
