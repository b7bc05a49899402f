"""shareflow's `shareflow run JOB.toml` against Flink SQL 2.x (exactly-once Kafka sink, EXACTLY_ONCE
checkpoints, in a local MiniCluster), side by side on the test broker, as a user runs
each: one stateful query, a tumbling 10 s event-time window count per key, over the same
input topic, at the same checkpoint interval and parallelism, and one read_committed
counter of window rows that measures both.

The input is written once, for every run: N records (--records) over K keys (--keys) in
key-interleaved order, record i keyed by key number i % K, its record timestamp rising
evenly over --event-seconds of event time (1,000,000 records over 100 s by default:
with 10,000 keys, each key has one record a second, ten a window). Every (key, window)
pair then holds records, and the output has one row per pair, its value
`WINDOW_START_MS,COUNT`; the counts add up to N. Each key stays on one partition and its
timestamps rise, so no record is late for either system's watermark, which lags
--out-of-order-ms behind the newest event time in both (Flink's bounded out-of-orderness,
shareflow's allowed lateness).

After the N records the input has one sentinel record per partition, key "~end",
timestamp 10 minutes past the input's span. Flink's source is bounded (it reads to the
offsets that were the latest at its start) and emits every window at its end; shareflow's
Kafka source is unbounded, and emits a window only once its watermark passes the
window's end (at a checkpoint barrier), keeping open windows when stopped. The sentinels
move both systems' watermarks past every real window, so both close them all through
their watermark; the sentinels' own window (Flink emits it at the end, shareflow keeps
it) is no part of the answer. The counter knows the answer (the same formula as the
producer): it ignores sentinel-key rows and checks that the other rows are exactly the
input's (key, window) pairs, each once, each with its count, the counts adding up to N.

For each interval and round, the systems run one after the other, the order alternating
by round. Each run gets a fresh output topic, a fresh group, fresh checkpoints and fresh
transactional ids. Before the first round, each system runs once unmeasured
(--no-warm-up skips it): on a freshly started broker, whichever system ran first paid
for the broker's JIT. A run:
  1. starts the counter (benches/flink, `count`) on the empty output topic;
  2. starts the system, and samples the broker's CPU time (/proc) then;
  3. waits until the counter has every (key, window) pair, samples the broker's and the
     system's CPU time again, and waits the counter's grace period (duplicates would show
     there). A run in which rows stop for 30 s before every pair came is "stalled": it
     is kept with complete = false, its times over the rows that did come, and the
     bench says so with the tail of the system's stderr (with the sentinels, this is a
     failure of the system, not of the input);
  4. Flink's job ends by itself (a bounded source); its own figures (the JSON line of
     benches/flink's FlinkSqlBench: records / the seconds from submitting the INSERT to
     the job's end) are kept beside the counter's. shareflow runs until it is stopped
     with SIGTERM (SIGKILL after 30 s), by pid;
  5. deletes the output topic and the topics the run created (shareflow's ledger).
A run whose answer is wrong fails the bench, with the tail of the system's stderr: a pair
twice, a pair the input lacks or a malformed row (exactly-once broken), a pair whose
count is below the input's, or rows shareflow's log says it dropped as late (its
watermark passed their windows before they came).
Each run's stdout and stderr (system.out, system.log) and shareflow's job file stay in
~/.cache/shareflow/flink-bench/runs/DATE-TIME/RUN/ (shareflow's checkpoints are deleted
after a complete run).
Whole-run rate: records / (the last row's arrival - the system's start, JVM or process
start included). Middle rate: 80 % of the records / (the moments 10 % and 90 % of the
pairs had arrived). Windows close evenly through the input, so this is the input's rate
in the middle of the run only when rows commit as their windows close: rows that commit
in a few bursts make it large (Flink's did, its first row coming 18-21 s into runs of
22-26 s). CPU is per million records, over the system's start to the last row (Flink's:
to its exit, if it exited first).

The results go to docs/results/flink_bench.jsonl (SHAREFLOW_RESULTS_DIR overrides the
directory), replaced when every run of an invocation ended: a header line (kind "run":
the arguments, the git revision, the core count), then one line per system run (kind
"system_run"). Standard library only.

    scripts/flink-bench [--records N] [--keys K] [--rounds R] [--intervals 1000] [--only flink|shareflow]
                        [--binary PATH]

It builds the Java side with mvn and javac (once; offline afterwards), starts the test
broker when none runs (and stops it at the end), and for shareflow needs a release build:
`cargo build --release`.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import kafka_requests  # noqa: E402  (where the test broker's jars are)
# The broker and topic helpers, the same as the Kafka Streams bench's.
from streams_bench import (  # noqa: E402
    broker_running, create_topic, delete_topics_with_prefix, git_rev, kafka_tool, median, need, topics,
)

SOURCES = os.path.join(ROOT, "benches", "flink")
HOME = os.environ.get("SHAREFLOW_HOME", os.path.expanduser("~/.cache/shareflow"))
BUILD = os.path.join(HOME, "flink-bench")
PORT = int(os.environ.get("SHAREFLOW_KAFKA_PORT", "19092"))
BOOTSTRAP = f"127.0.0.1:{PORT}"
PIDFILE = os.path.join(HOME, "run", "kafka.pid")
SYSTEMS = ("shareflow", "flink")
# The query's window; both systems' SQL name 10 s, and the expected pairs follow it.
WINDOW_MS = 10_000
# The input's end markers: benches/flink's Main.SENTINEL_KEY (one record per partition,
# after the real ones, Main.SENTINEL_AFTER_MS past the input's span).
SENTINEL_KEY = "~end"
# A run that takes longer than this fails the bench.
RUN_LIMIT_SECONDS = 900
GRACE_MS = 2000
# Rows that stop for this long before every pair came end the run as stalled.
IDLE_MS = 30_000
# How long the counter may still take to see every row once the system exited by itself
# (Flink's job ends right after its last transaction commits).
AFTER_EXIT_SECONDS = 60
TICKS = os.sysconf("SC_CLK_TCK")

# shareflow's query: the same window count as FlinkSqlBench's INSERT, written the way
# shareflow's stateful SQL takes it (the source's rows are the table `input`, with the
# record's `key`, `value` and `timestamp`).
SHAREFLOW_SQL = ("SELECT CAST(key AS VARCHAR) AS key, "
                 "concat(CAST(CAST(tumble(timestamp, INTERVAL '10 seconds') AS BIGINT) AS VARCHAR), ',', "
                 "CAST(count(*) AS VARCHAR)) AS value "
                 "FROM input GROUP BY key, tumble(timestamp, INTERVAL '10 seconds')")


def fail(message: str) -> None:
    print(f"flink-bench: {message}", file=sys.stderr)
    sys.exit(1)


def log(message: str) -> None:
    print(f"[flink-bench] {message}", file=sys.stderr, flush=True)


def tail(path: str, lines: int = 40) -> str:
    """The last `lines` lines of a log, for a message."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip() or "(empty)"
    except OSError as e:
        return f"(unreadable: {e})"


