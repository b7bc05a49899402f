#!/usr/bin/env python3
"""Runs the test binaries that `cargo test --no-run --message-format=json` built, several
at once, and reports each binary's time and result.

Most of the long binaries (the Kafka campaigns, the SIGKILL campaigns) wait on a broker,
a child process or a timeout rather than on a CPU, so running them side by side takes
a fraction of running them one after another. Each binary still runs its own tests on
libtest's threads, exactly as `cargo test` runs it: the same arguments, the working
directory of its package, and the variables cargo sets for it.

    cargo test --workspace --no-run --message-format=json >built.json
    scripts/run_tests.py --built built.json [--jobs 3] [-- FILTER...]

Exit status: 0 when every binary passed, 1 when any failed or timed out, 2 on bad input.
The longest first: each run records the times it saw in --times (a JSON file beside the
build), and the next run starts the binaries that took longest first. On a machine with
no times yet, --baseline (committed) gives the order.
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
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


class InputError(Exception):
    """A bad argument or a build listing that cannot be read."""


@dataclass
class Binary:
    """One test binary of the build."""

    name: str  # as cargo prints it: "tests/kafka_share.rs", "unittests src/lib.rs (shareflow)"
    key: str  # stable across builds: package, kind and target name
    path: str
    package_dir: str
    package_name: str
    env: dict = field(default_factory=dict)


@dataclass
class Outcome:
    """How one binary's run ended."""

    binary: Binary
    seconds: float
    code: int | None  # None: stopped at the time limit
    output: str
    passed: int = 0
    failed: int = 0

    @property
    def ok(self) -> bool:
        return self.code == 0


def parse_built(text: str, source: str) -> list[Binary]:
    """The test executables in cargo's JSON messages (one JSON object per line)."""
    binaries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line.startswith("{"):
            continue  # cargo's plain text, if any
        try:
            message = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{source}:{number}: not JSON ({e}); pass the output of --message-format=json") from None
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message.get("profile", {}).get("test"):
            continue  # a binary built for a test to run (CARGO_BIN_EXE_*), not a test
        target = message["target"]
        if target["kind"][0] in ("bench", "example"):
            continue  # built to be linted and kept building; `cargo bench` runs the benches
        manifest = Path(message["manifest_path"])
        package = package_name(message["package_id"], manifest)
        kind = target["kind"][0]
        src = os.path.relpath(target["src_path"], manifest.parent)
        name = src if kind == "test" else f"unittests {src} ({package})"
        binaries.append(
            Binary(
                name=name,
                key=f"{package}/{kind}/{target['name']}",
                path=message["executable"],
                package_dir=str(manifest.parent),
                package_name=package,
            )
        )
    if not binaries:
        raise InputError(f"{source}: no test executables in it; build with `cargo test --no-run --message-format=json`")
    return binaries


def package_name(package_id: str, manifest: Path) -> str:
    """The package's name from cargo's package id (`path+file:///dir#name@0.1.0`, or the
    older `name 0.1.0 (path+file:///dir)`)."""
    m = re.search(r"#([A-Za-z0-9_-]+)@", package_id)
    if m:
        return m.group(1)
    m = re.match(r"([A-Za-z0-9_-]+) ", package_id)
    if m:
        return m.group(1)
    return manifest.parent.name  # `path+file:///dir/name#0.1.0`: the directory is the name


def counts(output: str) -> tuple[int, int]:
    """Passed and failed tests from libtest's `test result:` lines."""
    passed = failed = 0
    for m in re.finditer(r"test result: \w+\. (\d+) passed; (\d+) failed", output):
        passed += int(m.group(1))
        failed += int(m.group(2))
    return passed, failed


def order(binaries: list[Binary], times: dict[str, float]) -> list[Binary]:
    """Longest first by the last recorded times; binaries never timed go first (they may
    be long)."""
    return sorted(binaries, key=lambda b: -times.get(b.key, float("inf")))


