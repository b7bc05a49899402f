"""Sizes of the library code: no file over 800 lines, no function over 100 lines.

Issue 43's rule (decision 0032). A function that only lists cases (a table, a match of
one-line arms) may be longer: mark it with a `// sizes: table` comment on the line
above its `fn`, so that each exception is a visible choice.

Usage: scripts/sizes [--list]   (--list prints the 20 longest functions)
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Library code: every crate's src/, the root crate's too (its binary is split by
# command). Tests, benches and examples are not library code.
LIBRARY_DIRS = [
    "checkpoint/src",
    "runtime/src",
    "connector/src",
    "connector/share/src",
    "connector/broker/src",
    "model/src",
    "src",
]
MAX_FILE_LINES = 800
MAX_FN_LINES = 100
TABLE_MARK = "// sizes: table"

FN_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"C\"\s+)?fn\s+(\w+)")


@dataclass
class Function:
    """One function: where it starts and how many lines it spans."""

    path: str
    line: int
    name: str
    lines: int
    table: bool


def strip_code(text: str) -> list[str]:
    """The text with comments, strings and char literals blanked, line by line, so
    that braces inside them do not count."""
    i, n = 0, len(text)
    buf = []
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        buf.append("\n")
                    i += 1
            continue
        m = re.match(r'b?r(#*)"', text[i:]) if c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if m:
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            buf.append("\n" * text.count("\n", i, j))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            buf.append("\n" * text.count("\n", i, j + 1))
            i = j + 1
            continue
        if c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            if m:
                i += m.end()
                continue
        buf.append(c)
        i += 1
    return "".join(buf).split("\n")


def functions(path: str) -> list[Function]:
    """Every `fn` with a body in a file, with its length in lines."""
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    raw_lines = raw.split("\n")
    code = strip_code(raw)
    found = []
    for start, line in enumerate(code):
        m = FN_RE.match(line)
        if not m:
            continue
        depth, opened, end = 0, False, None
        for k in range(start, len(code)):
            for ch in code[k]:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
                elif ch == ";" and not opened and depth == 0:
                    end = -1  # a declaration without a body
                    break
                if opened and depth == 0:
                    end = k
                    break
            if end is not None:
                break
        if end is None or end < 0:
            continue
        table = start > 0 and raw_lines[start - 1].strip().startswith(TABLE_MARK)
        # Attributes and doc comments between the mark and the fn.
        k = start - 1
        while not table and k >= 0 and raw_lines[k].strip().startswith(("#[", "///")):
            k -= 1
            table = k >= 0 and raw_lines[k].strip().startswith(TABLE_MARK)
        found.append(Function(os.path.relpath(path, ROOT), start + 1, m.group(1), end - start + 1, table))
    return found


def library_files() -> list[str]:
    """The .rs files of the library code."""
    files = []
    for d in LIBRARY_DIRS:
        for dirpath, _, names in os.walk(os.path.join(ROOT, d)):
            files += [os.path.join(dirpath, n) for n in names if n.endswith(".rs")]
    return sorted(files)


def main(argv: list[str]) -> int:
    problems = []
    every = []
    for path in library_files():
        with open(path, encoding="utf-8") as f:
            count = sum(1 for _ in f)
        if count > MAX_FILE_LINES:
            problems.append(f"{os.path.relpath(path, ROOT)}: {count} lines (at most {MAX_FILE_LINES}): split it by responsibility")
        for fn in functions(path):
            every.append(fn)
            if fn.lines > MAX_FN_LINES and not fn.table:
                problems.append(
                    f"{fn.path}:{fn.line}: fn {fn.name} is {fn.lines} lines (at most {MAX_FN_LINES}): split it, "
                    f"or mark a table or a match that only lists cases with `{TABLE_MARK}` above it"
                )
    if "--list" in argv:
        for fn in sorted(every, key=lambda f: -f.lines)[:20]:
            print(f"{fn.lines:5} {fn.path}:{fn.line} {fn.name}{' (table)' if fn.table else ''}")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"sizes: {len(problems)} over the limits", file=sys.stderr)
        return 1
    print(f"sizes: {len(every)} functions in {len(library_files())} files, all within the limits")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