def late_rows(path: str) -> int:
    """The rows shareflow's stateful operators dropped as late, from its warnings (one
    per operator subtask and checkpoint, `late=N`) in its stderr."""
    total = 0
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = re.sub(r"\x1b\[[0-9;]*m", "", line)
                if "counted and dropped" in line:
                    m = re.search(r"\blate=(\d+)", line)
                    total += int(m.group(1)) if m else 0
    except OSError:
        pass
    return total


def build_java() -> str:
    """Copies the Flink side's dependencies with mvn and compiles it with javac, once per
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
    logging()
    if os.path.exists(stamp) and open(stamp).read() == digest.hexdigest():
        return classpath
    log("building the Flink SQL job, the producer and the counter (mvn, javac)")
    if os.path.exists(stamp):
        os.remove(stamp)
    for folder in ("lib", "classes"):
        shutil.rmtree(os.path.join(BUILD, folder), ignore_errors=True)
    subprocess.run(["mvn", "-q", "-B", "-Dstyle.color=never", "dependency:copy-dependencies",
                    "-DincludeScope=runtime", f"-DoutputDirectory={os.path.join(BUILD, 'lib')}"],
                   cwd=SOURCES, check=True)
    sources = [os.path.join(d, n) for d, _, fs in os.walk(os.path.join(SOURCES, "src")) for n in fs
               if n.endswith(".java")]
    subprocess.run(["javac", "-Xlint:all", "-Werror", "-d", os.path.join(BUILD, "classes"), "-cp",
                    os.path.join(BUILD, "lib", "*"), *sources], check=True)
    with open(stamp, "w") as f:
        f.write(digest.hexdigest())
    return classpath


def logging() -> None:
    """Flink and the Kafka clients log through log4j2 here: at WARN, to stderr, less the
    metric groups' warnings of every duplicate metric name (the Kafka clients' metrics
    that Flink re-registers). Written on every start, so that a change applies at once."""
    os.makedirs(os.path.join(BUILD, "log4j"), exist_ok=True)
    with open(os.path.join(BUILD, "log4j", "log4j2.properties"), "w") as f:
        f.write("rootLogger.level = WARN\n"
                "rootLogger.appenderRef.stderr.ref = stderr\n"
                "appender.stderr.name = stderr\n"
                "appender.stderr.type = Console\n"
                "appender.stderr.target = SYSTEM_ERR\n"
                "appender.stderr.layout.type = PatternLayout\n"
                "appender.stderr.layout.pattern = [%d] %p %m (%c)%n\n"
                "logger.metrics.name = org.apache.flink.metrics.MetricGroup\n"
                "logger.metrics.level = ERROR\n")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU of a process (all its threads), from /proc; a process that
    exited and is not reaped yet still shows its totals there."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def expected_pairs(records: int, keys: int, base_ms: int, span_ms: int) -> int:
    """The (key, window) pairs of the input that benches/flink's `produce` writes: record
    i has key number i % keys and timestamp base_ms + i * span_ms // records (the two,
    and benches/flink's Count.expected, must change together); the sentinels are no
    part of it."""
    return len({(i % keys, (base_ms + i * span_ms // records) // WINDOW_MS) for i in range(records)})


class Watch:
    """Watches a system's process without reaping it: when it exits, its CPU time is
    read from its /proc entry, which stays until the process is reaped (by stop()).
    A system that fails stops the counter at once, so that the run fails then instead
    of at the counter's time limit; one that ends by itself (status 0) leaves the
    counter AFTER_EXIT_SECONDS to see its last rows."""

    def __init__(self, system: subprocess.Popen, counter: subprocess.Popen) -> None:
        self.system, self.counter = system, counter
        self.status: int | None = None
        self.cpu_at_exit: float | None = None
        self.exited = threading.Event()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        try:
            info = os.waitid(os.P_PID, self.system.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # reaped by stop() first
            self.exited.set()
            return
        try:
            self.cpu_at_exit = cpu_seconds(self.system.pid)
        except OSError:
            pass
        self.status = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        self.exited.set()
        if self.status != 0:
            self.counter.kill()
        else:
            timer = threading.Timer(AFTER_EXIT_SECONDS, self.counter.kill)
            timer.daemon = True
            timer.start()

    def cpu(self) -> float:
        """The system's CPU time so far, or at its exit."""
        if not self.exited.is_set():
            try:
                return cpu_seconds(self.system.pid)
            except OSError:
                self.exited.wait(5)
        return self.cpu_at_exit if self.cpu_at_exit is not None else float("nan")


