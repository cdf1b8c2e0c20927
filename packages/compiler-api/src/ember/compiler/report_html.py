"""The HTML of :func:`ember.compiler.report`: read the run's records, write one page.

Everything is inline (CSS, an SVG plot drawn here, a few lines of optional script), and
every piece of text from the program (source, reasons, code) goes through ``escape``.
The page reads without JavaScript: code sits in ``<details>`` blocks.
"""

from __future__ import annotations

import datetime
import inspect
import linecache
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from html import escape
from typing import Any

from ember.capture.frame_compiler import Compiled, Failure
from ember.compiler.phases import _NESTED, compile_times
from ember.compiler.reporting import GraphRecord, Watched, watched
from ember.guards.cache import CodeCache, all_caches
from ember.guards.kinds import KINDS, Guard

_NAME = re.compile(r"^(?P<qual>.*) \((?P<file>.*):(?P<line>\d+)\)$")


@dataclass
class Graph:
    """One captured graph of a frame, with the callable that compiled it."""

    owner: Watched
    compiled: Compiled
    record: GraphRecord | None

    @property
    def seconds(self) -> float:
        """Capture + guards (the stats) + the backend call (the observer)."""
        return self.compiled.seconds + (self.record.backend_seconds if self.record else 0.0)


@dataclass
class Frame:
    """Everything recorded about one code object, across compiled callables."""

    name: str
    graphs: list[Graph] = field(default_factory=list)
    breaks: list[Failure] = field(default_factory=list)
    eager: list[Failure] = field(default_factory=list)
    skipped: int = 0

    @property
    def seconds(self) -> float:
        return sum(g.seconds for g in self.graphs)


def collect() -> list[Frame]:
    """The frames of every registered callable, grouped by code, in first-seen order."""
    frames: dict[str, Frame] = {}

    def frame(name: str) -> Frame:
        return frames.setdefault(name, Frame(name))

    for owner, compiler in watched():
        stats = compiler.stats
        for c in list(stats.compiled):
            frame(c.code).graphs.append(Graph(owner, c, owner.observer.graphs.get(c.graph)))
        for f in list(stats.breaks):
            frame(f.code).breaks.append(f)
        for f in list(stats.failures):
            frame(f.code).eager.append(f)
        for name in list(stats.skipped):
            frame(name).skipped += 1
    return list(frames.values())


# ----------------------------------------------------------------------------- page


def render() -> str:
    """The whole page, as a string."""
    frames = collect()
    caches = {c.name: c for c in all_caches()}
    body = [
        _summary(frames, caches),
        _plot_section(frames),
        _phases(),
        _cache_section(frames, caches),
        '<section id="frames"><h2>Frames</h2>',
        *(_frame(i, f, caches.get(f.name)) for i, f in enumerate(frames, 1)),
        "<p>No frame was compiled.</p>" if not frames else "",
        "</section>",
    ]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    title = f"ember compile report: {' '.join(sys.argv) or 'python'}"
    return _PAGE.format(
        title=escape(title),
        stamp=escape(stamp),
        csp=_CSP,
        css=_CSS,
        script=_SCRIPT,
        body="\n".join(body),
    )


def _summary(frames: list[Frame], caches: dict[str, CodeCache[Any]]) -> str:
    recompiles = sum(len(c.reasons) for f in frames if (c := caches.get(f.name)) is not None)
    rows = [
        ("compiled callables", len(watched())),
        ("frames", len(frames)),
        ("graphs", sum(len(f.graphs) for f in frames)),
        ("graph breaks", sum(len(f.breaks) for f in frames)),
        ("frames run eagerly", sum(len(f.eager) for f in frames)),
        ("recompilations", recompiles),
        ("compile time of the frames (s)", f"{sum(f.seconds for f in frames):.3f}"),
    ]
    cells = "".join(
        f'<tr><th>{escape(k)}</th><td data-key="{escape(k)}">{escape(str(v))}</td></tr>'
        for k, v in rows
    )
    return f'<section id="summary"><h2>Summary</h2><table class="kv">{cells}</table></section>'


