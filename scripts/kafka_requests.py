"""The Kafka broker's requests by API during each run of one `kafka_bench` round.

Opens JMX on the running test broker (`jcmd ... ManagementAgent.start`, on 127.0.0.1
only, without authentication; it stays open until the broker stops), runs
`kafka_bench RECORDS 1` with its results in a temporary directory, samples the broker's
`kafka.network:type=RequestMetrics,name=RequestsPerSec` counters every 250 ms with
Kafka's own `JmxTool` from the end of the bench's warm-up (the broker creates a counter
at the first request of an API version, and `JmxTool` reads the counters' names once,
when it starts), and prints for each measured run of the round how many requests of
each API the broker handled between the run's start and end, as the bench recorded
them: the span it measures CPU over, which for some runs includes making their share
group ready. The sampling JVM competes for the cores, so the rates the bench prints beside are
not figures to keep. With `--consumer` it runs the bench's consumer mode instead
(`kafka_bench RECORDS 1 2 consumer`): our consumer at each setting and Kafka's tool at
each `max.poll.records`, on 1 and 4 partitions. Standard library only.

    scripts/kafka start && eval "$(scripts/kafka env)"
    cargo build --release --features kafka --example kafka_bench
    scripts/kafka-requests [RECORDS] [--consumer] [--binary PATH]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

# A bench round that runs longer than this is stopped, and the script fails.
LIMIT_SECONDS = 1800
JMX_PORT = int(os.environ.get("SHAREFLOW_KAFKA_JMX_PORT", "19999"))
OBJECT = "kafka.network:type=RequestMetrics,name=RequestsPerSec,request=*,version=*"
WARMED_UP = "(warm-up done"


def fail(message: str) -> None:
    print(f"kafka-requests: {message}", file=sys.stderr)
    sys.exit(1)


def broker_pid() -> int:
    pidfile = os.environ.get("SHAREFLOW_KAFKA_PIDFILE")
    if not pidfile or not os.path.exists(pidfile):
        fail('no running test broker: run `scripts/kafka start && eval "$(scripts/kafka env)"` first')
    with open(pidfile) as f:
        return int(f.read().strip())


def kafka_lib() -> str:
    home = os.environ.get("SHAREFLOW_HOME", os.path.expanduser("~/.cache/shareflow"))
    version = os.environ.get("SHAREFLOW_KAFKA_VERSION", "4.4.0")
    lib = os.path.join(home, f"kafka-{version}", "lib")
    if not os.path.isdir(lib):
        fail(f"Kafka's jars are not in {lib}: run `scripts/kafka install`")
    return lib


def open_jmx(pid: int) -> None:
    """Starts the broker's JMX agent on 127.0.0.1:JMX_PORT; a second start is refused
    by the JVM when the agent runs already, which is fine."""
    out = subprocess.run(
        ["jcmd", str(pid), "ManagementAgent.start", f"jmxremote.port={JMX_PORT}", f"jmxremote.rmi.port={JMX_PORT}",
         "jmxremote.host=127.0.0.1", "jmxremote.authenticate=false", "jmxremote.ssl=false"],
        capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0 and "already" not in (out.stdout + out.stderr):
        fail(f"jcmd could not open JMX on the broker (pid {pid}): {out.stdout.strip()} {out.stderr.strip()}")


def windows(results: str) -> list[tuple[str, int, int]]:
    """(run, start ms, end ms) of each measured run, from the bench's results rows."""
    runs = []
    with open(results) as f:
        for line in f:
            row = json.loads(line)
            if row.get("kind") == "pipeline" and "started_unix_ms" in row:
                runs.append((row["variant"], int(row["started_unix_ms"]), int(row["ended_unix_ms"])))
            elif row.get("kind") == "consumer" and "setting" in row and "started_unix_ms" in row:
                where = f"{row['partitions']} partition(s)"
                runs.append((f"shareflow, {where}, {row['setting']}",
                             int(row["started_unix_ms"]), int(row["ended_unix_ms"])))
                java = (f"kafka-share-consumer-perf-test, {where}, max.poll.records={row['java_max_poll_records']}",
                        int(row["java_started_unix_ms"]), int(row["java_ended_unix_ms"]))
                if java not in runs:
                    runs.append(java)
    if not runs:
        fail(f"{results} has no run with its start and end times; rebuild kafka_bench "
             "(cargo build --release --features kafka --example kafka_bench)")
    return runs


