"""ember.compiler.report(): the HTML page of a run, on every backend, and in a real browser."""

from __future__ import annotations

import fcntl
import gc
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import weakref

import pytest
import torch

import ember.compiler
from ember.compiler import reporting
from ember.compiler.report_html import plot
from ember.compiler.testing import assert_same

BACKENDS = ["eager", "aot_eager", "inductor"]
SECTIONS = ("summary", "plot", "phases", "cache", "frames")


@pytest.fixture(autouse=True)
def fresh():
    ember.compiler.reset()
    ember.compiler.count_calls(True)
    yield
    ember.compiler.count_calls(False)
    ember.compiler.reset()


def shaped(x, y):
    a = x.sin() * 2  # <a & b> MARK-op
    if a.sum() > 0:  # MARK-break
        a = a + 1
    return a * y


def _line_of(marker: str) -> int:
    with open(__file__) as fh:
        return next(i for i, line in enumerate(fh, 1) if line.rstrip().endswith(marker))


def _options(backend: str) -> dict[str, object] | None:
    # inductor: generate the kernels even when an earlier run cached this graph on disk
    return {"graph_cache": False} if backend == "inductor" else None


def _run_shaped(backend: str) -> ember.compiler.CompiledFunction:
    """Two calls on one shape, one on another: 2 frames (the break's resume), 2 graphs each."""
    cf = ember.compiler.compile(shaped, backend=backend, options=_options(backend))
    for n in (3, 3, 4):
        args = (torch.ones(n), torch.full((n,), 2.0))
        assert_same(cf(*args), shaped(*args))
    return cf


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_page_shows_every_section_with_the_run_s_frames(backend, tmp_path):
    cf = _run_shaped(backend)
    page = ember.compiler.report(tmp_path / "run.html").read_text()
    for section in SECTIONS:
        assert f'<section id="{section}">' in page
    assert page.count('<section class="frame"') == 2  # shaped and its resume function
    assert "shaped (test_report.py:" in page and "shaped.&lt;resume at" in page
    assert "data-dependent jump" in page and "hint: keep the value a tensor" in page
    assert page.count("<rect") == 2  # one bar per frame
    assert cf.stats.graphs == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_source_and_code_are_escaped(backend, tmp_path):
    _run_shaped(backend)
    page = ember.compiler.report(tmp_path / "run.html").read_text()
    assert "# &lt;a &amp; b&gt; MARK-op" in page and "<a & b>" not in page
    assert "if a.sum() &gt; 0:" in page
    assert page.count("<script>") == 1  # only the page's own
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.parametrize("backend", BACKENDS)
def test_captured_break_and_guard_lines_are_marked(backend, tmp_path):
    _run_shaped(backend)
    page = ember.compiler.report(tmp_path / "run.html").read_text()
    op_line, break_line = _line_of("MARK-op"), _line_of("MARK-break")
    marked = dict(re.findall(r'<tr class="([a-z ]+)"><td class="ln">(\d+)</td>', page)[::-1])
    marks = {int(line): kinds.split() for kinds, line in marked.items()}
    assert {"op", "guard"} <= set(marks[op_line])
    assert {"break", "op"} <= set(marks[break_line])  # a.sum() > 0 is captured; the jump breaks


@pytest.mark.parametrize("backend", BACKENDS)
def test_recompilations_name_the_failed_guard_and_its_line(backend, tmp_path):
    _run_shaped(backend)
    page = ember.compiler.report(tmp_path / "run.html").read_text()
    assert "x: size[0] expected 3, got 4" in page
    assert f"guard set at {__file__}:{_line_of('MARK-op')}: <code>a = x.sin() * 2" in page
    summary = re.search(r'data-key="recompilations">(\d+)<', page)
    assert summary is not None and summary[1] == "2"  # one per frame