def _phases() -> str:
    """compile_times() as a table; each row carries the exact numbers in data attributes."""
    times = compile_times()
    rows = []
    for name in times:
        calls, total, most = times[name]
        nested = _NESTED.get(name, False)
        label = ("&nbsp;&nbsp;" if nested else "") + escape(name)
        rows.append(
            f'<tr data-phase="{escape(name)}" data-calls="{calls}" data-total="{total!r}"'
            f' data-max="{most!r}"><td>{label}</td><td class="n">{calls}</td>'
            f'<td class="n">{total:.3f}</td><td class="n">{most:.3f}</td></tr>'
        )
    note = "<p>Indented phases run inside the backend call and are part of its time.</p>"
    table = (
        "<table><thead><tr><th>phase</th><th>calls</th><th>total (s)</th><th>max (s)</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>{note}"
        if rows
        else "<p>Nothing was compiled since the last reset.</p>"
    )
    return f'<section id="phases"><h2>Time per phase</h2>{table}</section>'


def _plot_section(frames: list[Frame]) -> str:
    return (
        '<section id="plot"><h2>Compile time per frame</h2>'
        f"{plot([(_short(f.name), f.seconds) for f in frames])}</section>"
    )


def plot(bars: list[tuple[str, float]], width: int = 760) -> str:
    """A horizontal bar chart as inline SVG: one labelled bar per (label, seconds).

    >>> svg = plot([("f <line 3>", 0.5), ("g", 0.25)])
    >>> svg.startswith("<svg") and "f &lt;line 3&gt;" in svg and svg.count("<rect") == 2
    True
    """
    if not bars:
        return "<p>No frame was compiled.</p>"
    label_w, bar_h, gap = 280, 18, 6
    scale = (width - label_w - 80) / max(max(s for _, s in bars), 1e-9)
    height = len(bars) * (bar_h + gap) + gap
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="compile time per frame">'
    ]
    for i, (label, seconds) in enumerate(bars):
        y = gap + i * (bar_h + gap)
        w = max(seconds * scale, 1.0)
        text = escape(label if len(label) <= 40 else label[:39] + "…")
        parts.append(
            f"<g><title>{escape(label)}: {seconds:.3f} s</title>"
            f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{text}</text>'
            f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" class="bar"/>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + 13}">{seconds:.3f} s</text></g>'
        )
    return "".join(parts) + "</svg>"


def _cache_section(frames: list[Frame], caches: dict[str, CodeCache[Any]]) -> str:
    rows = []
    for f in frames:
        cache = caches.get(f.name)
        live = len(cache.entries) if cache else 0
        limit = "yes" if cache is not None and cache.eager else "no"
        for n, g in enumerate(f.graphs, 1):
            counter = g.record.calls if g.record else None
            calls = "not counted" if counter is None else str(counter.n)
            hits = "" if counter is None else str(max(counter.n - 1, 0))
            rows.append(
                f'<tr><td>{escape(_short(f.name))}</td><td class="n">{n}</td>'
                f'<td class="n calls">{calls}</td><td class="n hits">{hits}</td>'
                f'<td class="n">{live}</td><td>{limit}</td></tr>'
            )
    head = (
        "<tr><th>frame</th><th>graph</th><th>calls served</th><th>cache hits</th>"
        "<th>live entries</th><th>cache limit reached</th></tr>"
    )
    note = (
        "<p>Calls served: calls that ran the graph (the first one also compiled it; "
        "the rest are cache hits). Counting is on with <code>EMBER_REPORT</code> set or "
        "after <code>ember.compiler.count_calls()</code>.</p>"
    )
    table = f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
    return f'<section id="cache"><h2>Cache hits</h2>{table if rows else ""}{note}</section>'


# ----------------------------------------------------------------------------- a frame


def _frame(index: int, f: Frame, cache: CodeCache[Any] | None) -> str:
    backends = sorted({g.owner.backend for g in f.graphs})
    owners = sorted({g.owner.label for g in f.graphs})
    meta = f"{len(f.graphs)} graph(s), {len(f.breaks)} break(s), {f.seconds:.3f} s"
    if backends:
        meta += f"; backend {', '.join(backends)}; compiled via {', '.join(owners)}"
    parts = [
        f'<section class="frame" id="frame-{index}"><h3>{escape(_short(f.name))}</h3>',
        f'<p class="where">{escape(f.name)}</p><p>{escape(meta)}</p>',
        _source(f),
        _breaks(f),
        _recompiles(f, cache),
        *(_graph(index, n, g) for n, g in enumerate(f.graphs, 1)),
        "</section>",
    ]
    return "\n".join(parts)


