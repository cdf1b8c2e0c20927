"""Check that .ci/run runs exactly the README's test command and that the README opens with two.

python ci/check_readme.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
readme = ROOT.joinpath("README.md").read_text().splitlines()
commands = [line.strip() for line in readme[1:4] if line.startswith("    ")]
if len(commands) != 2 or not commands[0].endswith("-s demo"):
    sys.exit(f"README must open with the demo command and the test command, found {commands}")
run = [
    line.strip()
    for line in ROOT.joinpath(".ci", "run").read_text().splitlines()
    if line.strip()
    and not line.startswith("#")
    and line.strip() not in ("set -euo pipefail",)
    and not line.startswith("cd ")
]
if run != [commands[1]]:
    sys.exit(f".ci/run runs {run}, the README's test command is {commands[1]!r}")
print("README and .ci/run agree:", commands[1])
