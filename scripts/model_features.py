#!/usr/bin/env python3
"""Checks that the model's workspace (model/), and the build without the `kafka`
feature, build every shared dependency with the features the root workspace's test
build gives it, so one target dir holds one artifact of each and `./scripts/test`
compiles arrow, DataFusion and tokio once, not three times.

    scripts/model-features        # exit 1 and a list of differences if any

Compares `cargo tree -e normal,build,dev` of both workspaces (the root's `--workspace`,
as `cargo test --workspace` builds it). shareflow's own crates differ by design (the
model's `model` feature, the root's `kafka`) and are skipped. A difference is fixed in
model/Cargo.toml's dev-dependencies (a feature the model lacks) or the root's (one only
the model has).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"(\S+) (v\S+)(?: \(([^)]*)\))?(?: (.*))?$")


def features(args: list[str], cwd: Path) -> dict[tuple[str, str], set[str]]:
    cmd = ["cargo", "tree", "-e", "normal,build,dev", "-f", "{p} {f}", "--prefix", "none", "--locked", *args]
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"[model-features] error: {' '.join(cmd)} in {cwd} failed: {out.stderr.strip()[-2000:]}")
    result: dict[tuple[str, str], set[str]] = {}
    for line in out.stdout.splitlines():
        line = line.replace(" (*)", "").replace(" (proc-macro)", "").strip()
        m = LINE.match(line)
        if not m:
            continue
        name, version, _path, feats = m.groups()
        feats = (feats or "").replace("[build-dependencies]", "").replace("[dev-dependencies]", "").strip()
        result.setdefault((name, version), set()).update(f for f in feats.split(",") if f)
    return result


def compare(root: dict, other: dict, what: str) -> int:
    differences = []
    for key in sorted(set(root) & set(other)):
        if key[0].startswith("shareflow"):
            continue
        if root[key] != other[key]:
            differences.append(
                f"{key[0]} {key[1]}: only the test build has {sorted(root[key] - other[key])}, "
                f"only {what} has {sorted(other[key] - root[key])}"
            )
    if differences:
        print(f"[model-features] {what} builds these shared dependencies differently from the test build:")
        for d in differences:
            print(f"  {d}")
        return 1
    print(f"[model-features] {what}: {len(set(root) & set(other))} shared packages, the same features")
    return 0


def main() -> int:
    root = features(["--workspace"], ROOT)
    failed = compare(root, features([], ROOT / "model"), "the model's workspace")
    # scripts/test builds the binary without the kafka feature through a test target,
    # so that it has the test build's dev-dependencies too.
    failed |= compare(root, features(["--workspace", "--no-default-features"], ROOT), "the build without kafka")
    return failed


if __name__ == "__main__":
    sys.exit(main())
