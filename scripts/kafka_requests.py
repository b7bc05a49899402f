"""The Kafka broker's requests by API during each run of one `kafka_bench` round.

Opens JMX on the running test broker (`jcmd ... ManagementAgent.start`, local port
only), samples its `kafka.network:type=RequestMetrics,name=RequestsPerSec` counters
every 250 ms with Kafka's own `JmxTool`, runs `kafka_bench RECORDS 1` with its results
in a temporary directory, and prints for each measured run how many requests of each API
the broker handled while it ran. The window of a run is taken from the bench's output:
it ends when the run's line is printed and starts its duration earlier (from its rate),
plus 200 ms. The sampling JVM competes for the cores, so rates printed beside are not
figures to keep. Standard library only.

    scripts/kafka start && eval "$(scripts/kafka env)"
    cargo build --release --features kafka --example kafka_bench
    scripts/kafka-requests [RECORDS] [--binary PATH]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import csv
import os
import re
import subprocess
import sys
import tempfile
import time

# A bench round that runs longer than this is stopped, and the script fails.
LIMIT_SECONDS = 1800
JMX_PORT = int(os.environ.get("SHAREFLOW_KAFKA_JMX_PORT", "19999"))
OBJECT = "kafka.network:type=RequestMetrics,name=RequestsPerSec,request=*,version=*"
RUN_LINE = re.compile(r"^round 0: (?P<name>[^:]+): (?P<rate>\d+) rec/s")


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


def windows(lines: list[tuple[int, str]]) -> list[tuple[str, int, int]]:
    """(run, start ms, end ms) of each measured run in the bench's output."""
    runs = []
    for at, line in lines:
        m = RUN_LINE.match(line)
        if not m or m["name"].startswith(("consumer,", "producer,")):
            continue
        rate = int(m["rate"])
        if rate <= 0:
            continue
        duration_ms = RECORDS * 1000 // rate
        runs.append((m["name"], at - duration_ms - 200, at))
    return runs


def counts(samples_csv: str, start: int, end: int) -> collections.Counter:
    with open(samples_csv, newline="") as f:
        rows = [r for r in csv.reader(f)]
    if len(rows) < 3:
        fail(f"JmxTool wrote {len(rows)} lines to {samples_csv}; is JMX reachable on 127.0.0.1:{JMX_PORT}?")
    header, data = rows[0], [r for r in rows[1:] if len(r) == len(rows[0]) and r[0].isdigit()]
    times = [int(r[0]) for r in data]
    apis = [(m.group(1) if (m := re.search(r"request=([^,]+)", h)) else None) for h in header]
    # FetchConsumer and FetchFollower count Fetch requests again, by who sent them.
    apis = [None if api in ("FetchConsumer", "FetchFollower") else api for api in apis]

    def row_at(t: int) -> list[str]:
        return data[min(bisect.bisect_left(times, t), len(data) - 1)]

    before, after = row_at(start), row_at(end)
    out: collections.Counter = collections.Counter()
    for i, api in enumerate(apis):
        if api is None:
            continue
        try:
            out[api] += int(float(after[i]) - float(before[i]))
        except ValueError:
            continue
    return out


def main() -> None:
    global RECORDS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", nargs="?", type=int, default=1_000_000)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/shareflow-target"))
    parser.add_argument("--binary", default=os.path.join(target, "release", "examples", "kafka_bench"))
    args = parser.parse_args()
    RECORDS = args.records
    if not os.access(args.binary, os.X_OK):
        fail(f"{args.binary} is not built: cargo build --release --features kafka --example kafka_bench")
    open_jmx(broker_pid())
    with tempfile.TemporaryDirectory(prefix="kafka-requests-") as tmp:
        samples = os.path.join(tmp, "requests.csv")
        with open(samples, "w") as out, open(os.path.join(tmp, "jmx.err"), "w") as err:
            jmx = subprocess.Popen(
                ["java", "-Dlog4j.configuration=file:/dev/null", "-cp", os.path.join(kafka_lib(), "*"),
                 "org.apache.kafka.tools.JmxTool", "--jmx-url",
                 f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{JMX_PORT}/jmxrmi",
                 "--object-name", OBJECT, "--attributes", "Count", "--reporting-interval", "250"],
                stdout=out, stderr=err)
        try:
            time.sleep(3)
            env = dict(os.environ, SHAREFLOW_RESULTS_DIR=tmp)
            bench = subprocess.Popen([args.binary, str(RECORDS), "1"], stdout=subprocess.PIPE, text=True, env=env)
            lines = []
            deadline = time.monotonic() + LIMIT_SECONDS
            assert bench.stdout is not None
            for line in bench.stdout:
                lines.append((int(time.time() * 1000), line.rstrip("\n")))
                print(line, end="", flush=True)
                if time.monotonic() > deadline:
                    bench.kill()
                    fail(f"the bench ran longer than {LIMIT_SECONDS} s")
            if bench.wait() != 0:
                fail(f"kafka_bench failed with status {bench.returncode}")
            time.sleep(0.5)
        finally:
            jmx.terminate()
            jmx.wait(timeout=30)
        print(f"\n== broker requests by API during each run ({RECORDS} records; JMX sampled every 250 ms)")
        for name, start, end in windows(lines):
            c = counts(samples, start, end)
            listed = ", ".join(f"{api} {n}" for api, n in c.most_common() if n > 0)
            print(f"{name} ({(end - start) / 1000:.1f} s): {sum(c.values())} requests: {listed}")


RECORDS = 0

if __name__ == "__main__":
    main()