def run_one(binary: Binary, args: list[str], limit: float, stop: threading.Event) -> Outcome:
    env = dict(os.environ)
    env.update(
        CARGO_MANIFEST_DIR=binary.package_dir,
        CARGO_PKG_NAME=binary.package_name,
        CARGO_CRATE_NAME=binary.package_name.replace("-", "_"),
    )
    start = time.monotonic()
    with tempfile.TemporaryFile(mode="w+b") as out:
        # A session of its own: a time limit stops the binary and every process it started.
        proc = subprocess.Popen(
            [binary.path, *args],
            cwd=binary.package_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        code = None
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stop.is_set() or time.monotonic() - start > limit:
                    kill_group(proc)
                    break
        out.seek(0)
        output = out.read().decode("utf-8", errors="replace")
    seconds = time.monotonic() - start
    if code is None and not stop.is_set():
        output += f"\n[run_tests] {binary.name}: stopped after the time limit of {limit:.0f} s\n"
    passed, failed = counts(output)
    return Outcome(binary, seconds, code, output, passed, failed)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the binary's process group, then SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_all(binaries: list[Binary], args: list[str], jobs: int, limit: float, report) -> list[Outcome]:
    queue = list(binaries)
    lock = threading.Lock()
    stop = threading.Event()
    outcomes: list[Outcome] = []

    def worker():
        while True:
            with lock:
                if not queue or stop.is_set():
                    return
                binary = queue.pop(0)
            outcome = run_one(binary, args, limit, stop)
            with lock:
                outcomes.append(outcome)
                report(outcome)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        raise
    return outcomes


def print_outcome(outcome: Outcome) -> None:
    status = "ok" if outcome.ok else ("TIMEOUT" if outcome.code is None else "FAILED")
    print(
        f"{status:>7} {outcome.seconds:7.1f} s  {outcome.binary.name}: {outcome.passed} passed, {outcome.failed} failed",
        flush=True,
    )
    if not outcome.ok:
        print(f"---- output of {outcome.binary.name} ({outcome.binary.path}) ----")
        print(outcome.output.rstrip())
        print(f"---- end of {outcome.binary.name} ----", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--built", required=True, help="cargo test --no-run --message-format=json output")
    parser.add_argument("--jobs", type=int, default=3, help="binaries run at once (default 3)")
    parser.add_argument("--limit", type=float, default=900, help="seconds one binary may run (default 900)")
    parser.add_argument("--times", help="JSON file of each binary's last time, read and rewritten")
    parser.add_argument("--baseline", help="JSON file of times to order by where --times has none (a fresh machine)")
    parser.add_argument("args", nargs="*", help="arguments for every binary (a test name filter)")
    ns = parser.parse_args(argv)
    if ns.jobs < 1:
        raise InputError(f"--jobs {ns.jobs}: needs at least 1")
    try:
        text = Path(ns.built).read_text()
    except OSError as e:
        raise InputError(f"cannot read {ns.built}: {e.strerror}") from None
    binaries = parse_built(text, ns.built)
    times: dict[str, float] = {}
    for source in (ns.baseline, ns.times):
        if source and Path(source).exists():
            try:
                times.update({k: float(v) for k, v in json.loads(Path(source).read_text()).items()})
            except (ValueError, AttributeError):
                print(f"[run_tests] ignoring {source}: not a JSON object of times", file=sys.stderr)
    start = time.monotonic()
    outcomes = run_all(order(binaries, times), ns.args, ns.jobs, ns.limit, print_outcome)
    wall = time.monotonic() - start
    if ns.times:
        times.update({o.binary.key: round(o.seconds, 1) for o in outcomes if o.ok})
        tmp = Path(ns.times + ".partial")
        tmp.write_text(json.dumps(times, indent=1, sort_keys=True))
        tmp.replace(ns.times)
    failed = [o for o in outcomes if not o.ok]
    passed = sum(o.passed for o in outcomes)
    busy = sum(o.seconds for o in outcomes)
    print(
        f"\n{len(outcomes)} test binaries, {passed} tests passed, {sum(o.failed for o in outcomes)} failed; "
        f"{wall:.0f} s wall, {busy:.0f} s of binaries' time, {ns.jobs} at once"
    )
    if failed:
        print("failed: " + ", ".join(o.binary.name for o in failed))
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except InputError as e:
        print(f"[run_tests] error: {e}", file=sys.stderr)
        sys.exit(2)
