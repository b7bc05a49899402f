"""The first `cargo run --release -- demo` a new user meets: from an empty target dir
(crates already downloaded) until the demo prints its first line, and the size of the
binary it built. Writes docs/results/first_build.jsonl (or $SHAREFLOW_RESULTS_DIR), which
scripts/bench-summary turns into the README's rows.

    scripts/first-build              # one cold build (about 9 minutes on 2 cores)
    scripts/first-build --runs 5     # five, each from an empty target dir

Each run builds into a fresh temporary target dir and deletes it afterwards; the demo
runs in a temporary directory too. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(root: Path, scratch: Path) -> dict:
    target = scratch / "target"
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    started = time.monotonic()
    demo = subprocess.Popen(
        ["cargo", "run", "--release", "--locked", "--quiet", "--", "demo", "--dir", str(scratch / "demo")],
        # One stream: the demo's first line is a progress line on stderr (`--quiet`
        # keeps cargo's own lines out).
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert demo.stdout is not None
    first = demo.stdout.readline()
    first_line = time.monotonic() - started
    rest, _ = demo.communicate(timeout=600)
    if demo.returncode != 0 or not first:
        raise SystemExit(f"first-build: `cargo run --release -- demo` failed (exit {demo.returncode}):\n"
                         f"{first}{rest[-3000:]}")
    binary = target / "release" / "shareflow"
    return {"kind": "first_run", "seconds_to_first_line": round(first_line, 1), "first_line": first.strip(),
            "binary_bytes": binary.stat().st_size}


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1, help="cold builds, each from an empty target dir (default 1)")
    args = p.parse_args()
    if args.runs < 1:
        p.error(f"--runs {args.runs}: must be at least 1")
    # Crates downloaded first, so a run times the build, not the network.
    subprocess.run(["cargo", "fetch", "--locked"], cwd=root, check=True)
    out_dir = Path(os.environ.get("SHAREFLOW_RESULTS_DIR", root / "docs" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"kind": "run", "bench": "first_build", "args": {"runs": args.runs}, "started_unix_s": int(time.time()),
             "cores": os.cpu_count(), "profile": "release"}]
    for i in range(args.runs):
        scratch = Path(tempfile.mkdtemp(prefix="shareflow-first-build-"))
        try:
            row = one_run(root, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        row["round"] = i
        print(f"run {i}: first line after {row['seconds_to_first_line']} s, binary {row['binary_bytes']:,} bytes",
              flush=True)
        rows.append(row)
    # Written at the end only: an interrupted run leaves the last complete file.
    path = out_dir / "first_build.jsonl"
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
