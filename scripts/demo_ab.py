"""The demo's crash-free rate of two builds, side by side: runs
`BINARY demo --records N --crashes 0 --json` for each, ROUNDS times, the two alternating
which goes first, and writes docs/results/<name>.jsonl (a "run" line, then one "demo"
line per run). Prints each build's median and the new / old ratio of each round.
Standard library only.

    scripts/demo-ab --old /tmp/shareflow-776343d --new target/release/shareflow \
        --old-label "776343d (records in memory)" --new-label "$(git rev-parse --short HEAD)"

A run that fails, prints no summary, or reports a duplicate or a loss stops the script
with a message naming the build and round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# One demo of a million records takes about a second; one that takes this long is stuck.
LIMIT_SECONDS = 600


class AbError(Exception):
    """A run that did not give a rate; the message names the build, the round and why."""


def run_demo(binary: str, records: int, label: str, round_: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="shareflow-demo-ab-") as work:
        command = [binary, "demo", "--records", str(records), "--crashes", "0", "--json"]
        try:
            done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=LIMIT_SECONDS)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise AbError(f"build {label!r}, round {round_}: {' '.join(command)} did not run to the end: {e}")
    if done.returncode != 0:
        raise AbError(f"build {label!r}, round {round_}: {' '.join(command)} exited with {done.returncode}:\n"
                      f"{done.stderr[-2000:]}")
    summary = None
    for line in done.stdout.splitlines():
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(parsed, dict) and "records_per_second" in parsed:
            summary = parsed
    if summary is None:
        raise AbError(f"build {label!r}, round {round_}: the demo printed no JSON summary; its output:\n"
                      f"{done.stdout[-2000:]}")
    violations = int(summary.get("duplicates", 0)) + int(summary.get("lost", 0))
    if violations:
        raise AbError(f"build {label!r}, round {round_}: the demo reports {violations} duplicated or lost "
                      f"records: {json.dumps(summary)}")
    return {"records_per_second": float(summary["records_per_second"]),
            "seconds": float(summary.get("seconds", 0.0)), "violations": violations}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the build to compare against (a shareflow binary)")
    parser.add_argument("--new", required=True, help="the build under test (a shareflow binary)")
    parser.add_argument("--old-label", default="old")
    parser.add_argument("--new-label", default="new")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--name", default="log_store_demo_ab", help="docs/results/<name>.jsonl")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.records < 1:
        print("demo-ab: --rounds and --records must be at least 1", file=sys.stderr)
        return 2
    for binary in (args.old, args.new):
        if not Path(binary).is_file():
            print(f"demo-ab: {binary} is not a file; build it first (cargo build --release)", file=sys.stderr)
            return 2
    out = Path(__file__).resolve().parent.parent / "docs" / "results" / f"{args.name}.jsonl"
    lines = [{"kind": "run", "bench": args.name,
              "args": {"records": args.records, "crashes": 0, "old": args.old_label, "new": args.new_label,
                       "command": "shareflow demo --records N --crashes 0 --json, release builds, "
                                  "alternating per round (scripts/demo-ab)"},
              "started_unix_s": int(time.time()), "profile": "release"}]
    rates: dict[str, list[float]] = {"old": [], "new": []}
    try:
        for round_ in range(1, args.rounds + 1):
            order = ["new", "old"] if round_ % 2 else ["old", "new"]
            for build in order:
                binary, label = (args.new, args.new_label) if build == "new" else (args.old, args.old_label)
                row = run_demo(binary, args.records, label, round_)
                rates[build].append(row["records_per_second"])
                lines.append({"kind": "demo", "build": build, "round": round_, **row})
            ratio = rates["new"][-1] / rates["old"][-1]
            print(f"round {round_}: new {rates['new'][-1]:,.0f}, old {rates['old'][-1]:,.0f} records/s "
                  f"({ratio:.2f} x)", flush=True)
    except AbError as e:
        print(f"demo-ab: {e}", file=sys.stderr)
        return 1
    ratios = [n / o for n, o in zip(rates["new"], rates["old"])]
    print(f"median: new {statistics.median(rates['new']):,.0f}, old {statistics.median(rates['old']):,.0f} "
          f"records/s; new / old per round {min(ratios):.2f}-{max(ratios):.2f}, median {statistics.median(ratios):.2f}")
    out.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