class Run:
    """One system's run: the counter, the system's process, the samples."""

    def __init__(self, args: argparse.Namespace, system: str, topic: str, interval: int, round_: int) -> None:
        self.args, self.system, self.topic, self.interval, self.round = args, system, topic, interval, round_
        self.name = f"fb-{args.stamp}-{system}-{interval}-{round_}"
        self.output = f"{self.name}-out"
        self.work = os.path.join(args.work, self.name)
        os.makedirs(self.work)
        self.stopped: dict | None = None

    def go(self, command: list[str], broker: int, env: dict | None = None) -> dict:
        """Runs `command` (the system, in `env`) against the counter and returns the run's row."""
        args = self.args
        create_topic(self.output, args.partitions)
        counter = subprocess.Popen(
            ["java", "-Xmx512m", "-cp", args.classpath, "shareflow.flinkbench.Main", "count", BOOTSTRAP, self.output,
             str(args.records), str(args.keys), str(args.base_ms), str(args.span_ms), str(GRACE_MS),
             str(RUN_LIMIT_SECONDS * 1000), str(IDLE_MS)],
            stdout=subprocess.PIPE, text=True)
        killer = threading.Timer(RUN_LIMIT_SECONDS + 60, counter.kill)
        killer.start()
        system = None
        try:
            ready = self.event(counter, ("ready",))
            if ready.get("pairs") != args.pairs:
                fail(f"the counter expects {ready.get('pairs')} (key, window) pairs, the bench {args.pairs}: "
                     "Count.expected and expected_pairs disagree")
            broker0, started = cpu_seconds(broker), time.time() * 1000
            with open(os.path.join(self.work, "system.out"), "w") as out, \
                    open(os.path.join(self.work, "system.log"), "w") as err:
                system = subprocess.Popen(command, stdout=out, stderr=err, start_new_session=True, env=env)
            watch = Watch(system, counter)
            done = self.event(counter, ("complete", "stalled"), watch)
            broker1 = cpu_seconds(broker)
            job_cpu = watch.cpu()
            final = self.event(counter, ("final",), watch)
            own = self.own_figures(system) if self.system == "flink" else {}
        finally:
            killer.cancel()
            if system is not None:
                self.stopped = stop(system)
            if counter.poll() is None:
                counter.kill()
            counter.wait()
        log_path = os.path.join(self.work, "system.log")
        late = late_rows(log_path) if self.system == "shareflow" else None
        said = (f"; shareflow's log counts {late:,} rows late, dropped (its warnings 'rows arrived after their windows "
                f"were emitted: counted and dropped')" if late else "")
        if final.get("duplicates") or final.get("malformed") or final.get("unexpected"):
            fail(f"{self.system} broke exactly-once in {self.name}: {final}; its stderr ({log_path}) ends:\n"
                 f"{tail(log_path)}")
        complete = done["event"] == "complete"
        if final.get("wrong_counts") or late or (complete and not final.get("ok")):
            fail(f"{self.system}'s answer in {self.name} is wrong: {final['distinct']:,} of {args.pairs:,} pairs, "
                 f"{final['wrong_counts']:,} of them with a count below the input's, the counts adding up to "
                 f"{final['sum_counts']:,} of {args.records:,} records{said}: {final}; its stderr ({log_path}) ends:\n"
                 f"{tail(log_path)}")
        if complete:
            shutil.rmtree(os.path.join(self.work, "checkpoints"), ignore_errors=True)
        else:
            log(f"{self.system} STALLED in {self.name}: {done['distinct']:,} of {args.pairs:,} pairs, then no row for "
                f"{IDLE_MS / 1000:.0f} s; stopped: {self.stopped}; its stderr ({log_path}) ends:\n{tail(log_path)}")
        delete_topics_with_prefix(self.name)
        records = args.records
        whole = (done["last_ms"] - started) / 1000
        middle = (done["p90_ms"] - done["p10_ms"]) / 1000 if done["p10_ms"] and done["p90_ms"] else 0
        row = {
            "kind": "system_run",
            "system": self.system,
            "interval_ms": self.interval,
            "round": self.round,
            "records": records,
            "keys": args.keys,
            "event_seconds": args.event_seconds,
            "pairs": args.pairs,
            "value_bytes": args.value_bytes,
            "partitions": args.partitions,
            "parallelism": args.parallelism,
            "out_of_order_ms": args.out_of_order_ms,
            "complete": complete,
            "first_row_s": round((done["first_ms"] - started) / 1000, 3),
            "whole_s": round(whole, 3),
            "whole_rate": round(records / whole),
            "middle_rate": round(0.8 * records / middle) if middle > 0 else None,
            "job_cpu_s_per_m": round(job_cpu / records * 1e6, 2),
            "broker_cpu_s_per_m": round((broker1 - broker0) / records * 1e6, 2),
            "output_rows": final["rows"],
            "distinct_pairs": final["distinct"],
            "duplicates": final["duplicates"],
            "unexpected": final["unexpected"],
            "wrong_counts": final["wrong_counts"],
            "sum_counts": final["sum_counts"],
            "sentinel_rows": final["sentinel_rows"],
        }
        if self.system == "shareflow":
            row["stop"] = self.stopped
        if own:
            row["flink"] = {k: own[k] for k in ("records", "submit_s", "wall_s", "rate", "net_runtime_s",
                                                "output_rows", "sum_counts", "sentinel_rows")}
        return row

    def own_figures(self, system: subprocess.Popen) -> dict:
        """Waits for Flink's job to end by itself (bounded) and returns its JSON line."""
        try:
            system.wait(timeout=RUN_LIMIT_SECONDS)
        except subprocess.TimeoutExpired:
            fail(f"flink's job did not end within {RUN_LIMIT_SECONDS} s of its last row; its log: "
                 f"{self.work}/system.log")
        if system.returncode != 0:
            fail(f"flink exited with status {system.returncode}; its log: {self.work}/system.log")
        with open(os.path.join(self.work, "system.out")) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if row.get("event") == "flink":
                    return row
        fail(f"flink printed no figures; its output: {self.work}/system.out, its log: {self.work}/system.log")
        raise AssertionError("unreachable")

    def event(self, counter: subprocess.Popen, names: tuple[str, ...], watch: Watch | None = None) -> dict:
        """The counter's next line whose event is one of `names`."""
        assert counter.stdout is not None
        for line in counter.stdout:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if row.get("event") in names:
                return row
            if row.get("event") == "timeout":
                log_path = os.path.join(self.work, "system.log")
                fail(f"{self.system} did not deliver every window row within {RUN_LIMIT_SECONDS} s: {row}; its "
                     f"stderr ({log_path}) ends:\n{tail(log_path)}")
        status = counter.wait()
        log_path = os.path.join(self.work, "system.log")
        if watch is not None and watch.exited.is_set():
            fail(f"{self.system} exited with status {watch.status} before the counter saw every row; its stderr "
                 f"({log_path}) ends:\n{tail(log_path)}")
        fail(f"the counter ended (status {status}) before its {'/'.join(names)!r} line; "
             f"{self.system}'s stderr ({log_path}) ends:\n{tail(log_path)}")
        raise AssertionError("unreachable")


