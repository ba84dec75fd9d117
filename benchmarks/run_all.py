"""Run every benchmark script (make bench); pass --quick through."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    extra = sys.argv[1:]
    failed = []
    for script in sorted(HERE.glob("*.py")):
        if script.name in ("run_all.py", "benchlib.py") or script.name.startswith("_"):
            continue
        print(f"\n### {script.name}", flush=True)
        rc = subprocess.call([sys.executable, str(script), *extra], cwd=HERE.parent)
        if rc:
            failed.append(script.name)
    if failed:
        print(f"failed: {failed}")
        sys.exit(1)
