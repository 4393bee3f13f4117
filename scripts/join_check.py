"""The JSON lines a measuring script printed, joined into the GPU run's check.json.

Usage: python scripts/join_check.py CHECK.json OUTPUT.txt [SUFFIX]

Every line of OUTPUT.txt that is a JSON object joins CHECK.json (made if absent); ":exact" in
its keys is read as SUFFIX (default ":exact"), so that exact mode measured another way (patch
0006's attention kernel: ":exact+fattn_rows") sits beside the plain one. gpu_check.py prints a
line per model, so a run cut short by its timeout keeps the models it finished; a line cut
short in the middle is left out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def measured_lines(output: str) -> list[dict]:
    """The output's whole JSON objects, in order."""
    found = []
    for line in output.splitlines():
        if not line.startswith("{"):
            continue
        try:
            found.append(json.loads(line))
        except ValueError:  # cut short
            continue
    return found


def join(check: dict, output: str, suffix: str = ":exact") -> dict:
    for found in measured_lines(output):
        for key, value in found.items():
            check[key.replace(":exact", suffix)] = value
    return check


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print("usage: python scripts/join_check.py CHECK.json OUTPUT.txt [SUFFIX]", file=sys.stderr)
        return 2
    check_path, output_path = Path(sys.argv[1]), Path(sys.argv[2])
    check = json.loads(check_path.read_text() or "{}") if check_path.exists() else {}
    output = output_path.read_text(errors="replace") if output_path.exists() else ""
    suffix = sys.argv[3] if len(sys.argv) == 4 else ":exact"
    check_path.write_text(json.dumps(join(check, output, suffix)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