def stop(process: subprocess.Popen) -> dict:
    """Stops the system's process (its pid only): SIGTERM, then SIGKILL after 30 s.
    Returns how: its exit status (negative: the signal), the seconds it took, and
    whether it exited before it was signalled or needed the SIGKILL."""
    if process.poll() is not None:
        return {"status": process.returncode, "exited_before": True}
    began = time.time()
    process.send_signal(signal.SIGTERM)
    killed = False
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        killed = True
    return {"status": process.returncode, "seconds": round(time.time() - began, 3), "killed": killed}


def run_flink(args: argparse.Namespace, topic: str, interval: int, round_: int, broker: int) -> dict:
    """One measured run of the Flink SQL job (benches/flink, FlinkSqlBench) over `topic`."""
    run = Run(args, "flink", topic, interval, round_)
    command = ["java", "-Xmx2g", "-cp", args.classpath, "shareflow.flinkbench.Main", "flink", BOOTSTRAP, topic,
               run.output, run.name, str(interval), str(args.parallelism), str(args.out_of_order_ms)]
    return run.go(command, broker)


# ---------------------------------------------------------------------------------------
# shareflow's side: a job file (src/job_file.rs) per run.
# ---------------------------------------------------------------------------------------
# shareflow's defaults, written out so that the job file says them: a checkpoint may take
# 10 s, and an instance silent for 30 s is adopted (more than interval plus timeout).
CHECKPOINT_TIMEOUT_MS = 10_000
ADOPTION_TIMEOUT_MS = 30_000

