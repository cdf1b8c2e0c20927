"""Developer and CI sessions for ember.

    python3 -m nox -s tests          # every package editable in one environment, full pytest run
    python3 -m nox -s isolation      # each package installed alone (with its declared deps only),
                                     # in turn in one environment (compiler-api: a few files)
    python3 -m nox -s typecheck      # mypy --strict over every package
    python3 -m nox -s lint           # ruff check + ruff format --check, C warnings as errors
    python3 -m nox -s demo           # compile the model zoo, print what was captured and speed
    python3 -m nox -s bench          # the benchmarks under benchmarks/ (not part of CI)

Every session installs under ``ci/constraints.txt`` (torch 2.13.0, CPU build)
and reuses its environment: the install step is skipped when nothing that
affects it (pyproject files, setup.py, C sources, constraints) has changed,
so repeated runs take seconds. ``--reinstall`` forces a fresh install.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = ROOT / "ci" / "constraints.txt"
PACKAGES = ["guards", "capture", "aotgraph", "inductor", "compiler-api"]
TEST_TOOLS = ["pytest", "pytest-xdist", "hypothesis", "expecttest", "setuptools"]
# Tests run on two worker processes, a test file to each (CI has 2 cores; a file's tests
# stay together, in order, in one process).
WORKERS = ["-n", "2", "--dist", "loadfile"]
# compiler-api depends on every other package, so its environment alone proves little
# that the `tests` session has not: installed alone, it runs its import check and these
# files (its doctests, the public API, the report page that reads package data); the
# `tests` session runs all of them.
COMPILER_API_ALONE = ["test_docs.py", "test_compile_api.py", "test_report.py"]
# Real models for tests, benchmarks and the demo (tiny random-init configs, no weights):
# test dependencies only, pinned in ci/constraints.txt; no ember package requires them.
REAL_MODEL_DEPS = ["transformers", "einops", "diffusers"]
# The optional Triton printer's tests run under Triton's interpreter in the `tests`
# session; ember.inductor installed alone (isolation) has no triton, and works without it.
TRITON = ["triton"]

nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "typecheck", "tests", "isolation"]


def _distribution(folder: str) -> str:
    data = tomllib.loads((ROOT / "packages" / folder / "pyproject.toml").read_text())
    name: str = data["project"]["name"]
    return name


def _module(folder: str) -> str:
    return "ember.compiler" if folder == "compiler-api" else f"ember.{folder}"


def _ember_requirements(folder: str) -> list[str]:
    """The package folders ``folder`` needs, itself last, read from the pyproject files."""
    by_name = {_distribution(f): f for f in PACKAGES}
    order: list[str] = []

    def visit(f: str) -> None:
        data = tomllib.loads((ROOT / "packages" / f / "pyproject.toml").read_text())
        for dep in data["project"]["dependencies"]:
            name = dep.split("=")[0].split("<")[0].split(">")[0].strip()
            if name in by_name and by_name[name] not in order:
                visit(by_name[name])
        if f not in order:
            order.append(f)

    visit(folder)
    return order


def _install_stamp(args: list[str]) -> str:
    """A hash of everything that decides what an install step produces."""
    h = hashlib.sha256(json.dumps(args).encode())
    inputs = [CONSTRAINTS]
    for folder in PACKAGES:
        pkg = ROOT / "packages" / folder
        inputs += [pkg / "pyproject.toml", pkg / "setup.py"]
        inputs += sorted(pkg.glob("src/**/*.c")) + sorted(pkg.glob("src/**/*.h"))
        inputs += sorted(pkg.glob("src/**/*.cpp"))
    for path in inputs:
        if path.exists():
            h.update(path.read_bytes())
    return h.hexdigest()


def _install(session: nox.Session, *args: str, torch: bool = True) -> None:
    """``pip install -c constraints *args``, skipped when the environment already has it.

    ``torch=False`` (lint) leaves torch out: installing it is most of a session's set-up.
    """
    stamp_file = Path(str(session.virtualenv.location)) / ".ember-install-stamp"
    stamp = _install_stamp(list(args))
    if "--reinstall" not in session.posargs and stamp_file.exists():
        if stamp_file.read_text() == stamp:
            session.log("install step unchanged since last run: skipped")
            return
    if torch:
        session.install("-c", str(CONSTRAINTS), "setuptools", "torch", "numpy")
        session.install("-c", str(CONSTRAINTS), "--no-build-isolation", *args)
    else:
        session.install("-c", str(CONSTRAINTS), *args)
    stamp_file.write_text(stamp)


def _pytest_args(session: nox.Session, paths: list[str]) -> list[str]:
    extra = [a for a in session.posargs if a != "--reinstall" and a not in PACKAGES]
    return ["-m", "pytest", *WORKERS, *paths, *extra]


def _browser(session: nox.Session) -> None:
    """On CI, install the headless Chromium that compiler-api's report test drives (Debian's
    package, as root); there a missing browser fails that test, elsewhere it skips."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes") or shutil.which("chromium"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        session.warn("CI without chromium, and not root on Debian: the browser test will fail")
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-qq", external=True, env=env)
    session.run("apt-get", "install", "-y", "-qq", "chromium", external=True, env=env)


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """Every package installed editable in one environment; the full test suite."""
    editable = [arg for folder in PACKAGES for arg in ("-e", f"packages/{folder}")]
    _install(session, *TEST_TOOLS, *REAL_MODEL_DEPS, *TRITON, *editable)
    _browser(session)
    session.run("python", *_pytest_args(session, ["packages"]), env={"EMBER_CHECK": "1"})


@nox.session(python="3.11")
def isolation(session: nox.Session) -> None:
    """Each package installed alone, with only its declared dependencies; its own tests.

    The packages take turns in one environment: torch and the test tools are installed
    once (most of a fresh environment's set-up), and before each package every ember
    distribution is uninstalled, so only the package and the ember packages it declares
    are there. ``nox -s isolation -- capture`` runs one package.
    """
    _install(session, *TEST_TOOLS)
    chosen = [a for a in session.posargs if a in PACKAGES] or PACKAGES
    everything = [_distribution(f) for f in PACKAGES]
    for package in chosen:
        session.run("python", "-m", "pip", "uninstall", "-q", "-y", *everything, silent=True)
        needed = [f"packages/{f}" for f in _ember_requirements(package)]
        session.install("-c", str(CONSTRAINTS), "--no-build-isolation", *needed)
        if package == "compiler-api":
            _browser(session)
        allowed = [_module(f) for f in _ember_requirements(package)]
        session.run("python", "ci/imports_alone.py", *allowed)
        paths = [f"packages/{package}"]
        if package == "compiler-api":
            paths = [f"packages/compiler-api/tests/{name}" for name in COMPILER_API_ALONE]
        session.run("python", *_pytest_args(session, paths))


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every package's source (settings in pyproject.toml)."""
    editable = [arg for folder in PACKAGES for arg in ("-e", f"packages/{folder}")]
    _install(session, "mypy", "setuptools", *editable)
    session.run("mypy", *[arg for f in PACKAGES for arg in ("-p", _module(f))])


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff (lint + format check) over Python; the C sources compiled with warnings as errors."""
    _install(session, "ruff", torch=False)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("python", "ci/check_readme.py")
    session.run("python", "ci/sizes.py", "--check")
    include = session.run(
        "python", "-c", "import sysconfig; print(sysconfig.get_paths()['include'])", silent=True
    )
    assert isinstance(include, str)
    for source in sorted(ROOT.glob("packages/*/src/**/*.c")):
        session.run(
            "cc",
            "-fsyntax-only",
            "-Wall",
            "-Wextra",
            "-Wno-unused-parameter",
            "-Werror",
            f"-I{include.strip()}",
            str(source),
            external=True,
        )


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """Compile the model zoo and print graphs, ops, guards, compile time and speed vs eager."""
    editable = [arg for folder in PACKAGES for arg in ("-e", f"packages/{folder}")]
    _install(session, *REAL_MODEL_DEPS, *editable)
    session.run("python", "benchmarks/demo.py", *session.posargs, env=_BENCH_ENV)


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """The benchmark suite, benchmarks/run.py: a markdown table and JSON in bench-results/.

    Arguments after ``--`` go to run.py: ``nox -s bench -- --quick``, ``-- --compare old.json``.
    """
    editable = [arg for folder in PACKAGES for arg in ("-e", f"packages/{folder}")]
    _install(session, *REAL_MODEL_DEPS, *editable)
    args = [a for a in session.posargs if a != "--reinstall"]
    session.run("python", "benchmarks/run.py", *args, env=_BENCH_ENV)


# glibc returns large blocks to the OS on every free unless told otherwise, which makes
# eager timings vary up to 3x between processes; every timed run gets the same settings.
_BENCH_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
