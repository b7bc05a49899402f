"""Charts of shareflow's benchmark results. Run through scripts/plots, which provides the
pinned matplotlib.

Each bench writes docs/results/<bench>.jsonl: a first line {"kind": "run", ...} saying what
ran, then one JSON object per measurement. Each chart below reads one such file and
writes one PNG whose caption names the command that produced the data.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from results import ResultsError, Run, load

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def caption(fig, run: Run, command: str) -> None:
    fig.text(0.01, 0.01, f"{command}  ({run.header.get('profile', '?')} build, "
             f"{run.header.get('cores', '?')} cores, {run.when()})", fontsize=8, color="#555555")


def eos_throughput(run: Run, out: Path) -> Path:
    """Throughput of the demo pipeline against the checkpoint interval, both modes: at
    full speed (until the sink had every record), where the results have it, and to the
    end (until the last checkpoint committed)."""
    by_interval: dict[int, dict[str, list[float]]] = {}
    for row in run.of("throughput"):
        interval, eos, alo = run.need(row, "interval_ms", "exactly_once", "at_least_once")
        point = by_interval.setdefault(int(interval), {"eos": [], "alo": [], "eos_full": [], "alo_full": []})
        point["eos"].append(float(eos))
        point["alo"].append(float(alo))
        if "exactly_once_processed" in row:
            eos_full, alo_full = run.need(row, "exactly_once_processed", "at_least_once_processed")
            point["eos_full"].append(float(eos_full))
            point["alo_full"].append(float(alo_full))
    if not by_interval:
        raise ResultsError(f"{run.path}: no throughput lines")
    intervals = sorted(by_interval)
    full = all(by_interval[i]["eos_full"] for i in intervals)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label, colour in (("eos", "exactly-once (transactional ack)", "#1f77b4"),
                               ("alo", "at-least-once (explicit ack)", "#d62728")):
        # Full speed solid with its runs as dots; the rate to the end dashed.
        series = [(f"{key}_full", "at full speed", "-", True), (key, "to the end", "--", False)] if full else \
            [(key, "to the end", "-", True)]
        for k, how, style, dots in series:
            medians = [statistics.median(by_interval[i][k]) / 1e6 for i in intervals]
            ax.plot(intervals, medians, marker="o", linestyle=style, color=colour, label=f"{label}, {how}, median")
            for i in intervals if dots else ():
                values = [v / 1e6 for v in by_interval[i][k]]
                ax.scatter([i] * len(values), values, color=colour, alpha=0.35, s=14)
    ax.set_xscale("log")
    ax.set_xticks(intervals, [f"{i / 1000:g} s" if i >= 1000 else f"{i} ms" for i in intervals])
    ax.set_xlabel("checkpoint interval")
    ax.set_ylabel("records per second (millions)")
    ax.set_ylim(bottom=0)
    ax.set_title("Demo pipeline throughput, embedded broker")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    caption(fig, run, "cargo bench --bench eos_cost")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return save(fig, out / "eos_throughput.png")


def commit_latency(run: Run, out: Path) -> Path:
    """Checkpoint commit latency percentiles next to one raw PUT of the manifest."""
    groups = []
    # A configuration measured in several runs is charted as the element-wise median of
    # its runs' quantiles.
    by_config: dict[tuple, list] = {}
    for row in run.of("latency"):
        store, state, quantiles, raw, commit, layout = run.need(
            row, "store", "state_bytes", "quantiles", "raw_put_ms", "commit_ms", "layout")
        if not (len(quantiles) == len(raw) == len(commit)):
            raise ResultsError(f"{run.path}:{row['_line']}: quantiles, raw_put_ms and commit_ms differ in length")
        by_config.setdefault((store, int(state), row.get("subtasks", "?"), layout, tuple(quantiles)), []).append(
            (raw, commit))
    for (store, state, subtasks, layout, quantiles), runs in by_config.items():
        raw = [statistics.median(r[0][i] for r in runs) for i in range(len(quantiles))]
        commit = [statistics.median(r[1][i] for r in runs) for i in range(len(quantiles))]
        label = (f"{store}\n{state // 1024} KiB state x {subtasks}, {layout}"
                 + (f"\nmedian of {len(runs)} runs" if len(runs) > 1 else ""))
        groups.append((label, list(quantiles), raw, commit))
    if not groups:
        raise ResultsError(f"{run.path}: no latency lines")
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 4.2), squeeze=False)
    for ax, (title, quantiles, raw, commit) in zip(axes[0], groups):
        xs = range(len(quantiles))
        width = 0.38
        ax.bar([x - width / 2 for x in xs], raw, width, label="raw manifest PUT", color="#999999")
        ax.bar([x + width / 2 for x in xs], commit, width, label="checkpoint commit", color="#1f77b4")
        ax.set_xticks(list(xs), [f"p{q * 100:g}" for q in quantiles])
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("milliseconds")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Checkpoint commit latency (state the manifest does not inline in the shared state object, "
                 "then the manifest with PutMode::Create)", fontsize=10)
    caption(fig, run, "cargo bench --bench checkpoint_commit")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return save(fig, out / "commit_latency.png")


def soak(run: Run, out: Path) -> Path:
    """Memory, snapshot size and log bytes over a long run with retention."""
    samples = run.of("sample")
    if not samples:
        raise ResultsError(f"{run.path}: no sample lines")
    cols = {k: [] for k in ("secs", "records_per_second", "rss_mib", "snapshot_kib", "log_mib")}
    for row in samples:
        for key, value in zip(cols, run.need(row, *cols)):
            cols[key].append(float(value))
    minutes = [s / 60 for s in cols["secs"]]
    retention_min = float(run.header.get("args", {}).get("retention_s", 0)) / 60
    fig, axes = plt.subplots(2, 2, figsize=(9, 6), sharex=True)
    panels = (
        (axes[0][0], [v / 1e3 for v in cols["records_per_second"]], "committed records/s (thousands)"),
        (axes[0][1], cols["rss_mib"], "resident memory (MiB)"),
        (axes[1][0], [v / 1024 for v in cols["snapshot_kib"]], "newest broker snapshot (MiB)"),
        (axes[1][1], cols["log_mib"], "bytes held by the topic logs (MiB)"),
    )
    for ax, values, label in panels:
        ax.plot(minutes, values, color="#1f77b4")
        ax.set_title(label, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if retention_min > 0:
            ax.axvline(retention_min, color="#d62728", linestyle="--", linewidth=1)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    axes[0][1].text(retention_min, 0, " retention", color="#d62728", fontsize=8, va="bottom")
    args = run.header.get("args", {})
    fig.suptitle(f"Soak: exactly-once pipeline at full rate, {args.get('minutes', '?')} min, "
                 f"retention {args.get('retention_s', '?')} s", fontsize=10)
    caption(fig, run, f"cargo bench --bench broker_soak -- {args.get('minutes', 30):g} {args.get('retention_s', 60)}")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return save(fig, out / "soak.png")


def fleet(run: Run, out: Path) -> Path:
    """Three churning instances on Kafka: rate, latency, memory per instance, and what the
    group leaves on the broker (transactional ids, topics, ledger and intents bytes)."""
    samples = run.of("sample")
    if not samples:
        raise ResultsError(f"{run.path}: no sample lines")
    keys = ("secs", "records_per_second", "latency_p50_ms", "latency_p99_ms", "rss_mib", "txn_ids", "topics",
            "ledger_mib", "intents_mib")
    cols = {k: [] for k in keys}
    for row in samples:
        for key, value in zip(keys, run.need(row, *keys)):
            cols[key].append(value)
    minutes = [s / 60 for s in cols["secs"]]
    events = run.of("event")
    fig, axes = plt.subplots(2, 3, figsize=(12, 6), sharex=True)
    ax = axes[0][0]
    ax.plot(minutes, [v / 1e3 for v in cols["records_per_second"]], color="#1f77b4")
    ax.set_title("committed records/s (thousands, 10 s windows)", fontsize=9)
    ax = axes[0][1]
    ax.plot(minutes, [v / 1e3 for v in cols["latency_p99_ms"]], color="#d62728", label="p99")
    ax.plot(minutes, [v / 1e3 for v in cols["latency_p50_ms"]], color="#1f77b4", label="p50")
    ax.set_title("end-to-end latency, produce to read_committed (s)", fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[0][2]
    for slot in range(len(cols["rss_mib"][0])):
        ax.plot(minutes, [r[slot] if slot < len(r) else 0 for r in cols["rss_mib"]], label=f"slot {slot}")
    ax.set_title("resident memory per instance slot (MiB)", fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[1][0]
    ax.plot(minutes, cols["txn_ids"], color="#9467bd")
    ax.set_title("transactional ids of the group at the broker", fontsize=9)
    ax = axes[1][1]
    ax.plot(minutes, cols["topics"], color="#8c564b")
    ax.set_title("topics of the group (input, output, intents, ledgers)", fontsize=9)
    ax = axes[1][2]
    ax.plot(minutes, cols["ledger_mib"], label="ledger topics")
    ax.plot(minutes, cols["intents_mib"], label="intents topic")
    ax.set_title("ledger and intents bytes on the broker's disk (MiB)", fontsize=9)
    ax.legend(fontsize=8)
    for row in axes:
        for ax in row:
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            for e in events:
                style = {"replaced": ("#ff7f0e", "-", 0.7), "sigkill": ("#7f7f7f", ":", 0.5)}.get(e.get("event"))
                if style:
                    ax.axvline(float(e.get("secs", 0)) / 60, color=style[0], linestyle=style[1], linewidth=0.8,
                               alpha=style[2])
    for ax in axes[1]:
        ax.set_xlabel("minutes", fontsize=8)
    args = run.header.get("args", {})
    fig.suptitle(f"Fleet soak: 3 instances on Kafka and S3, {args.get('minutes', '?')} min at "
                 f"{args.get('rate', '?')} records/s\ndotted: a SIGKILL and restart (every 60 s); orange: an instance replaced by a "
                 f"new name (every 5 min)", fontsize=10)
    caption(fig, run, f"cargo bench --bench kafka_fleet_soak -- {args.get('minutes', 30):g} {args.get('rate', 5000)}")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return save(fig, out / "fleet.png")


def save(fig, path: Path) -> Path:
    # No software/date metadata: the same results give the same bytes.
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


CHARTS = {
    "eos_cost": (eos_throughput, "cargo bench --bench eos_cost"),
    "checkpoint_commit": (commit_latency, "cargo bench --bench checkpoint_commit"),
    "broker_soak": (soak, "cargo bench --bench broker_soak"),
    "kafka_fleet_soak": (fleet, "cargo bench --bench kafka_fleet_soak"),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/plots", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"), help="where the benches wrote *.jsonl")
    parser.add_argument("--out", type=Path, default=Path("docs/plots"), help="where the PNGs go")
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        print(f"scripts/plots: error: results directory {args.results} does not exist; "
              f"run a bench (e.g. cargo bench --bench eos_cost) or pass --results DIR", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    made, failed = 0, 0
    for bench, (chart, command) in CHARTS.items():
        path = args.results / f"{bench}.jsonl"
        if not path.exists():
            print(f"scripts/plots: {path} is missing, so no chart from it; `{command}` writes it")
            continue
        try:
            written = chart(load(path), args.out)
        except ResultsError as e:
            print(f"scripts/plots: error: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"scripts/plots: {written} (from {path})")
        made += 1
    if failed or made == 0:
        if made == 0 and not failed:
            print(f"scripts/plots: error: no results in {args.results}; run the benches first", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