class Samples:
    """The counters JmxTool wrote, read once: a time (ms) and a row of counts per sample,
    and the API of each column (None for columns that are not requests of their own)."""

    def __init__(self, path: str) -> None:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        if len(rows) < 3:
            fail(f"JmxTool wrote {len(rows)} lines to {path}; is JMX reachable on 127.0.0.1:{JMX_PORT}?")
        header = rows[0]
        if not any("request=ShareFetch," in h for h in header):
            fail("the broker had served no ShareFetch when sampling began; run the script again (the bench's "
                 "warm-up creates the counters)")
        self.data = [r for r in rows[1:] if len(r) == len(header) and r[0].isdigit()]
        if not self.data:
            fail(f"JmxTool wrote no samples to {path}")
        self.times = [int(r[0]) for r in self.data]
        apis = [(m.group(1) if (m := re.search(r"request=([^,]+)", h)) else None) for h in header]
        # FetchConsumer and FetchFollower count Fetch requests again, by who sent them.
        self.apis = [None if api in ("FetchConsumer", "FetchFollower") else api for api in apis]

    def between(self, start: int, end: int) -> collections.Counter:
        """Requests by API from the last sample at or before `start` to the first at or
        after `end`."""
        if start < self.times[0] or end > self.times[-1]:
            fail(f"a run ({start}-{end} ms) lies outside the samples ({self.times[0]}-{self.times[-1]} ms); "
                 "JmxTool stopped early or started late")
        before = self.data[max(bisect.bisect_right(self.times, start) - 1, 0)]
        after = self.data[min(bisect.bisect_left(self.times, end), len(self.data) - 1)]
        out: collections.Counter = collections.Counter()
        for i, api in enumerate(self.apis):
            if api is None:
                continue
            try:
                out[api] += int(float(after[i]) - float(before[i]))
            except ValueError:
                continue
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", nargs="?", type=int, default=1_000_000)
    parser.add_argument("--consumer", action="store_true",
                        help="count the runs of the bench's consumer mode (our consumer against Kafka's tool)")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/shareflow-target"))
    parser.add_argument("--binary", default=os.path.join(target, "release", "examples", "kafka_bench"))
    args = parser.parse_args()
    if not os.access(args.binary, os.X_OK):
        fail(f"{args.binary} is not built: cargo build --release --features kafka --example kafka_bench")
    open_jmx(broker_pid())
    with tempfile.TemporaryDirectory(prefix="kafka-requests-") as tmp:
        samples = os.path.join(tmp, "requests.csv")
        jmx_err = os.path.join(tmp, "jmx.err")
        env = dict(os.environ, SHAREFLOW_RESULTS_DIR=tmp)
        mode = ["2", "consumer"] if args.consumer else []
        bench = subprocess.Popen([args.binary, str(args.records), "1", *mode], stdout=subprocess.PIPE, text=True,
                                 env=env)
        timer = threading.Timer(LIMIT_SECONDS, bench.kill)
        timer.start()
        jmx = None
        try:
            assert bench.stdout is not None
            for line in bench.stdout:
                print(line, end="", flush=True)
                if jmx is None and line.startswith(WARMED_UP):
                    jmx = start_jmx(samples, jmx_err)
            if bench.wait() != 0:
                fail(f"kafka_bench failed with status {bench.returncode} (killed after {LIMIT_SECONDS} s if negative)")
            if jmx is None:
                fail(f"kafka_bench printed no {WARMED_UP!r} line; is {args.binary} the bench this script knows?")
            time.sleep(0.5)
            if jmx.poll() is not None:
                with open(jmx_err) as f:
                    fail(f"JmxTool stopped early (status {jmx.returncode}): {f.read()[-800:]}")
        finally:
            timer.cancel()
            if jmx is not None and jmx.poll() is None:
                jmx.terminate()
                jmx.wait(timeout=30)
        print(f"\n== broker requests by API during each run ({args.records} records; JMX sampled every 250 ms)")
        counters = Samples(samples)
        results = "kafka_consumer_bench.jsonl" if args.consumer else "kafka_bench.jsonl"
        for name, start, end in windows(os.path.join(tmp, results)):
            c = counters.between(start, end)
            listed = ", ".join(f"{api} {n}" for api, n in c.most_common() if n > 0)
            print(f"{name} ({(end - start) / 1000:.1f} s): {sum(c.values())} requests: {listed}")


def start_jmx(samples: str, errors: str) -> subprocess.Popen:
    with open(samples, "w") as out, open(errors, "w") as err:
        return subprocess.Popen(
            ["java", "-Dlog4j.configuration=file:/dev/null", "-cp", os.path.join(kafka_lib(), "*"),
             "org.apache.kafka.tools.JmxTool", "--jmx-url",
             f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{JMX_PORT}/jmxrmi",
             "--object-name", OBJECT, "--attributes", "Count", "--reporting-interval", "250"],
            stdout=out, stderr=err)


if __name__ == "__main__":
    main()