def _located(name: str) -> tuple[str, str, int] | None:
    match = _NAME.match(name)
    if match is None:
        return None
    return match["qual"], match["file"], int(match["line"])


def _short(name: str) -> str:
    located = _located(name)
    if located is None:
        return name
    qual, file, line = located
    return f"{qual} ({file.rsplit('/', 1)[-1]}:{line})"


_MARKS = (  # (css class, gutter symbol, meaning), most important first
    ("eager", "E", "ran eagerly from here"),
    ("break", "B", "graph break"),
    ("op", "*", "captured into a graph"),
    ("guard", "g", "a guard reads a value here"),
)


def _source(f: Frame) -> str:
    """The frame's source, each line marked: captured op, break, eager, guard."""
    located = _located(f.name)
    lines = linecache.getlines(located[1]) if located else []
    if located is None or not lines:
        return "<p>(source not available)</p>"
    _, file, first = located
    try:
        block = inspect.getblock(lines[first - 1 :])
    except Exception:  # a tokenizer error on odd source: show a fixed window
        block = lines[first - 1 : first + 40]
    marks = _line_marks(f, file)
    rows = []
    for offset, text in enumerate(block):
        number = first + offset
        kinds = [k for k, _, _ in _MARKS if number in marks.get(k, set())]
        flags = "".join(sym for k, sym, _ in _MARKS if k in kinds) or " "
        cls = f' class="{" ".join(kinds)}"' if kinds else ""
        rows.append(
            f'<tr{cls}><td class="ln">{number}</td><td class="mk">{escape(flags)}</td>'
            f"<td><code>{escape(text.rstrip())}</code></td></tr>"
        )
    legend = ", ".join(f"{sym} {words}" for _, sym, words in _MARKS)
    return (
        f"<details open><summary>Source (marks: {escape(legend)})</summary>"
        f'<table class="src">{"".join(rows)}</table></details>'
    )


def _line_marks(f: Frame, file: str) -> dict[str, set[int]]:
    marks: dict[str, set[int]] = {k: set() for k, _, _ in _MARKS}
    for g in f.graphs:
        for node in g.compiled.graph.graph.nodes:
            where = node.meta.get("ember_line")
            if where and where[0] == file and where[1] is not None:
                marks["op"].add(where[1])
        for guard in g.compiled.guards.guards:
            if guard.where and guard.where.rpartition(":")[0] == file:
                line = guard.where.rpartition(":")[2]
                marks["guard"].update([int(line)] if line.isdigit() else [])
    for kind, failures in (("break", f.breaks), ("eager", f.eager)):
        for fail in failures:
            if fail.where is not None and fail.where.lineno is not None:
                marks[kind].add(fail.where.lineno)
    return marks


def _breaks(f: Frame) -> str:
    # the same break recorded by each compile of the frame is shown once, counted
    items = Counter([("graph break", b) for b in f.breaks] + [("ran eagerly", e) for e in f.eager])
    if not items:
        return ""
    rows = "".join(
        f'<li class="reason"><b>{escape(kind)}</b> [{escape(x.category)}]: {escape(x.reason)}'
        + (f" ({n} compiles)" if n > 1 else "")
        + f"<pre>{escape(x.location)}</pre>"
        + (f'<p class="hint">hint: {escape(x.hint)}</p>' if x.hint else "")
        + "</li>"
        for (kind, x), n in items.items()
    )
    return f'<div class="breaks"><h4>Graph breaks and eager runs</h4><ul>{rows}</ul></div>'


def _recompiles(f: Frame, cache: CodeCache[Any] | None) -> str:
    if cache is None:
        return ""
    guards: dict[str, Guard] = {}  # the first guard on each source: the one a value fails
    for graph in f.graphs:
        for guard in graph.compiled.guards.guards:
            guards.setdefault(str(guard.source), guard)
    rows = []
    for n, reason in enumerate(cache.reasons, 1):  # the failure of each entry it had
        failed = "".join(
            f"<li>{escape(failure)}{_guard_line(guards.get(failure.split(':', 1)[0]))}</li>"
            for failure in dict.fromkeys(reason.failures)
        )
        rows.append(
            f'<li class="recompile">recompile {n}, the entries failed:<ul>{failed}</ul></li>'
        )
    status = f"{len(cache.entries)} live cache entries (limit {cache.limit})" + (
        "; the limit was reached: later misses run eagerly" if cache.eager else ""
    )
    listed = f"<ul>{''.join(rows)}</ul>" if rows else "<p>No recompilations.</p>"
    return f'<div class="recompiles"><h4>Recompilations</h4><p>{escape(status)}</p>{listed}</div>'


