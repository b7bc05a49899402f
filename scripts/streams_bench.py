"""shareflow's `shareflow run JOB.toml` against Kafka Streams (exactly_once_v2), side by side
on the test broker, as a user runs each: the same input topic, the same commit or
checkpoint interval and parallelism, and one read_committed counter that measures both.

For each interval and round, the two systems run one after the other, the order
alternating by round. Each run gets a fresh output topic, a fresh group and fresh
checkpoints. Before the first round, each system runs once unmeasured (--no-warm-up
skips it): on a freshly started broker, whichever system ran first paid for the broker's
JIT. A run:
  1. starts the counter (benches/streams, `count`) on the empty output topic;
  2. starts the system, and samples the broker's and the job's CPU time (/proc) and the
     broker's request counters (JMX) then;
  3. waits until the counter has every id, samples again, waits the counter's grace
     period (duplicates would show there), and stops the system with SIGTERM (SIGKILL
     after 30 s), by pid;
  4. deletes the output topic and the topics the run created (shareflow's ledger).
Whole-run rate: records / (last record's arrival - the system's start). Middle rate:
80 % of the records / (the 90 % mark - the 10 % mark). CPU is per million records, over
the system's start to the last record.

The results go to docs/results/streams_bench.jsonl (SHAREFLOW_RESULTS_DIR overrides the
directory), replaced when every run of an invocation ended: a header line (kind "run": the arguments, the
git revision, the core count), then one line per system run (kind "system_run");
scripts/bench-summary reads them. Standard library only.

    scripts/streams-bench [--records N] [--rounds R] [--intervals 1000,100] [--binary PATH]

It builds the Java side with mvn and javac (once; offline afterwards), starts the test
broker when none runs (and stops it at the end), and needs a release build of
shareflow: `cargo build --release`.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import kafka_requests  # noqa: E402  (opens JMX on the broker)

SOURCES = os.path.join(ROOT, "benches", "streams")
HOME = os.environ.get("SHAREFLOW_HOME", os.path.expanduser("~/.cache/shareflow"))
BUILD = os.path.join(HOME, "streams-bench")
PORT = int(os.environ.get("SHAREFLOW_KAFKA_PORT", "19092"))
BOOTSTRAP = f"127.0.0.1:{PORT}"
PIDFILE = os.path.join(HOME, "run", "kafka.pid")
# A run that takes longer than this fails the bench.
RUN_LIMIT_SECONDS = 900
GRACE_MS = 2000
TICKS = os.sysconf("SC_CLK_TCK")


def fail(message: str) -> None:
    print(f"streams-bench: {message}", file=sys.stderr)
    sys.exit(1)


def log(message: str) -> None:
    print(f"[streams-bench] {message}", file=sys.stderr, flush=True)


def need(tool: str, what: str) -> None:
    if shutil.which(tool) is None:
        fail(f"`{tool}` is not on PATH: install {what} (Debian: apt-get install {what})")


def build_java() -> str:
    """Copies the reference's dependencies with mvn and compiles it with javac, once per
    change of its sources; returns the class path."""
    need("java", "openjdk-17-jdk-headless")
    need("javac", "openjdk-17-jdk-headless")
    need("mvn", "maven")
    digest = hashlib.sha256()
    for folder, _, files in sorted(os.walk(SOURCES)):
        for name in sorted(files):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    stamp = os.path.join(BUILD, "stamp")
    classpath = os.path.join(BUILD, "classes") + os.pathsep + os.path.join(BUILD, "lib", "*") + os.pathsep + \
        os.path.join(BUILD, "log4j")
    if os.path.exists(stamp) and open(stamp).read() == digest.hexdigest():
        return classpath
    log("building the Kafka Streams reference and the counter (mvn, javac)")
    shutil.rmtree(BUILD, ignore_errors=True)
    os.makedirs(os.path.join(BUILD, "log4j"))
    subprocess.run(["mvn", "-q", "-B", "-Dstyle.color=never", "dependency:copy-dependencies",
                    "-DincludeScope=runtime", f"-DoutputDirectory={os.path.join(BUILD, 'lib')}"],
                   cwd=SOURCES, check=True)
    sources = [os.path.join(d, n) for d, _, fs in os.walk(os.path.join(SOURCES, "src")) for n in fs
               if n.endswith(".java")]
    subprocess.run(["javac", "-Xlint:all", "-Werror", "-d", os.path.join(BUILD, "classes"), "-cp",
                    os.path.join(BUILD, "lib", "*"), *sources], check=True)
    with open(os.path.join(BUILD, "log4j", "log4j.properties"), "w") as f:
        f.write("log4j.rootLogger=WARN, stderr\n"
                "log4j.appender.stderr=org.apache.log4j.ConsoleAppender\n"
                "log4j.appender.stderr.Target=System.err\n"
                "log4j.appender.stderr.layout=org.apache.log4j.PatternLayout\n"
                "log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n\n")
    with open(stamp, "w") as f:
        f.write(digest.hexdigest())
    return classpath


def cpu_seconds(pid: int) -> float:
    """User plus system CPU of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def broker_running() -> int | None:
    try:
        pid = int(open(PIDFILE).read().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def kafka_tool(*args: str) -> str:
    lib = os.path.join(kafka_requests.kafka_lib(), "*")
    out = subprocess.run(["java", "-Xmx256m", "-cp", lib, *args], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        fail(f"{args[0]} {' '.join(args[1:])} failed: {out.stderr.strip()[-600:]}")
    return out.stdout


def topics(*args: str) -> str:
    return kafka_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", BOOTSTRAP, *args)


def create_topic(name: str, partitions: int) -> None:
    topics("--create", "--topic", name, "--partitions", str(partitions), "--replication-factor", "1")


def delete_topics_with_prefix(prefix: str) -> None:
    names = [t for t in topics("--list").split() if t.startswith(prefix)]
    for name in names:
        topics("--delete", "--topic", name)


def git_rev() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def requests_between(before: dict, after: dict) -> dict:
    out = {}
    for api, (n, ms) in after.items():
        n0, ms0 = before.get(api, [0, 0.0])
        if n - n0 > 0:
            out[api] = [int(n - n0), round(ms - ms0, 1)]
    return out


class Run:
    """One system's run: the counter, the system's process, the samples."""

    def __init__(self, args: argparse.Namespace, classpath: str, system: str, interval: int, round_: int,
                 stamp: str, work: str) -> None:
        self.args, self.classpath, self.system, self.interval, self.round = args, classpath, system, interval, round_
        self.name = f"sb-{stamp}-{system}-{interval}-{round_}"
        self.output = f"{self.name}-out"
        self.work = os.path.join(work, self.name)
        os.makedirs(self.work)

    def command(self, broker: int) -> list[str]:
        if self.system == "streams":
            return ["java", "-cp", self.classpath, "shareflow.bench.Main", "streams", BOOTSTRAP, self.name,
                    self.args.input, self.output, str(self.interval), str(self.args.parallelism)]
        job = os.path.join(self.work, "job.toml")
        with open(job, "w") as f:
            f.write(f'kafka = "{BOOTSTRAP}"\n'
                    f'checkpoints = "file://{os.path.join(self.work, "checkpoints")}"\n\n'
                    f'[source]\ngroup = "{self.name}"\ntopics = ["{self.args.input}"]\nmode = "exactly-once"\n\n'
                    '[[transform]]\nname = "upper"\n'
                    'sql = "SELECT key, upper(CAST(value AS VARCHAR)) AS value FROM input"\n\n'
                    f'[sink]\nkind = "kafka"\ntopic = "{self.output}"\n\n'
                    f'[job]\nparallelism = {self.args.parallelism}\ncheckpoint_interval_ms = {self.interval}\n')
        return [self.args.binary, "run", job, "--instance", "a"]

    def go(self, broker: int) -> dict:
        create_topic(self.output, self.args.partitions)
        counter = subprocess.Popen(
            counter_command(self.classpath, self.output, self.args.records, GRACE_MS, RUN_LIMIT_SECONDS * 1000,
                            kafka_requests.JMX_PORT),
            stdout=subprocess.PIPE, text=True)
        killer = threading.Timer(RUN_LIMIT_SECONDS + 60, counter.kill)
        killer.start()
        system = None
        recording = False
        try:
            ready = self.event(counter, "ready")
            if self.args.profile_broker:
                jcmd(broker, "JFR.start", f"name={self.name}", "settings=profile",
                     f"filename={os.path.join(self.args.profile_broker, self.name + '.jfr')}")
                recording = True
            broker0, started = cpu_seconds(broker), time.time() * 1000
            with open(os.path.join(self.work, "system.log"), "w") as out:
                system = subprocess.Popen(self.command(broker), stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True)
            watch = threading.Thread(target=watch_system, args=(system, counter), daemon=True)
            watch.start()
            complete = self.event(counter, "complete", system)
            broker1 = cpu_seconds(broker)
            job_cpu = cpu_seconds(system.pid)
            if recording:
                jcmd(broker, "JFR.stop", f"name={self.name}")
                recording = False
            final = self.event(counter, "final", system)
        finally:
            killer.cancel()
            if recording:
                subprocess.run(["jcmd", str(broker), "JFR.stop", f"name={self.name}"], capture_output=True,
                               timeout=60, check=False)
            if system is not None:
                stop(system)
            if counter.poll() is None:
                counter.kill()
            counter.wait()
        if not final.get("ok"):
            fail(f"{self.system} broke exactly-once in {self.name}: {final} (log: {self.work}/system.log)")
        delete_topics_with_prefix(self.name)
        records = self.args.records
        whole = (complete["last_ms"] - started) / 1000
        middle = (complete["p90_ms"] - complete["p10_ms"]) / 1000
        return {
            "kind": "system_run",
            "system": self.system,
            "interval_ms": self.interval,
            "round": self.round,
            "records": records,
            "value_bytes": self.args.value_bytes,
            "partitions": self.args.partitions,
            "parallelism": self.args.parallelism,
            "input_batch_bytes": self.args.input_batch_bytes,
            "first_record_s": round((complete["first_ms"] - started) / 1000, 3),
            "whole_s": round(whole, 3),
            "whole_rate": round(records / whole),
            "middle_rate": round(0.8 * records / middle) if middle > 0 else None,
            "job_cpu_s_per_m": round(job_cpu / records * 1e6, 2),
            "broker_cpu_s_per_m": round((broker1 - broker0) / records * 1e6, 2),
            "requests": requests_between(ready["requests"], complete["requests"]),
            "duplicates": final["duplicates"],
        }

    def event(self, counter: subprocess.Popen, name: str, system: subprocess.Popen | None = None) -> dict:
        assert counter.stdout is not None
        for line in counter.stdout:
            if system is not None and system.poll() is not None:
                fail(f"{self.system} exited with status {system.returncode} before the counter saw every "
                     f"record; its log: {self.work}/system.log")
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if row.get("event") == name:
                return row
            if row.get("event") == "timeout":
                fail(f"{self.system} did not deliver every record within {RUN_LIMIT_SECONDS} s: {row} "
                     f"(log: {self.work}/system.log)")
        status = counter.wait()
        if system is not None and system.poll() is not None:
            fail(f"{self.system} exited with status {system.returncode} before the counter saw every record; "
                 f"its log: {self.work}/system.log")
        fail(f"the counter ended (status {status}) before its {name!r} line; "
             f"{self.system}'s log: {self.work}/system.log")
        raise AssertionError("unreachable")


def watch_system(system: subprocess.Popen, counter: subprocess.Popen) -> None:
    """Stops the counter when the system exits first, so that a dead system fails the run
    at once instead of at the counter's time limit."""
    while counter.poll() is None:
        if system.poll() is not None:
            counter.kill()
            return
        time.sleep(0.5)


def jcmd(pid: int, *args: str) -> None:
    out = subprocess.run(["jcmd", str(pid), *args], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail(f"jcmd {pid} {' '.join(args)} failed: {out.stdout.strip()} {out.stderr.strip()}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def counter_command(classpath: str, topic: str, records: int, grace_ms: int, timeout_ms: int,
                    jmx_port: int | None = None) -> list[str]:
    """The read_committed counter of `topic` (benches/streams, `count`)."""
    return ["java", "-Xmx512m", "-cp", classpath, "shareflow.bench.Main", "count", BOOTSTRAP, topic, str(records),
            str(grace_ms), str(timeout_ms), *([str(jmx_port)] if jmx_port is not None else [])]


def counter(classpath: str, topic: str, records: int, grace_ms: int, timeout_ms: int) -> tuple[int, list[dict]]:
    """Runs the counter to its end: its exit status and its JSON lines (with the tail of
    its stderr when it ended with none of its verdicts: 0 exact, 3 not, 4 timed out)."""
    out = subprocess.run(counter_command(classpath, topic, records, grace_ms, timeout_ms),
                         capture_output=True, text=True, timeout=timeout_ms / 1000 + 120)
    lines = []
    for line in out.stdout.splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if out.returncode not in (0, 3, 4):
        # Not one of its verdicts: an exception. Its stderr says which.
        lines.append({"event": "stderr", "tail": out.stderr.splitlines()[-15:]})
    return out.returncode, lines


def self_test(classpath: str) -> None:
    """The Java side checked against the broker: the counter finds duplicates, values not
    upper-cased and missing ids, and the Streams reference upper-cases every record once.
    Small (200 records); scripts/test runs it."""
    prefix = f"sb-selftest-{datetime.datetime.now().strftime('%H%M%S')}"
    twice, once, out = f"{prefix}-twice", f"{prefix}-in", f"{prefix}-out"
    streams = None
    try:
        for topic in (twice, once, out):
            create_topic(topic, 2)
        for topic in (twice, twice, once):
            subprocess.run(["java", "-cp", classpath, "shareflow.bench.Main", "produce", BOOTSTRAP, topic, "200", "64",
                            "16384"], check=True, capture_output=True, timeout=120)

        status, lines = counter(classpath, twice, 200, 1000, 60_000)
        final = next((line for line in lines if line.get("event") == "final"), {})
        if status != 3 or final.get("duplicates") != 200 or final.get("not_upper_cased") != 400:
            fail(f"self-test: the counter should fail a topic holding every id twice, in lowercase, with status 3, "
                 f"200 duplicates and 400 values not upper-cased; it gave status {status}: {lines}")

        # Long enough for the counter to join and read all 200 under a loaded test run
        # (5 s was not: it timed out having read nothing).
        status, lines = counter(classpath, twice, 300, 0, 20_000)
        timeout = next((line for line in lines if line.get("event") == "timeout"), {})
        if status != 4 or timeout.get("distinct") != 200:
            fail(f"self-test: the counter should time out (status 4) with 200 of 300 ids; it gave status {status}: "
                 f"{lines}")

        streams_log = tempfile.NamedTemporaryFile(prefix="streams-bench-self-test-", suffix=".log", delete=False)
        streams = subprocess.Popen(["java", "-cp", classpath, "shareflow.bench.Main", "streams", BOOTSTRAP,
                                    f"{prefix}-app", once, out, "100", "1"],
                                   stdout=streams_log, stderr=subprocess.STDOUT)
        status, lines = counter(classpath, out, 200, 1000, 120_000)
        final = next((line for line in lines if line.get("event") == "final"), {})
        if status != 0 or not final.get("ok") or final.get("read") != 200:
            fail(f"self-test: the Streams reference should upper-case 200 records once each; the counter gave status "
                 f"{status}: {lines}; the reference's log: {streams_log.name}")
        log("self-test passed: the counter refuses duplicates, lowercase values and missing ids, and the Streams "
            "reference upper-cases every record once")
        os.unlink(streams_log.name)
    finally:
        if streams is not None:
            stop(streams)
        delete_topics_with_prefix(prefix)


def median(values: list) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def report(rows: list[dict]) -> None:
    for interval in sorted({r["interval_ms"] for r in rows}, reverse=True):
        at = [r for r in rows if r["interval_ms"] == interval]
        print(f"\n== interval {interval} ms: medians of {len({r['round'] for r in at})} rounds")
        print(f"{'system':<10} {'whole rec/s':>12} {'middle rec/s':>13} {'job CPU s/M':>12} {'broker CPU s/M':>15}")
        for system in ("shareflow", "streams"):
            mine = [r for r in at if r["system"] == system]
            if mine:
                print(f"{system:<10} {median([r['whole_rate'] for r in mine]):>12,.0f} "
                      f"{median([r['middle_rate'] for r in mine]):>13,.0f} "
                      f"{median([r['job_cpu_s_per_m'] for r in mine]):>12.2f} "
                      f"{median([r['broker_cpu_s_per_m'] for r in mine]):>15.2f}")
        ratios: dict[str, list[float]] = {"whole": [], "middle": [], "job CPU": [], "broker CPU": []}
        for round_ in sorted({r["round"] for r in at}):
            pair = {r["system"]: r for r in at if r["round"] == round_}
            if len(pair) < 2:
                continue
            s, k = pair["shareflow"], pair["streams"]
            for name, key in (("whole", "whole_rate"), ("middle", "middle_rate"), ("job CPU", "job_cpu_s_per_m"),
                              ("broker CPU", "broker_cpu_s_per_m")):
                if s.get(key) and k.get(key):
                    ratios[name].append(s[key] / k[key])
        if ratios["whole"]:
            print("shareflow / Streams, same round: " + ", ".join(
                f"{k} {median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for k, v in ratios.items() if v))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/shareflow-target"))
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--intervals", default="1000,100", help="checkpoint / commit intervals in ms, comma-separated")
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--input-batch-bytes", type=int, default=16384,
                        help="batch.size of the producer that writes the input (Kafka's default: 16384)")
    parser.add_argument("--systems", default="shareflow,streams")
    parser.add_argument("--binary", default=os.path.join(target, "release", "shareflow"))
    parser.add_argument("--profile-broker", metavar="DIR",
                        help="record the broker with Java Flight Recorder during each run, into DIR/RUN.jfr "
                             "(scripts/jfr-top reads them); the recording costs the broker CPU")
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                        help="skip the unmeasured run of each system before the first round")
    parser.add_argument("--self-test", action="store_true",
                        help="only check the Java side on 200 records against a running test broker")
    parser.add_argument("--fresh-broker", action="store_true", help="restart the test broker before the first run")
    args = parser.parse_args()
    intervals = [int(i) for i in args.intervals.split(",") if i]
    systems = [s for s in args.systems.split(",") if s]
    if any(s not in ("shareflow", "streams") for s in systems) or not systems:
        fail(f"--systems takes shareflow and/or streams, got {args.systems!r}")
    if args.records <= 0 or args.rounds <= 0 or not intervals:
        fail("--records, --rounds and --intervals must be positive")
    if args.self_test:
        classpath = build_java()
        if broker_running() is None:
            fail("--self-test needs the running test broker: scripts/kafka start")
        self_test(classpath)
        return
    if "shareflow" in systems and not os.access(args.binary, os.X_OK):
        fail(f"{args.binary} is not built: cargo build --release")
    classpath = build_java()
    if args.profile_broker:
        args.profile_broker = os.path.abspath(args.profile_broker)
        os.makedirs(args.profile_broker, exist_ok=True)

    script = os.path.join(ROOT, "scripts", "kafka")
    started_broker = False
    if args.fresh_broker and broker_running():
        subprocess.run([script, "stop"], check=True)
    if broker_running() is None:
        subprocess.run([script, "start"], check=True)
        started_broker = True
    stamp = datetime.datetime.now().strftime("%H%M%S")
    args.input = f"sb-{stamp}-in"
    results_dir = os.environ.get("SHAREFLOW_RESULTS_DIR", os.path.join(ROOT, "docs", "results"))
    os.makedirs(results_dir, exist_ok=True)
    results = os.path.join(results_dir, "streams_bench.jsonl")
    # Rows go to a partial file that replaces the results only when every run ended:
    # an aborted bench leaves the committed results as they were.
    partial = results + ".partial"
    rows = []
    try:
        broker = broker_running()
        if broker is None:
            fail("the test broker did not start; see scripts/kafka start")
        kafka_requests.open_jmx(broker)
        header = {"kind": "run", "bench": "streams_bench", "cores": os.cpu_count(), "profile": "release",
                  "started_unix_s": int(time.time()), "rev": git_rev(),
                  "args": {"records": args.records, "rounds": args.rounds, "intervals": intervals,
                           "value_bytes": args.value_bytes, "partitions": args.partitions,
                           "parallelism": args.parallelism, "input_batch_bytes": args.input_batch_bytes,
                           "systems": systems, "warm_up": args.warm_up}}
        with open(partial, "w") as f:
            f.write(json.dumps(header) + "\n")
        with tempfile.TemporaryDirectory(prefix="streams-bench-") as work:
            create_topic(args.input, args.partitions)
            log(f"writing {args.records:,} records of {args.value_bytes} bytes to {args.input}")
            subprocess.run(["java", "-cp", classpath, "shareflow.bench.Main", "produce", BOOTSTRAP, args.input,
                            str(args.records), str(args.value_bytes), str(args.input_batch_bytes)], check=True)
            if args.warm_up:
                # The broker's and the counter's JIT warm up on whichever system runs
                # first: one unmeasured run of each, so that round 1 compares like with like.
                for system in systems:
                    row = Run(args, classpath, system, intervals[0], 0, stamp, work).go(broker)
                    log(f"warm-up, {system}: whole {row['whole_rate']:,} rec/s (not kept)")
            for interval in intervals:
                for round_ in range(1, args.rounds + 1):
                    order = systems if round_ % 2 == 1 else list(reversed(systems))
                    for position, system in enumerate(order):
                        row = Run(args, classpath, system, interval, round_, stamp, work).go(broker)
                        row.update({"first": position == 0})
                        rows.append(row)
                        with open(partial, "a") as f:
                            f.write(json.dumps(row) + "\n")
                        log(f"interval {interval} ms, round {round_}, {system}: whole {row['whole_rate']:,} "
                            f"rec/s, middle {row['middle_rate']}, job CPU {row['job_cpu_s_per_m']} s/M, "
                            f"broker CPU {row['broker_cpu_s_per_m']} s/M")
        os.replace(partial, results)
    finally:
        try:
            if broker_running() is not None:
                delete_topics_with_prefix(f"sb-{stamp}-")
        finally:
            if started_broker:
                subprocess.run([script, "stop"], check=False)
    report(rows)
    print(f"\nresults in {results}")


if __name__ == "__main__":
    main()
