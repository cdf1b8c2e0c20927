"""Check that an ember package imports with only its declared ember dependencies.

    python ci/imports_alone.py ember.guards ember.capture   # the last one is imported

Run by ``nox -s isolation`` inside an environment that holds just those
packages; fails if importing the last module pulls in any other ``ember.*``.
"""

import importlib
import sys

allowed = sys.argv[1:]
module = importlib.import_module(allowed[-1])
loaded = {name.split(".")[1] for name in sys.modules if name.startswith("ember.")}
extra = sorted(loaded - {name.split(".")[1] for name in allowed})
if extra:
    sys.exit(f"{allowed[-1]} imported ember packages it does not declare: {extra}")
print(f"{allowed[-1]} {module.__version__} imports alone (allowed: {', '.join(allowed)})")
