"""Replay records (issue 17 §4): a frame that failed to compile is saved and compiled again."""

from __future__ import annotations

import dataclasses
import pickle
import sys
from pathlib import Path

import pytest
import torch

import ember.compiler
from ember.compiler.replay_record import _Pickled
from ember.compiler.testing import assert_same

sys.path.insert(0, str(Path(__file__).parent))
import planted_backends as planted

BACKENDS = ["eager", "aot_eager", "inductor"]


@pytest.fixture(autouse=True)
def fresh() -> None:
    ember.compiler.reset()


def records(folder: Path) -> list[Path]:
    return sorted(folder.glob("replay_*.pkl"))


def test_backend_failure_replays(tmp_path: Path) -> None:
    fast = ember.compiler.compile(
        planted.scaled_relu_block,
        backend=planted.relu_bug,
        options={"replay_record": True, "repro_dir": str(tmp_path)},
    )
    x = torch.randn(5)
    assert_same(fast(x), planted.scaled_relu_block(x))
    [failure] = fast.stats.failures
    [path] = records(tmp_path)
    stats = ember.compiler.replay(path)
    assert [f.reason for f in stats.failures] == [failure.reason]
    assert "PlantedReluError" in failure.reason and stats.compiled == []


def test_record_holds_globals_and_replays_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = ember.compiler.compile(
        planted.scaled_relu_block,
        backend=planted.relu_bug,
        options={"replay_record": True, "repro_dir": str(tmp_path)},
    )
    fast(torch.randn(5))
    [path] = records(tmp_path)
    record = ember.compiler.replay_record.load(path)
    values = record.values()
    assert values["SCALE"] == 3.0 and values["_helper"] is planted._helper
    assert record.inputs == ["Tensor(5,) torch.float32 stride=(1,)"]
    monkeypatch.setattr(planted, "SCALE", 5.0)  # the record keeps the value the frame read
    stats = ember.compiler.replay(path, backend="eager")  # another backend takes the graph
    [compiled] = stats.compiled
    assert "3.0" in compiled.graph.code and "cos" in compiled.graph.code


def test_closure_values_are_recorded(tmp_path: Path) -> None:
    k = torch.tensor(2.0)

    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * k)

    fast = ember.compiler.compile(
        block, backend=planted.relu_bug, options={"replay_record": True, "repro_dir": str(tmp_path)}
    )
    x = torch.randn(4)
    assert_same(fast(x), block(x))
    [path] = records(tmp_path)
    record = pickle.loads(path.read_bytes())
    assert_same(record.closure[0].load(), k)
    stats = ember.compiler.replay(path)
    assert "PlantedReluError" in stats.failures[0].reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_fullgraph_failure_raises_again(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBER_REPLAY_RECORD", "1")
    monkeypatch.setenv("EMBER_REPRO_DIR", str(tmp_path))

    def broken(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        ember.compiler.graph_break()
        return y + 1

    fast = ember.compiler.compile(broken, backend=backend, fullgraph=True)
    with pytest.raises(ember.compiler.FullGraphError) as first:
        fast(torch.randn(3))
    [path] = records(tmp_path)
    with pytest.raises(ember.compiler.FullGraphError) as again:
        ember.compiler.replay(path)
    assert str(again.value) == str(first.value)


def test_no_record_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fast = ember.compiler.compile(planted.scaled_relu_block, backend=planted.relu_bug)
    fast(torch.randn(5))
    assert fast.stats.failures and not list(tmp_path.iterdir())


def test_unpicklable_backend_needs_to_be_passed(tmp_path: Path) -> None:
    def local_backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        raise ValueError("no")

    fast = ember.compiler.compile(
        lambda x: x.cos(),
        backend=local_backend,
        options={"replay_record": True, "repro_dir": str(tmp_path)},
    )
    fast(torch.randn(2))
    [path] = records(tmp_path)
    with pytest.raises(ValueError, match="pass it: replay"):
        ember.compiler.replay(path)
    stats = ember.compiler.replay(path, backend=local_backend)
    assert "ValueError: no" in stats.failures[0].reason


def test_a_backend_that_does_not_load_must_be_passed(tmp_path: Path) -> None:
    """A record made by another process whose backend lived in its ``__main__``."""
    fast = ember.compiler.compile(
        planted.scaled_relu_block,
        backend=planted.relu_bug,
        options={"replay_record": True, "repro_dir": str(tmp_path)},
    )
    fast(torch.randn(5))
    [path] = records(tmp_path)
    record = ember.compiler.replay_record.load(path)
    broken = dataclasses.replace(record, backend=_Pickled(b"not a pickle"))
    path.write_bytes(pickle.dumps(broken))
    with pytest.raises(ValueError, match="pass it"):
        ember.compiler.replay(path)
    assert (
        "PlantedReluError"
        in ember.compiler.replay(path, backend=planted.relu_bug).failures[0].reason
    )
