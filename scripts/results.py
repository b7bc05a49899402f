"""The results files the benches write: docs/results/<bench>.jsonl, a first line
{"kind": "run", ...} saying what ran, then one JSON object per measurement.

Read by scripts/plots.py (the charts) and scripts/bench_summary.py (the figures). Standard
library only, so the summary runs wherever python3 does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path


class ResultsError(Exception):
    """A results file that cannot be read, charted or summarised; the message names the file and line."""


@dataclass
class Run:
    """One bench run: its header line and its measurements."""

    path: Path
    header: dict
    rows: list[dict]

    def of(self, kind: str) -> list[dict]:
        return [r for r in self.rows if r.get("kind") == kind]

    def when(self) -> str:
        started = self.header.get("started_unix_s")
        if not isinstance(started, (int, float)):
            return "unknown date"
        return datetime.fromtimestamp(started, tz=timezone.utc).strftime("%Y-%m-%d")

    def need(self, row: dict, *keys: str) -> list:
        return need(self.path, row, *keys)


def need(path: Path, row: dict, *keys: str) -> list:
    """The values of `keys` in one measurement line; a missing key names the line."""
    missing = [k for k in keys if k not in row]
    if missing:
        raise ResultsError(f"{path}:{row['_line']}: a {row.get('kind')!r} line lacks {', '.join(missing)}; "
                           f"run its bench again to rewrite the file")
    return [row[k] for k in keys]


def load(path: Path) -> Run:
    """Reads one results file, refusing anything that is not the format above."""
    header, rows = None, []
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise ResultsError(f"{path}:{number}: not JSON ({e.msg}); run its bench again to rewrite the file")
            if not isinstance(row, dict) or not isinstance(row.get("kind"), str):
                raise ResultsError(f"{path}:{number}: expected an object with a \"kind\"")
            row["_line"] = number
            if header is None:
                if row["kind"] != "run":
                    raise ResultsError(f"{path}:{number}: the first line must be the run header (kind \"run\")")
                header = row
            else:
                rows.append(row)
    if header is None:
        raise ResultsError(f"{path}: empty; run its bench to fill it")
    return Run(path, header, rows)