def _guard_line(guard: Guard | None) -> str:
    """`` (guard set at file:line: text)`` for a guard that knows where it was set."""
    if guard is None or guard.where is None:
        return ""
    file, _, line = guard.where.rpartition(":")
    text = linecache.getline(file, int(line)).strip() if line.isdigit() else ""
    where = f"guard set at {escape(guard.where)}: <code>{escape(text)}</code>"
    return f' <span class="set-at">({where})</span>'


def _graph(frame: int, n: int, g: Graph) -> str:
    c = g.compiled
    guards = "".join(
        f"<tr><td>{escape(x.kind.name)}</td><td><code>{escape(_describe(x))}</code></td>"
        f"<td>{escape(x.where or '')}</td></tr>"
        for x in c.guards.guards
    )
    blocks = [("captured graph (FX, Python)", c.graph.code)]
    blocks += _generated(g.record)
    blocks.append(("replacement function (runs the graph in place of the bytecode)",
                   c.replacement_source))  # fmt: skip
    code = "".join(
        f'<details class="code"><summary>{escape(title)}</summary><pre>{escape(text)}</pre>'
        "</details>"
        for title, text in blocks
    )
    return (
        f'<div class="graph" id="frame-{frame}-graph-{n}"><h4>Graph {n}: {c.ops} ops, '
        f"{g.seconds:.3f} s</h4>{code}"
        f'<details><summary>{len(c.guards.guards)} guards</summary><table class="guards">'
        f"<tr><th>kind</th><th>check</th><th>set at</th></tr>{guards}</table></details></div>"
    )


def _describe(guard: Guard) -> str:
    try:
        return f"{guard.source}: {KINDS[guard.kind].describe(guard)}"
    except Exception:  # a description is a nicety: never fail the report over one
        return str(guard.source)


def _generated(record: GraphRecord | None) -> list[tuple[str, str]]:
    """What the backend generated: aten graphs, inductor's C++ and wrapper."""
    out: list[tuple[str, str]] = []
    for gen in record.generated if record is not None else ():
        out.append((f"{gen.stage} graph (aten)", gen.code))
        if gen.kernels:
            out.append((f"{gen.stage}: C++ kernels", gen.source or _FROM_CACHE))
        if wrapper := gen.wrapper:
            out.append((f"{gen.stage}: Python wrapper", wrapper))
    return out


_FROM_CACHE = "(from inductor's graph cache: the kernels were not generated again)"


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1100px}
h2{border-bottom:2px solid #888;margin-top:1.6em}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:2px 6px}
td.n{text-align:right}th{text-align:left}table.src td{border:none;padding:0 6px}
table.src td.ln{color:#888}table.src code{white-space:pre}
tr.op{background:#e4f6e4}tr.break{background:#ffe0c0}tr.eager{background:#ffd0d0}
tr.guard td.mk{color:#06c}pre{background:#f6f6f6;padding:6px;overflow-x:auto}
.frame{border:1px solid #bbb;border-radius:4px;padding:0 1em 1em;margin:1em 0}
.where{color:#666;font-size:12px}.hint{color:#064}.bar{fill:#4a7bd0}svg text{font-size:12px}
"""

# Nothing may load from elsewhere: the page is one file, and must stay readable offline.
_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

_SCRIPT = """
document.getElementById("toggle").addEventListener("click", function () {
  var all = document.querySelectorAll("details.code");
  var open = !Array.prototype.every.call(all, function (d) { return d.open; });
  all.forEach(function (d) { d.open = open; });
});
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>{title}</title><style>{css}</style></head>
<body><h1>{title}</h1><p>Written {stamp}.
<button id="toggle" type="button">show/hide all code</button></p>
<nav><a href="#summary">Summary</a> · <a href="#plot">Compile time per frame</a> ·
<a href="#phases">Time per phase</a> · <a href="#cache">Cache hits</a> ·
<a href="#frames">Frames</a></nav>
{body}
<script>{script}</script></body></html>
"""
