"""The benchmark report: results as markdown tables, and the change between two runs.

``benchmarks/run.py`` writes its results as JSON (``{"meta": ..., "results":
[row, ...]}``, one row per workload and configuration) and renders them here.

>>> row = {"workload": "mlp-infer", "config": "eager", "status": "ok", "median_ms": 2.0,
...        "ratio": 1.0, "mode": "infer"}
>>> print(markdown({"meta": {"configs": ["eager"]}, "results": [row]}).splitlines()[0])
# ember benchmarks
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["compare", "geomean", "markdown"]

Row = dict[str, Any]


def number(value: float | None, digits: int = 2) -> str:
    """``value`` to ``digits`` significant-looking places, ``-`` when there is none."""
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if abs(value) < 1000 else f"{value:.0f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def spread(row: Row) -> str:
    """In-process spread / spread between processes; ``!`` marks a timing still noisy."""
    text = f"{percent(row.get('spread'))} / {percent(row.get('proc_spread'))}"
    return text + (" !" if row.get("noisy") else "")


def error(value: float | None) -> str:
    """The largest difference from eager: ``0`` when bit-identical."""
    return "-" if value is None else ("0" if value == 0 else f"{value:.1e}")


def compile_s(key: str) -> Callable[[Row], str]:
    return lambda row: "-" if row["config"] == "eager" else number(row.get(key))


def status(row: Row) -> str:
    return row["status"] if row["status"] == "ok" else f"**{row['status'].upper()}**"


# The detailed table: header -> how a row shows in it.
COLUMNS: list[tuple[str, Callable[[Row], str]]] = [
    ("workload", lambda r: r["workload"]),
    ("config", lambda r: r["config"]),
    ("status", status),
    ("max err", lambda r: error(r.get("max_error"))),
    ("cold s", compile_s("cold_s")),
    ("warm s", compile_s("warm_s")),
    ("import s", compile_s("import_s")),
    ("median ms", lambda r: number(r.get("median_ms"), 3)),
    ("x eager", lambda r: number(r.get("ratio"))),
    ("spread", spread),
    ("overhead µs", lambda r: number(r.get("overhead_us"), 1)),
    ("graphs", lambda r: number(r.get("graphs"), 0)),
    ("breaks", lambda r: number(r.get("breaks"), 0)),
    ("peak MiB", lambda r: number(r.get("peak_mib"), 1)),
]


def table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A markdown table; the first ``left`` columns left-aligned, the rest right-aligned."""
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---" if i < left else "---:" for i in range(len(header))) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def geomean(values: list[float]) -> float | None:
    """The geometric mean, ``None`` for no values.

    >>> geomean([1.0, 4.0])
    2.0
    """
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def cell(row: Row | None) -> str:
    """A summary cell: the ratio to eager, or what went wrong."""
    if row is None:
        return "n/a"
    ratio = number(row.get("ratio")) + "x"
    return ratio if row["status"] == "ok" else f"**{row['status'].upper()}** {ratio}"


def summary_columns(configs: list[str]) -> list[str]:
    """Every compiled configuration, each ember backend followed by its peer (or a gap)."""
    columns = []
    for config in configs:
        kind, _, backend = config.partition(":")
        if kind == "ember":
            columns += [config, f"torch:{backend}"]
        elif kind != "eager" and config not in columns:
            columns.append(config)
    return columns


def summary(results: dict[str, Any]) -> str:
    """Workloads down, configurations across: eager's time and each one's ratio to it."""
    rows: list[Row] = results["results"]
    columns = summary_columns(results["meta"]["configs"])
    by_key = {(r["workload"], r["config"]): r for r in rows}
    body = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        eager = by_key.get((workload, "eager"))
        cells = [cell(by_key.get((workload, c))) for c in columns]
        body.append([workload, number(eager.get("median_ms") if eager else None, 3), *cells])
    means = []
    for c in columns:
        ratios = [r["ratio"] for r in rows if r["config"] == c and r["status"] == "ok"]
        means.append(number(geomean([x for x in ratios if x])) + "x" if ratios else "n/a")
    body.append(["**geomean**", "", *means])
    return table(["workload", "eager ms", *columns], body)