@pytest.mark.parametrize("backend", BACKENDS)
def test_phase_numbers_are_compile_times(backend, tmp_path):
    _run_shaped(backend)
    page = ember.compiler.report(tmp_path / "run.html").read_text()
    times = ember.compiler.compile_times()
    rows = re.findall(r'data-phase="([^"]+)" data-calls="(\d+)" data-total="([^"]+)"', page)
    assert {name for name, _, _ in rows} == set(times)
    for name, calls, total in rows:
        assert (int(calls), float(total)) == times[name][:2]
    assert times["capture"][0] >= 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_hits_count_the_calls_each_graph_served(backend, tmp_path):
    _run_shaped(backend)
    page = ember.compiler.report(tmp_path / "run.html").read_text()
    calls = [int(n) for n in re.findall(r'<td class="n calls">(\d+)</td>', page)]
    hits = [int(n) for n in re.findall(r'<td class="n hits">(\d+)</td>', page)]
    assert sorted(calls) == [1, 1, 2, 2]  # per frame: 2 calls of size 3, 1 of size 4
    assert sorted(hits) == [0, 0, 1, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_generated_code_per_graph(backend, tmp_path):
    _run_shaped(backend)
    page = ember.compiler.report(tmp_path / "run.html").read_text()
    assert page.count("captured graph (FX, Python)") == 4
    assert "sin = x.sin()" in page
    aten = page.count("graph (aten)")
    assert aten == (0 if backend == "eager" else 4)
    if backend != "eager":
        assert "torch.ops.aten.sin.default" in page
    if backend == "inductor":
        assert page.count(": C++ kernels</summary>") == 4
        assert "extern &quot;C&quot; void kernel0(" in page
        assert ": Python wrapper</summary>" in page


def test_calls_not_counted_says_so(tmp_path):
    ember.compiler.count_calls(False)
    _run_shaped("eager")
    page = ember.compiler.report(tmp_path / "run.html").read_text()
    assert page.count('<td class="n calls">not counted</td>') == 4


def test_report_into_a_folder_and_nothing_compiled(tmp_path):
    page = ember.compiler.report(tmp_path)
    assert page.parent == tmp_path and page.name == f"ember-report-{os.getpid()}.html"
    text = page.read_text()
    assert "No frame was compiled." in text and '<section id="phases">' in text


def test_dropped_callables_stay_up_to_a_bound_and_reset_forgets(tmp_path, monkeypatch):
    _run_shaped("eager")  # dropped at once: still reported
    assert "shaped (test_report.py" in ember.compiler.report(tmp_path / "a.html").read_text()
    monkeypatch.setattr(reporting, "KEEP_DROPPED", 1)
    ember.compiler.compile(lambda x: x + 1, backend="eager")(torch.ones(1))  # the latest kept
    gc.collect()
    assert "shaped (test_report.py" not in ember.compiler.report(tmp_path / "b.html").read_text()
    kept = _run_shaped("eager")
    ember.compiler.reset()
    assert "shaped (test_report.py" not in ember.compiler.report(tmp_path / "c.html").read_text()
    assert kept is not None


def _closure_over(t):
    def add_t(x):
        return x + t

    return add_t


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dropped_program_s_tensors_are_freed_and_still_reported(backend, tmp_path):
    t = torch.randn(3)
    held = weakref.ref(t)
    fn = _closure_over(t)
    compiled = ember.compiler.compile(fn, backend=backend, options=_options(backend))
    x = torch.randn(3)
    assert_same(compiled(x), fn(x))
    assert_same(compiled(x), fn(x))
    del t, fn, compiled
    gc.collect()
    assert held() is None  # the report keeps text and counts, not the compiled program
    page = ember.compiler.report(tmp_path / "run.html").read_text()
    assert "_closure_over.&lt;locals&gt;.add_t (test_report.py:" in page
    assert re.findall(r'<td class="n calls">(\d+)</td>', page) == ["2"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dropped_module_s_parameters_are_freed_and_still_reported(backend, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    held = weakref.ref(model[0].weight)
    opt = ember.compiler.compile(model, backend=backend, options=_options(backend))
    x = torch.randn(2, 4, requires_grad=True)
    assert_same(opt(x), model(x))
    opt(x).sum().backward()
    del model, opt
    gc.collect()
    assert held() is None
    page = ember.compiler.report(tmp_path / "run.html").read_text()
    assert "compiled via Sequential" in page and "Sequential.forward (" in page


def test_plot_escapes_labels_and_scales_bars():
    svg = plot([("f <a & b>", 2.0), ("g", 1.0)], width=480)
    assert "f &lt;a &amp; b&gt;" in svg and "<a & b>" not in svg
    widths = [float(w) for w in re.findall(r'<rect x="\d+" y="\d+" width="([\d.]+)"', svg)]
    assert widths[0] == pytest.approx(2 * widths[1])


_SCRIPT = """
import torch, ember.compiler
def double(x):
    return x * 2 + 1
cf = ember.compiler.compile(double, backend="eager")
for _ in range(3):
    cf(torch.ones(2))
"""


def test_ember_report_env_writes_the_page_at_exit(tmp_path):
    env = {**os.environ, "EMBER_REPORT": str(tmp_path / "reports")}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pages = list((tmp_path / "reports").glob("ember-report-*.html"))
    assert len(pages) == 1
    assert f"ember: compile report written to {pages[0]}" in done.stderr
    page = pages[0].read_text()
    assert "double (&lt;string&gt;:3)" in page
    assert re.findall(r'<td class="n calls">(\d+)</td>', page) == ["3"]  # counted under the env


# ----------------------------------------------------------------------------- in a browser


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("chromium is missing on CI (noxfile's tests session installs it)")
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    return found


class DevTools:
    """A Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (fds 3 and 4,
    messages separated by NUL): no websocket library needed."""

    def __init__(self, chromium: str, profile: str) -> None:
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()

        def child() -> None:  # the browser reads commands on fd 3, writes answers on fd 4
            # first above 4, so that neither lands on the other's target (pipe() may give
            # 3 or 4); dup2 onto another number also makes the copy survive exec
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_r, from_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        args = ["--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
                "--remote-debugging-pipe", "--no-first-run", f"--user-data-dir={profile}",
                "about:blank"]  # fmt: skip
        self.proc = subprocess.Popen(
            [chromium, *args], preexec_fn=child, close_fds=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_r)
        os.close(from_w)
        self.buffer, self.events, self.serial = b"", [], 0

    def send(self, method: str, session: str | None = None, **params: object) -> dict:
        self.serial += 1
        message = {"id": self.serial, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self.to_w, json.dumps(message).encode() + b"\0")
        reply = self.wait(lambda m: m.get("id") == self.serial)
        assert "error" not in reply, reply
        return reply.get("result", {})

    def wait(self, match, timeout: float = 30.0) -> dict:
        """The next message ``match`` accepts; events read meanwhile are kept."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "method" in message:
                    self.events.append(message)
                if match(message):
                    return message
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.from_r], [], [], max(left, 0))
            assert ready, "chromium did not answer in time"
            chunk = os.read(self.from_r, 1 << 16)
            assert chunk, "chromium closed the pipe"
            self.buffer += chunk

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except AssertionError:
            pass
        finally:
            self.proc.wait(timeout=30)
            os.close(self.to_w)
            os.close(self.from_r)


_ERRORS = {  # event -> whether it is an error the page made
    "Runtime.exceptionThrown": lambda p: True,
    "Runtime.consoleAPICalled": lambda p: p["type"] in ("error", "assert"),
    "Log.entryAdded": lambda p: p["entry"]["level"] == "error",
}

_PROBE = """JSON.stringify({
  sections: Array.from(document.querySelectorAll("section[id]"), s => s.id),
  headings: Array.from(document.querySelectorAll("h2"), h => h.innerText),
  frames: document.querySelectorAll("section.frame").length,
  bars: document.querySelectorAll("#plot svg rect").length,
  visible: document.querySelector("#phases table").getBoundingClientRect().height > 0,
  before: document.querySelectorAll("details.code[open]").length,
  after: (document.getElementById("toggle").click(),
          document.querySelectorAll("details.code[open]").length),
  all: document.querySelectorAll("details.code").length,
})"""


@pytest.mark.slow
def test_the_page_loads_in_chromium_with_no_console_error(tmp_path):
    chromium = _chromium()
    _run_shaped("inductor")
    page = ember.compiler.report(tmp_path / "run.html")
    with tempfile.TemporaryDirectory() as profile:
        tools = DevTools(chromium, profile)
        try:
            target = tools.send("Target.createTarget", url="about:blank")["targetId"]
            session = tools.send("Target.attachToTarget", targetId=target, flatten=True)
            sid = session["sessionId"]
            for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
                tools.send(domain, sid)
            tools.send("Page.navigate", sid, url=page.as_uri())
            tools.wait(lambda m: m.get("method") == "Page.loadEventFired")
            probe = tools.send("Runtime.evaluate", sid, expression=_PROBE, returnByValue=True)
        finally:
            tools.close()
    errors = [e for e in tools.events if _ERRORS.get(e["method"], lambda p: False)(e["params"])]
    assert errors == []
    seen = json.loads(probe["result"]["value"])
    assert seen["sections"][: len(SECTIONS)] == list(SECTIONS)
    assert seen["headings"] == ["Summary", "Compile time per frame", "Time per phase",
                                "Cache hits", "Frames"]  # fmt: skip
    assert seen["frames"] == 2 and seen["bars"] == 2 and seen["visible"]
    assert (seen["before"], seen["after"]) == (0, seen["all"]) and seen["all"] > 0
