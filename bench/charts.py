"""Draw the charts of ``docs/benchmarks.md`` from what a benchmark run wrote, never from typed-in numbers.

    python bench/run.py --only shapes --shapes "8 partitions, 1,024" --curve-shape none \\
        --json docs/benchmarks-data/shapes.json
    python bench/charts.py                       # every chart, from docs/benchmarks-data/
    python bench/charts.py --data DIR --out DIR

Charts, each from the newest run in the data folder that holds its scenario's results:

* ``shapes-rows.png``: rows/s of the connector's reads against the raw protocol loops on the same data and Spark's
  no-I/O Python source (what Spark itself moves from any Python source), from ``shapes``;
* ``shapes-server-cpu.png``: nats-server CPU per message for each read and raw loop, from ``shapes``;
* ``chaos-timeline.png``: each query's committed end seq over time with every fault's span shaded, from ``chaos``.

Each chart's title names the run's date, machine and 1-minute load average, as the JSON recorded them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after matplotlib.use: the backend is chosen first

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "benchmarks-data"
OUT = ROOT / "docs" / "img"

CONNECTOR, RAW, NOIO = "#1f6feb", "#8c959f", "#d97706"
"""Bar colours: the connector's reads, raw protocol loops, Spark's no-I/O source."""

Run = dict[str, Any]


def newest_with(data: Path, scenario: str) -> tuple[Path, Run] | None:
    """The newest run (by its start time) under ``data`` that holds ``scenario``'s results."""
    runs = []
    for path in sorted(data.glob("*.json")):
        run = json.loads(path.read_text())
        if run.get("results", {}).get(scenario):
            runs.append((run["started"], path, run))
    if not runs:
        return None
    _, path, run = max(runs)
    return path, run


def caption(run: Run, others: float | None = None) -> str:
    """When, on what and under which load the run was measured (``others``: the largest share of the CPU other
    processes used during a charted measurement), on two lines."""
    machine, load = run["machine"], run["load_1min"]
    busy = "" if others is None else f"; other processes took up to {others:.0%} of the CPU in a measurement"
    return (
        f"{run['started'][:16].replace('T', ' ')} UTC, commit {run['commit'] or '?'}, {machine['cores']} cores "
        f"({machine['cpu'] or 'unknown CPU'}), {run['master']}\n"
        f"1-minute load {load['min']:.1f}-{load['max']:.1f}{busy}"
    )


def others_share(results: list[dict[str, Any]]) -> float | None:
    shares = [r["other_cpu_share"] for r in results if r.get("other_cpu_share") is not None]
    return max(shares) if shares else None


def kind(read: str) -> str:
    if read.startswith("Spark no-I/O"):
        return "noio"
    if read.startswith("raw "):
        return "raw"
    return "connector"


def bars(
    rows: list[tuple[str, float, str]],
    xlabel: str,
    title: str,
    subtitle: str,
    out: Path,
    fmt: Callable[[float], str],
) -> None:
    """A horizontal bar chart, one bar per (label, value, kind), top to bottom in the given order."""
    colour = {"connector": CONNECTOR, "raw": RAW, "noio": NOIO}
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(rows) + 2.0), dpi=100)
    labels = [label for label, _, _ in rows]
    values = [value for _, value, _ in rows]
    positions = range(len(rows))
    ax.barh(positions, values, color=[colour[k] for _, _, k in rows])
    ax.set_yticks(list(positions), labels, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    for y, value in zip(positions, values, strict=True):
        ax.text(value, y, " " + fmt(value), va="center", fontsize=8)
    ax.set_xlim(0, max(values) * 1.18)
    ax.set_title(f"{title}\n{subtitle}", fontsize=8.5, loc="left")
    names = {"connector": "spark-jetstream", "raw": "raw protocol loop", "noio": "Spark, no-I/O source"}
    shown = [k for k in names if any(k == row_kind for _, _, row_kind in rows)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[k]) for k in shown]
    fig.legend(handles, [names[k] for k in shown], fontsize=8, loc="lower center", ncol=3, frameon=False)
    ax.xaxis.set_major_formatter(lambda value, _: f"{value:,.0f}" if value >= 10 else f"{value:g}")
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout(rect=(0, 0.5 / fig.get_figheight(), 1, 1))
    fig.savefig(out, metadata={"Software": None})
    plt.close(fig)
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


def shape_rows(run: Run) -> tuple[str, list[dict[str, Any]]]:
    """The first stream shape of a ``shapes`` run, with Spark's no-I/O rows: the reads one chart compares."""
    results = run["results"]["shapes"]
    shape = next(r["shape"] for r in results if r["shape"] != "-")
    return shape, [r for r in results if r["shape"] in (shape, "-")]


