"""The demo's rate over time: runs `shareflow demo --json --metrics-addr ...` with the
given demo options, samples the sink's `shareflow_records_in_total` every 100 ms, and
prints, as the run goes, the rate over each half second with the checkpoints completed
by then and how much of the time the transform waited on the sink (backpressure,
summed over its subtasks, so up to 100 % per subtask). The last line is taken from the
demo's own summary. Standard library only.

    scripts/demo-rate -- --records 10000000 --interval 1000
    scripts/demo-rate --binary target/release-debug/shareflow -- --at-least-once

Without --binary it runs `cargo run --release --quiet --`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# A demo that runs longer than this is stopped, and the script fails.
LIMIT_SECONDS = 1800
SINK = 'shareflow_records_in_total{operator="topic-sink"}'
CHECKPOINTS = "shareflow_checkpoints_completed_total"
BACKPRESSURE = 'shareflow_backpressure_ms_total{operator="transform"}'


def value(text: str, name: str) -> float | None:
    m = re.search(r"^" + re.escape(name) + r" ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


class Windows:
    """Prints the rate between samples at least half a second apart."""

    def __init__(self) -> None:
        self.start: tuple[float, float, float, float] | None = None
        self.prev: tuple[float, float, float, float] | None = None
        self.last: tuple[float, float, float, float] | None = None

    def add(self, sample: tuple[float, float, float, float], force: bool = False) -> None:
        if sample[1] <= 0:
            return  # the sink has had nothing yet
        if self.start is None:
            self.start = self.prev = sample
        self.last = sample
        assert self.prev is not None
        dt = sample[0] - self.prev[0]
        if dt >= 0.5 or (force and dt > 0):
            print(f"{sample[0] - self.start[0]:6.1f} s  {(sample[1] - self.prev[1]) / dt / 1e3:7.0f} k records/s  "
                  f"checkpoints {int(sample[2]):4d}  transform waiting on the sink "
                  f"{(sample[3] - self.prev[3]) / dt / 10:4.0f} %", flush=True)
            self.prev = sample


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", help="a built shareflow binary (default: cargo run --release)")
    p.add_argument("--port", type=int, default=19464, help="the metrics port on 127.0.0.1 (default 19464)")
    p.add_argument("demo_args", nargs="*", help="options for shareflow demo (after --)")
    args = p.parse_args()
    command = [args.binary] if args.binary else ["cargo", "run", "--release", "--quiet", "--"]
    command += ["demo", "--json", "--metrics-addr", f"127.0.0.1:{args.port}", *args.demo_args]
    with tempfile.TemporaryFile(mode="w+") as err:
        # A session of its own, so a stop ends cargo and the demo it started at once.
        try:
            demo = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        except OSError as e:
            print(f"demo-rate: cannot start {command[0]!r}: {e.strerror}; build it, or drop --binary", file=sys.stderr)
            return 1
        windows = Windows()
        deadline = time.monotonic() + LIMIT_SECONDS
        try:
            while demo.poll() is None:
                if time.monotonic() > deadline:
                    print(f"demo-rate: the demo ran past {LIMIT_SECONDS} s and was stopped", file=sys.stderr)
                    return 1
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/metrics", timeout=1) as r:
                        text = r.read().decode()
                except (urllib.error.URLError, OSError):
                    # Not serving yet (building, or opening the broker), or just ended.
                    time.sleep(0.1)
                    continue
                sample = (time.monotonic(), value(text, SINK), value(text, CHECKPOINTS), value(text, BACKPRESSURE))
                # The job's series appear once it is built (after the demo produced its input).
                if None not in sample:
                    windows.add(sample)  # type: ignore[arg-type]
                time.sleep(0.1)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
        if windows.last is not None:
            windows.add(windows.last, force=True)  # the last, shorter window
        assert demo.stdout is not None
        lines = demo.stdout.read().strip().splitlines()
        err.seek(0)
        stderr_tail = err.read()[-3000:]
    if demo.returncode != 0 or not lines:
        print(f"demo-rate: `{' '.join(command)}` failed (exit {demo.returncode}); its stderr ends:\n{stderr_tail}",
              file=sys.stderr)
        return 1
    if windows.last is None:
        print(f"demo-rate: no sample of {SINK} before the demo ended (is port {args.port} taken?)", file=sys.stderr)
        return 1
    try:
        summary = json.loads(lines[-1])
    except json.JSONDecodeError:
        print(f"demo-rate: the demo's last line is not its JSON summary: {lines[-1][:200]!r}", file=sys.stderr)
        return 1
    print(json.dumps({k: summary.get(k) for k in ("records_per_second", "processed_per_second", "seconds",
                                                  "processed_seconds", "checkpoints_completed", "violations")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
