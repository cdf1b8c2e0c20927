"""Two worker processes on the loopback address, for the torch.distributed tests (gloo).

Each worker is a script run as ``python worker.py ARG... OUT`` with ``RANK``, ``MASTER_ADDR``
and ``MASTER_PORT`` set; it writes its result as JSON to ``OUT``. Both must exit with 0.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_two(tmp_path: Path, source: str, *args: str, **extra_env: str) -> list[dict[str, Any]]:
    """Run ``source`` as ranks 0 and 1 (300 s at most) and return their JSON results."""
    script = tmp_path / "worker.py"
    script.write_text(source)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env["EMBER_CACHE_DIR"] = str(tmp_path / "cache")
    env.update(extra_env)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *args, str(tmp_path / f"rank{r}.json")],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