ROWS_READS = (
    "streaming default",
    "streaming readMode=pull",
    "streaming preservePartitionOrder=false",
    "streaming minPartitions=8",
    "batch default",
    "batch minPartitions=8",
)
"""The connector's reads the rows chart shows beside the baselines (the server CPU chart shows every read)."""


def shapes_rows(run: Run, out: Path) -> None:
    shape, results = shape_rows(run)
    results = [r for r in results if kind(r["read"]) != "connector" or r["read"] in ROWS_READS]
    rows = [(r["read"], r["rows_per_s"], kind(r["read"])) for r in results]
    rows.sort(key=lambda row: ({"noio": 0, "raw": 1, "connector": 2}[row[2]], -row[1]))
    messages = results[0]["messages"]
    bars(
        rows,
        "rows per second (best of 2 runs)",
        f"Reads of {messages:,} x 100 B messages, stream with {shape}, into Spark's noop sink",
        caption(run, others_share(results)),
        out,
        lambda v: f"{v:,.0f}",
    )


def shapes_server_cpu(run: Run, out: Path) -> None:
    shape, results = shape_rows(run)
    rows = [
        (r["read"], r["cpu_seconds"]["nats-server"] / r["messages"] * 1e6, kind(r["read"]))
        for r in results
        if r["cpu_seconds"] and kind(r["read"]) != "noio"  # the no-I/O source asks the server nothing
    ]
    rows.sort(key=lambda row: ({"raw": 0, "connector": 1}[row[2]], row[1]))
    bars(
        rows,
        "nats-server CPU per message read (microseconds)",
        f"The server's work per message by read, stream with {shape}",
        caption(run, others_share(results)),
        out,
        lambda v: f"{v:.2f}",
    )


def chaos_timeline(run: Run, out: Path) -> None:
    """Each query's committed end seq over time, with every fault's span shaded by its kind."""
    chaos = run["results"]["chaos"]
    kinds = sorted({fault["kind"] for fault in chaos["faults"]})
    palette = plt.get_cmap("tab10")
    colour = {k: palette(i % 10) for i, k in enumerate(kinds)}
    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    lanes = max(1, len(kinds))
    for fault in chaos["faults"]:  # a band per kind, so that overlapping faults stay apart
        lane, hue = kinds.index(fault["kind"]), colour[fault["kind"]]
        end = max(fault["end"], fault["start"] + 1.5)  # a step-down lasts a moment: wide enough to see
        ax.axvspan(fault["start"], end, lane / lanes, (lane + 1) / lanes, color=hue, alpha=0.3, linewidth=0)
    styles = ("-", "--", ":")
    for (name, batches), style in zip(sorted(chaos["committed"].items()), styles, strict=False):
        if batches:
            ax.step([t for t, _ in batches], [seq for _, seq in batches], where="post", color="black", linestyle=style,
                    label=f"query {name}: committed end seq")  # fmt: skip
    start, end = chaos["chaos"]
    ax.axvline(end, color="grey", linewidth=0.8)
    ax.set_xlim(0, max([end, *(t for b in chaos["committed"].values() for t, _ in b)]) * 1.02)
    ax.set_xlabel(f"seconds from the run's start (faults from {start:.0f} s to {end:.0f} s)")
    ax.set_ylabel("stream seq committed")
    ax.yaxis.set_major_formatter(lambda value, _: f"{value:,.0f}")
    verdict = "every message exactly once" if chaos["passed"] else "checks failed"
    ax.set_title(f"Two streaming queries through {len(chaos['faults'])} faults ({verdict})\n{caption(run)}",
                 fontsize=8.5, loc="left")  # fmt: skip
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[k], alpha=0.4) for k in kinds]
    lines, names = ax.get_legend_handles_labels()
    fig.legend([*lines, *handles], [*names, *kinds], fontsize=7.5, loc="lower center", ncol=4, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout(rect=(0, (0.35 + 0.2 * ((len(kinds) + len(lines)) // 4)) / fig.get_figheight(), 1, 1))
    fig.savefig(out, metadata={"Software": None})
    plt.close(fig)
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


CHARTS: dict[str, tuple[str, Callable[[Run, Path], None]]] = {
    "shapes-rows.png": ("shapes", shapes_rows),
    "shapes-server-cpu.png": ("shapes", shapes_server_cpu),
    "chaos-timeline.png": ("chaos", chaos_timeline),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder of the runs' JSON (docs/benchmarks-data)")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the PNG files (docs/img)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    missing = []
    for name, (scenario, draw) in CHARTS.items():
        found = newest_with(args.data, scenario)
        if found is None:
            missing.append(f"{name}: no run with '{scenario}' results in {args.data}")
            continue
        draw(found[1], args.out / name)
    for line in missing:
        print(line, file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
