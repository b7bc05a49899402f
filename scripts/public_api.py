"""The public surface of the library crates, listed, so that a new public item is a
visible choice (issue 43, decision 0035).

Every library crate denies the `unreachable_pub` lint, so an item declared `pub` is
reachable from outside its crate; this script lists each such declaration (its first
line, whitespace collapsed) under its file, and `docs/public-api.txt` holds the list.
`--check` fails when the code and the list differ, and prints the difference: add or
remove the item on purpose, then run `scripts/public-api` to write the list again.

Usage: scripts/public-api [--check]
"""

from __future__ import annotations

import difflib
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sizes  # noqa: E402  (strip_code: comments and strings blanked)

ROOT = sizes.ROOT
LISTING = os.path.join(ROOT, "docs", "public-api.txt")
# The library crates whose surface an embedding program sees (the model is a test tool).
CRATES = ["checkpoint/src", "runtime/src", "connector/share/src", "connector/broker/src", "connector/src", "src"]
# Files of the root crate's binary: not library code.
BINARY = re.compile(r"^src/(main\.rs|cli/|demo|kafka_demo|kafka_instances|kafka_run|embedded_run|job_file|admin|progress|run_options)")
PUB = re.compile(r"^\s*pub\s")
TEST_MOD = re.compile(r"^\s*#\[cfg\(test\)\]")


def declarations(path: str) -> list[str]:
    """The first line of every `pub` declaration in a file, outside `#[cfg(test)]` items."""
    with open(path, encoding="utf-8") as f:
        raw = f.read().split("\n")
    code = sizes.strip_code("\n".join(raw))
    out = []
    skip_depth = None  # brace depth at which a #[cfg(test)] item ends
    depth = 0
    pending_test = False
    for i, line in enumerate(code):
        if skip_depth is None and TEST_MOD.match(raw[i]):
            pending_test = True
        elif skip_depth is None and PUB.match(line) and not pending_test:
            out.append(" ".join(raw[i].split()))
        for ch in line:
            if ch == "{":
                if pending_test and skip_depth is None:
                    skip_depth, pending_test = depth, False
                depth += 1
            elif ch == "}":
                depth -= 1
                if skip_depth is not None and depth == skip_depth:
                    skip_depth = None
        if pending_test and line.strip().endswith(";") and not line.strip().startswith("#"):
            pending_test = False  # a #[cfg(test)] use or mod declaration
    return out


def listing() -> str:
    """The whole listing, file by file."""
    lines = []
    for crate in CRATES:
        for dirpath, _, names in sorted(os.walk(os.path.join(ROOT, crate))):
            for name in sorted(n for n in names if n.endswith(".rs")):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, ROOT)
                if crate == "src" and BINARY.match(rel):
                    continue
                found = declarations(path)
                if found:
                    lines.append(f"## {rel}")
                    lines += found
    return "# The public surface of the library crates: scripts/public-api writes it, ./scripts/test checks it.\n" + "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    now = listing()
    if "--check" in argv:
        try:
            with open(LISTING, encoding="utf-8") as f:
                kept = f.read()
        except FileNotFoundError:
            print(f"public-api: {LISTING} is missing: run scripts/public-api", file=sys.stderr)
            return 1
        if kept != now:
            diff = difflib.unified_diff(kept.splitlines(), now.splitlines(), "docs/public-api.txt", "the code", lineterm="")
            print("\n".join(diff), file=sys.stderr)
            print(
                "public-api: the public surface changed: if that is meant, run scripts/public-api and commit "
                "docs/public-api.txt; if not, make the item pub(crate)",
                file=sys.stderr,
            )
            return 1
        print(f"public-api: {sum(1 for l in now.splitlines() if not l.startswith('#'))} public declarations, as listed")
        return 0
    with open(LISTING, "w", encoding="utf-8") as f:
        f.write(now)
    print(f"public-api: wrote {LISTING}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