def run_shareflow(args: argparse.Namespace, topic: str, interval: int | None = None, round_: int = 0,
                  broker: int | None = None) -> dict:
    """One measured run of `shareflow run JOB.toml` over `topic`: one instance ("a") of a
    fresh share group, exactly once, from the earliest records, SHAREFLOW_SQL as its one
    transform with its watermark lagging --out-of-order-ms (allowed_lateness_ms), a Kafka
    sink to the run's output topic, at the bench's parallelism, partitions (for topics it
    would create) and checkpoint interval. The job file is left in the run's work
    directory; it logs at warn (SHAREFLOW_LOG) to the run's system.log, where the
    stateful operator counts the late rows it drops (a run with any fails the bench). It
    runs until stopped, so the counter alone ends the run: when every (key, window) pair
    came (the sentinels' watermark closes the last real windows), or when rows stalled."""
    interval = args.intervals[0] if interval is None else interval
    broker = broker_running() if broker is None else broker
    if broker is None:
        fail("the test broker is not running: scripts/kafka start")
    run = Run(args, "shareflow", topic, interval, round_)
    job = os.path.join(run.work, "job.toml")
    # json.dumps gives a TOML basic string for these values (ASCII, no control characters).
    with open(job, "w") as f:
        f.write(f"kafka = {json.dumps(BOOTSTRAP)}\n"
                f"checkpoints = {json.dumps('file://' + os.path.join(run.work, 'checkpoints'))}\n\n"
                f"[source]\ngroup = {json.dumps(run.name)}\ntopics = [{json.dumps(topic)}]\n"
                'mode = "exactly-once"\nfrom = "earliest"\n\n'
                f"[[transform]]\nname = \"window\"\nsql = {json.dumps(SHAREFLOW_SQL)}\n"
                f"allowed_lateness_ms = {args.out_of_order_ms}\n\n"
                f"[sink]\nkind = \"kafka\"\ntopic = {json.dumps(run.output)}\n\n"
                f"[job]\nparallelism = {args.parallelism}\npartitions = {args.partitions}\n"
                f"checkpoint_interval_ms = {interval}\ncheckpoint_timeout_ms = {CHECKPOINT_TIMEOUT_MS}\n"
                f"adoption_timeout_ms = {ADOPTION_TIMEOUT_MS}\n")
    # `--instance` is required on Kafka; the group and the checkpoint root are the run's
    # own (a stateful job refuses to run beside another registered instance of its group).
    # Warnings (its default is errors only) as Flink's log4j2 here: among them the stateful
    # operator's count of late rows, dropped, per checkpoint.
    env = dict(os.environ)
    env.setdefault("SHAREFLOW_LOG", "warn")
    return run.go([args.binary, "run", job, "--instance", "a"], broker, env)