def header(meta: dict[str, Any]) -> str:
    """One paragraph: date, versions, machine, settings."""
    if "date" not in meta:
        return ""
    ember = ", ".join(f"{k.removeprefix('ember-')} {v}" for k, v in meta["ember"].items())
    env = " ".join(f"{k}={v}" for k, v in meta["env"].items())
    return (
        f"{meta['date']}: torch {meta['torch']}, Python {meta['python']}, ember ({ember}), "
        f"git {meta['git']}. {meta['machine']['cpu']}, {meta['machine']['cores']} cores, "
        f"{meta['machine']['os']}. `torch.set_num_threads({meta['threads']})` in every "
        f"process, {env}. {'Quick (smoke) run. ' if meta['quick'] else ''}"
        f"The run took {meta['wall_s']:.0f} s; load average at its end "
        f"{' '.join(meta['loadavg'])}. {noise(meta.get('noise'))}\n\n"
    )


def noise(summary: dict[str, Any] | None) -> str:
    """One sentence on how noisy the run was (min/median/max over the rows)."""
    if not summary:
        return ""
    stats = summary["min/median/max"]
    pct = {k: [percent(v) for v in stats[k]] if stats[k] else ["-"] * 3 for k in stats}
    load, cal = stats["load"] or [0.0] * 3, stats["calibration_ms"] or [0.0] * 3
    return (
        f"{summary['processes']} processes; spread of the timings within a process: median "
        f"{pct['spread'][1]}, max {pct['spread'][2]}; between processes: median "
        f"{pct['proc_spread'][1]}, max {pct['proc_spread'][2]}; other processes kept "
        f"{load[1]:.1f} cores busy (median; max {load[2]:.1f}); calibration loop "
        f"{cal[0]:.2f}-{cal[2]:.2f} ms; {summary['noisy rows']} rows still noisy (marked !)."
    )


def notes(rows: list[Row], skipped: dict[str, str]) -> str:
    """Errors, graph-break reasons and noise, one bullet per row that has any; skipped workloads."""
    lines = [f"- {name}: skipped: {why}" for name, why in skipped.items()]
    for r in rows:
        said = ([r["error"]] if r.get("error") else []) + list(r.get("notes") or [])
        if said:
            lines.append(f"- {r['workload']}, {r['config']}: " + "; ".join(said))
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """The whole report: header, the summary of ratios, every measurement, notes."""
    rows: list[Row] = results["results"]
    detail = table([h for h, _ in COLUMNS], [[show(r) for _, show in COLUMNS] for r in rows], 3)
    parts = ["# ember benchmarks\n", header(results["meta"]), "## Steady state against eager\n"]
    parts += [summary(results), "\n\n## Every measurement\n", detail, "\n"]
    said = notes(rows, results["meta"].get("skipped") or {})
    return "\n".join(parts) + (f"\nNotes:\n\n{said}\n" if said else "")


def change(old: float | None, new: float | None, digits: int = 2) -> str:
    """``old → new (+x%)``."""
    if old is None or new is None:
        return f"{number(old, digits)} → {number(new, digits)}"
    delta = f" ({(new / old - 1) * 100:+.0f}%)" if old else ""
    return f"{number(old, digits)} → {number(new, digits)}{delta}"


def compare(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The change from ``old`` to ``new`` for every workload and configuration in either."""
    before = {(r["workload"], r["config"]): r for r in old["results"]}
    after = {(r["workload"], r["config"]): r for r in new["results"]}
    body = []
    for key in dict.fromkeys([*after, *before]):
        o, n = before.get(key, {}), after.get(key, {})
        body.append([
            *key,
            f"{o.get('status', 'absent')} → {n.get('status', 'absent')}",
            change(o.get("ratio"), n.get("ratio")),
            change(o.get("median_ms"), n.get("median_ms"), 3),
            change(o.get("cold_s"), n.get("cold_s")),
            change(o.get("peak_mib"), n.get("peak_mib"), 1),
        ])  # fmt: skip
    head = ["workload", "config", "status", "x eager", "median ms", "cold s", "peak MiB"]
    dates = f"{old['meta'].get('date', '?')} → {new['meta'].get('date', '?')}"
    return f"## Change ({dates})\n\n" + table(head, body, 3) + "\n"
