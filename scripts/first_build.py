"""The first `cargo run --release -- demo` a new user meets: from an empty target dir
(crates already downloaded) until the demo prints its first line, and the size of the
binary it built. Writes docs/results/first_build.jsonl (or $SHAREFLOW_RESULTS_DIR), which
scripts/bench-summary turns into rows of the generated tables (README.md,
docs/performance.md).

    scripts/first-build              # one cold build (about 10 minutes on 2 cores)
    scripts/first-build --runs 5     # five, each from an empty target dir

Each run builds into a fresh directory under target/first-build/ and deletes it
afterwards; the demo runs in there too. The figure includes the demo producing its
input (about a second) before its first line. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


# A build and demo that take longer than this are stopped, and the run fails.
LIMIT_SECONDS = 3600


def one_run(root: Path, scratch: Path) -> dict:
    target = scratch / "target"
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    started = time.monotonic()
    demo = subprocess.Popen(
        ["cargo", "run", "--release", "--locked", "--quiet", "--", "demo", "--dir", str(scratch / "demo")],
        # One stream: the demo's first line is a progress line on stderr (`--quiet`
        # keeps cargo's own lines out).
        # A session of its own, so the watchdog stops cargo, rustc and the demo at once.
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    assert demo.stdout is not None
    # readline() waits for the first line; the timer ends a build or demo that hangs.
    watchdog = threading.Timer(LIMIT_SECONDS, lambda: os.killpg(demo.pid, signal.SIGKILL))
    watchdog.start()
    try:
        first = demo.stdout.readline()
        first_line = time.monotonic() - started
        rest = demo.stdout.read()
        demo.wait()
    finally:
        watchdog.cancel()
    what = "`cargo run --release -- demo`"
    if demo.returncode != 0:
        raise SystemExit(f"first-build: {what} failed (exit {demo.returncode}; killed after {LIMIT_SECONDS} s "
                         f"if negative); its output:\n{first}{rest[-3000:]}")
    if not first:
        raise SystemExit(f"first-build: {what} printed nothing; run it by hand to see why")
    if first.startswith(("warning", "error")):
        # Then the line timed is the compiler's, not the demo's.
        raise SystemExit(f"first-build: the build printed before the demo did: {first.strip()!r}; fix the "
                         f"warning (cargo clippy is clean on a clean tree) and run again")
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
    try:
        subprocess.run(["cargo", "fetch", "--locked"], cwd=root, check=True)
    except FileNotFoundError:
        raise SystemExit("first-build: no `cargo` on PATH; install Rust (rustup) first") from None
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"first-build: `cargo fetch --locked` failed (exit {e.returncode}); the crates must be "
                         f"downloadable once, then the runs work offline") from None
    out_dir = Path(os.environ.get("SHAREFLOW_RESULTS_DIR", root / "docs" / "results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"kind": "run", "bench": "first_build", "args": {"runs": args.runs}, "started_unix_s": int(time.time()),
             "cores": os.cpu_count(), "profile": "release"}]
    for i in range(args.runs):
        # On the project's disk, not /tmp, which may be memory.
        (root / "target" / "first-build").mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="run-", dir=root / "target" / "first-build"))
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
