"""Every ```python block of the docs runs: README.md, docs/*.md and each package's README.md.

Each block runs on its own, in a fresh namespace, as a user would paste it. A
block that is not meant to run alone says why in an HTML comment on the line
right before its fence::

    <!-- not-run: needs a GPU -->
    ```python
    ...

Use that sparingly: a block a user can paste should run. Shell commands go in
indented or ``sh`` blocks, which are not Python and not run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ember.compiler

ROOT = Path(__file__).resolve().parents[3]
DOCS = [
    ROOT / "README.md",
    *sorted(ROOT.glob("docs/*.md")),
    *sorted(ROOT.glob("packages/*/README.md")),
]
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>.*?)\s*-->")
FENCE = re.compile(r"^```python\s*\n(?P<code>.*?)^```\s*$", re.DOTALL | re.MULTILINE)


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, code, reason it is not run or None)`` for each ```python block of a file."""
    text = path.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.fullmatch(before.strip())
        blocks.append((line, match.group("code"), marker.group("reason") if marker else None))
    return blocks


EXAMPLES = [(path, *block) for path in DOCS for block in python_blocks(path)]


def test_the_docs_have_examples_to_run():
    runnable = [e for e in EXAMPLES if e[3] is None]
    assert any(path.name == "README.md" and path.parent == ROOT for path, *_ in runnable)
    for path, line, _, reason in EXAMPLES:
        assert reason != "", f"{path}:{line}: a not-run marker must give its reason"


@pytest.mark.parametrize(
    "path, line, code, reason",
    EXAMPLES,
    ids=[f"{p.relative_to(ROOT)}:{line}" for p, line, *_ in EXAMPLES],
)
def test_doc_example_runs(path: Path, line: int, code: str, reason: str | None) -> None:
    if reason is not None:
        pytest.skip(f"not-run: {reason}")
    # line + 1: the code starts on the line after the fence, so tracebacks name the doc's line
    program = compile("\n" * line + code, f"{path.relative_to(ROOT)}", "exec")
    try:
        exec(program, {"__name__": "__main__"})
    finally:
        ember.compiler.reset()


def test_blocks_are_found_with_their_line_and_marker(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# t\n\n```python\nx = 1\n```\n\n<!-- not-run: needs a GPU -->\n```python\ny = 2\n```\n"
        "\n```sh\nls\n```\n"
    )
    assert python_blocks(doc) == [(3, "x = 1\n", None), (8, "y = 2\n", "needs a GPU")]
