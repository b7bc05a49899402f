"""What the dashboard costs a running job: the demo's crash-free rate with its endpoint
polled as the dashboard page polls it (the page and its six /api/ endpoints, once a
second), against the same demo not polled, side by side. Runs
`BINARY demo --records N --crashes 0 --json --metrics-addr 127.0.0.1:0` 2 x ROUNDS
times, the two kinds alternating which goes first, and prints each round's rates, the
medians and the polled / plain ratio. Standard library only.

    scripts/dashboard-cost --binary target/release/shareflow --records 10000000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

PATHS = ["/", "/api/job", "/api/checkpoints", "/api/partitions", "/api/transactions", "/api/instances",
         "/api/dead-letters"]
LIMIT_SECONDS = 600


def poll(addr: str, stop: threading.Event, counts: list[int]) -> None:
    """GETs every path once a second until `stop`; counts the answers."""
    while not stop.wait(1.0):
        for path in PATHS:
            try:
                with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as r:
                    r.read()
                    counts[0] += 1
            except OSError:
                pass  # before the job's routes exist, or after it ended


def run(binary: str, records: int, polled: bool) -> tuple[float, int]:
    with tempfile.TemporaryDirectory(prefix="shareflow-dashboard-cost-") as work:
        command = [binary, "demo", "--records", str(records), "--crashes", "0", "--json", "--metrics-addr",
                   "127.0.0.1:0", "--dir", f"{work}/demo"]
        proc = subprocess.Popen(command, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stop, counts, poller = threading.Event(), [0], None
        deadline = time.monotonic() + LIMIT_SECONDS
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("metrics on http://"):
                addr = line.strip().removeprefix("metrics on http://").removesuffix("/metrics")
                if polled:
                    poller = threading.Thread(target=poll, args=(addr, stop, counts), daemon=True)
                    poller.start()
                break
            if time.monotonic() > deadline:
                proc.kill()
                sys.exit("the demo printed no address")
        threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
        out, _ = proc.communicate(timeout=LIMIT_SECONDS)
        stop.set()
        if proc.returncode != 0:
            sys.exit(f"{' '.join(command)} exited with {proc.returncode}")
        summary = json.loads(out.strip().splitlines()[-1])
        if summary["duplicates"] or summary["lost"]:
            sys.exit(f"the demo reports duplicates or losses: {summary}")
        return float(summary["records_per_second"]), counts[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default="target/release/shareflow")
    p.add_argument("--records", type=int, default=10_000_000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    plain, polled = [], []
    for r in range(a.rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        for kind in order:
            rate, answers = run(a.binary, a.records, kind)
            (polled if kind else plain).append(rate)
            print(f"round {r + 1}: {'polled' if kind else 'plain '} {rate:12,.0f} records/s"
                  + (f" ({answers} answers)" if kind else ""), flush=True)
    mp, mq = statistics.median(plain), statistics.median(polled)
    print(f"median plain  {mp:12,.0f} records/s")
    print(f"median polled {mq:12,.0f} records/s")
    print(f"polled / plain {mq / mp:.3f} (target >= 0.98)")


if __name__ == "__main__":
    main()