def run_system(args: argparse.Namespace, system: str, interval: int, round_: int, broker: int) -> dict:
    if system == "flink":
        return run_flink(args, args.input, interval, round_, broker)
    return run_shareflow(args, args.input, interval, round_, broker)


def report(rows: list[dict]) -> None:
    for interval in sorted({r["interval_ms"] for r in rows}, reverse=True):
        at = [r for r in rows if r["interval_ms"] == interval]
        print(f"\n== interval {interval} ms: medians of {len({r['round'] for r in at})} rounds")
        print(f"{'system':<10} {'whole rec/s':>12} {'middle rec/s':>13} {'own rec/s':>10} {'job CPU s/M':>12} "
              f"{'broker CPU s/M':>15} {'complete':>9}")
        for system in SYSTEMS:
            mine = [r for r in at if r["system"] == system]
            if mine:
                own = median([r["flink"]["rate"] for r in mine if "flink" in r])
                print(f"{system:<10} {median([r['whole_rate'] for r in mine]):>12,.0f} "
                      f"{median([r['middle_rate'] for r in mine]):>13,.0f} "
                      f"{'-' if own != own else f'{own:,.0f}':>10} "
                      f"{median([r['job_cpu_s_per_m'] for r in mine]):>12.2f} "
                      f"{median([r['broker_cpu_s_per_m'] for r in mine]):>15.2f} "
                      f"{sum(r['complete'] for r in mine):>5}/{len(mine)}")
        ratios: dict[str, list[float]] = {"whole": [], "middle": [], "job CPU": [], "broker CPU": []}
        for round_ in sorted({r["round"] for r in at}):
            pair = {r["system"]: r for r in at if r["round"] == round_}
            print(f"  round {round_}: " + "; ".join(
                f"{name} whole {r['whole_rate']:,} rec/s, middle {r['middle_rate'] or 0:,}, job CPU "
                f"{r['job_cpu_s_per_m']} s/M, broker CPU {r['broker_cpu_s_per_m']} s/M"
                f"{'' if r['complete'] else ' (STALLED)'}" for name, r in sorted(pair.items())) + (
                f"; shareflow / Flink whole {pair['shareflow']['whole_rate'] / pair['flink']['whole_rate']:.2f}"
                if len(pair) == 2 else ""))
            if len(pair) < 2:
                continue
            s, f = pair["shareflow"], pair["flink"]
            for name, key in (("whole", "whole_rate"), ("middle", "middle_rate"), ("job CPU", "job_cpu_s_per_m"),
                              ("broker CPU", "broker_cpu_s_per_m")):
                if s.get(key) and f.get(key):
                    ratios[name].append(s[key] / f[key])
        if ratios["whole"]:
            print("shareflow / Flink, same round: " + ", ".join(
                f"{k} {median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for k, v in ratios.items() if v))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/shareflow-target"))
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--event-seconds", type=int, default=100,
                        help="the event time the input's record timestamps span")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--intervals", default="1000", help="checkpoint intervals in ms, comma-separated")
    parser.add_argument("--out-of-order-ms", type=int, default=5000,
                        help="the watermark's delay behind the newest event time: Flink's bounded "
                             "out-of-orderness, shareflow's allowed lateness")
    parser.add_argument("--value-bytes", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--input-batch-bytes", type=int, default=16384,
                        help="batch.size of the producer that writes the input (Kafka's default: 16384)")
    parser.add_argument("--only", choices=SYSTEMS, help="run one system only")
    parser.add_argument("--binary", default=os.path.join(target, "release", "shareflow"))
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                        help="skip the unmeasured run of each system before the first round")
    parser.add_argument("--fresh-broker", action="store_true", help="restart the test broker before the first run")
    args = parser.parse_args()
    args.intervals = [int(i) for i in args.intervals.split(",") if i]
    systems = [args.only] if args.only else list(SYSTEMS)
    if min(args.records, args.keys, args.event_seconds, args.rounds, args.partitions, args.parallelism) <= 0 \
            or not args.intervals or min(args.intervals) < 10:
        fail("--records, --keys, --event-seconds, --rounds, --partitions and --parallelism must be positive, "
             "and --intervals at least 10 ms")
    if not 0 <= args.out_of_order_ms < 100_000:
        fail("--out-of-order-ms must be 0 to 99999")
    if "shareflow" in systems and not os.access(args.binary, os.X_OK):
        fail(f"{args.binary} is not built: cargo build --release (or --only flink)")
    args.classpath = build_java()

    script = os.path.join(ROOT, "scripts", "kafka")
    started_broker = False
    if args.fresh_broker and broker_running():
        subprocess.run([script, "stop"], check=True)
    if broker_running() is None:
        subprocess.run([script, "start"], check=True)
        started_broker = True
    args.stamp = datetime.datetime.now().strftime("%H%M%S")
    args.input = f"fb-{args.stamp}-in"
    # Event time starts on a window boundary, a minute before the input's span ends now,
    # well within the broker's accepted timestamp range.
    span_ms = args.event_seconds * 1000
    base_ms = (int(time.time() * 1000) - span_ms - 60_000) // WINDOW_MS * WINDOW_MS
    args.pairs = expected_pairs(args.records, args.keys, base_ms, span_ms)
    args.base_ms, args.span_ms = base_ms, span_ms
    results_dir = os.environ.get("SHAREFLOW_RESULTS_DIR", os.path.join(ROOT, "docs", "results"))
    os.makedirs(results_dir, exist_ok=True)
    results = os.path.join(results_dir, "flink_bench.jsonl")
    # Rows go to a partial file that replaces the results only when every run ended:
    # an aborted bench leaves the committed results as they were.
    partial = results + ".partial"
    rows = []
    try:
        broker = broker_running()
        if broker is None:
            fail("the test broker did not start; see scripts/kafka start")
        header = {"kind": "run", "bench": "flink_bench", "cores": os.cpu_count(), "profile": "release",
                  "started_unix_s": int(time.time()), "rev": git_rev(),
                  "args": {"records": args.records, "keys": args.keys, "event_seconds": args.event_seconds,
                           "pairs": args.pairs, "rounds": args.rounds, "intervals": args.intervals,
                           "out_of_order_ms": args.out_of_order_ms, "value_bytes": args.value_bytes,
                           "partitions": args.partitions, "parallelism": args.parallelism,
                           "input_batch_bytes": args.input_batch_bytes, "systems": systems,
                           "warm_up": args.warm_up}}
        with open(partial, "w") as f:
            f.write(json.dumps(header) + "\n")
        # Kept after the bench (the runs' logs); shareflow's checkpoints of complete runs
        # are deleted as they end.
        work = os.path.join(BUILD, "runs", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
        os.makedirs(work)
        log(f"runs' logs in {work}")
        args.work = work
        create_topic(args.input, args.partitions)
        log(f"writing {args.records:,} records over {args.keys:,} keys and {args.event_seconds} s of event time "
            f"to {args.input} ({args.pairs:,} (key, window) pairs), then a sentinel per partition")
        subprocess.run(["java", "-cp", args.classpath, "shareflow.flinkbench.Main", "produce", BOOTSTRAP,
                        args.input, str(args.records), str(args.keys), str(base_ms), str(span_ms),
                        str(args.value_bytes), str(args.input_batch_bytes)], check=True, timeout=RUN_LIMIT_SECONDS)
        if args.warm_up:
            # The broker's and the counter's JIT warm up on whichever system runs
            # first: one unmeasured run of each, so that round 1 compares like with like.
            for system in systems:
                row = run_system(args, system, args.intervals[0], 0, broker)
                log(f"warm-up, {system}: whole {row['whole_rate']:,} rec/s (not kept)")
        for interval in args.intervals:
            for round_ in range(1, args.rounds + 1):
                order = systems if round_ % 2 == 1 else list(reversed(systems))
                for position, system in enumerate(order):
                    row = run_system(args, system, interval, round_, broker)
                    row.update({"first": position == 0})
                    rows.append(row)
                    with open(partial, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    own = f", own {row['flink']['rate']:,} rec/s over {row['flink']['wall_s']} s" \
                        if "flink" in row else ""
                    log(f"interval {interval} ms, round {round_}, {system}: whole {row['whole_rate']:,} rec/s, "
                        f"middle {row['middle_rate']}{own}, {row['output_rows']:,} rows "
                        f"({'complete' if row['complete'] else 'STALLED'}), job CPU {row['job_cpu_s_per_m']} "
                        f"s/M, broker CPU {row['broker_cpu_s_per_m']} s/M")
        os.replace(partial, results)
    finally:
        try:
            if broker_running() is not None:
                delete_topics_with_prefix(f"fb-{args.stamp}-")
        finally:
            if started_broker:
                subprocess.run([script, "stop"], check=False)
    report(rows)
    print(f"\nresults in {results}")


if __name__ == "__main__":
    main()
