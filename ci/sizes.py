"""Print ember's code sizes against the marks in STYLE.md (rule 13).

    python ci/sizes.py            # the table and the largest offenders
    python ci/sizes.py --check    # also exit 1 if a hard limit is passed

Marks: <= 800 lines per file, <= 60 per function, <= 25 methods per class,
<= 15k lines per package. Past a mark a file is listed; it fails --check only
past the hard limits (1.5x the marks), which say "split along a seam now".
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKS = {"file": 800, "function": 60, "methods": 25, "package": 15_000}
HARD = 1.5


def measure(path: Path) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """Lines of the file, (function, lines) and (class, methods) pairs."""
    text = path.read_text()
    tree = ast.parse(text)
    functions, classes = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions.append((node.name, (node.end_lineno or node.lineno) - node.lineno + 1))
        elif isinstance(node, ast.ClassDef):
            n = sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) for b in node.body)
            classes.append((node.name, n))
    return len(text.splitlines()), functions, classes


def main() -> int:
    over: list[str] = []
    hard: list[str] = []
    print(f"{'package':<14}{'files':>6}{'lines':>8}  largest file")
    for pkg in sorted(ROOT.glob("packages/*")):
        files = sorted(pkg.glob("src/**/*.py")) + sorted(pkg.glob("src/**/*.c"))
        total, largest = 0, (0, "")
        for f in files:
            rel = str(f.relative_to(ROOT))
            if f.suffix == ".c":
                lines, functions, classes = len(f.read_text().splitlines()), [], []
            else:
                lines, functions, classes = measure(f)
            total += lines
            largest = max(largest, (lines, f.name))
            checks = [("file", rel, lines)]
            checks += [("function", f"{rel}:{n}", k) for n, k in functions]
            checks += [("methods", f"{rel}:{n}", k) for n, k in classes]
            for kind, where, value in checks:
                if value > MARKS[kind]:
                    over.append(f"  {kind:<9}{value:>6}  {where}")
                    if value > HARD * MARKS[kind]:
                        hard.append(where)
        if total > MARKS["package"]:
            over.append(f"  package  {total:>6}  {pkg.name}")
        print(f"{pkg.name:<14}{len(files):>6}{total:>8}  {largest[1]} ({largest[0]})")
    print("past a mark:" if over else "nothing past a mark")
    print("\n".join(over))
    if "--check" in sys.argv and hard:
        print(f"past the hard limit (x{HARD}): {hard}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
