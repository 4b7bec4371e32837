"""Writing a trade-off sweep: a Markdown table, CSV, JSON, and a PNG of wall time against peak memory."""
from __future__ import annotations

import csv
import json
import math
import textwrap
from dataclasses import asdict, fields

from .tradeoff import Row

__all__ = ["markdown", "write_csv", "write_json", "plot"]

_COLUMNS = [  # (header, formatter of a row)
    ("schedule", lambda r: r.config),
    ("RAM snaps", lambda r: "all" if r.kind == "storeall" else str(r.ram_snapshots)),
    ("disk snaps", lambda r: str(r.disk_snapshots) if r.kind == "multilevel" else "-"),
    ("forward steps", lambda r: f"{r.forward_steps:,}" + ("" if r.forward_steps == r.schedule_forward_steps
                                                          else f" (schedule: {r.schedule_forward_steps:,})")),
    ("disk w/r", lambda r: f"{r.disk_writes}/{r.disk_reads}" if r.kind == "multilevel" else "-"),
    ("peak MiB", lambda r: f"{r.peak_mib:.2f}"),
    ("RSS growth MiB", lambda r: "-" if r.rss_growth_mib is None else f"{r.rss_growth_mib:.1f}"),
    ("wall s, fastest (median)", lambda r: f"{r.wall_s:.2f} ({r.wall_median_s:.2f})"),
    ("CPU s", lambda r: f"{r.cpu_s:.2f}"),
    ("theory s", lambda r: f"{r.theory_s:.2f}"),
    ("theory CPU s", lambda r: "-" if math.isnan(r.theory_cpu_s) else f"{r.theory_cpu_s:.2f}"),
    ("theory / fastest, CPU (wall)", lambda r: "-" if math.isnan(r.theory_cpu_s) else
     f"{r.theory_cpu_s / r.cpu_s:.2f} ({r.theory_s / r.wall_s:.2f})"),
    ("slowdown", lambda r: f"{r.slowdown:.2f}x"),
    ("theory slowdown", lambda r: f"{r.theory_slowdown:.2f}x"),
]


def markdown(rows: list[Row], title: str = "") -> str:
    lines = [title, ""] if title else []
    lines.append("| " + " | ".join(h for h, _ in _COLUMNS) + " |")
    lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(_COLUMNS))) + "|")
    lines += ["| " + " | ".join(f(r) for _, f in _COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_csv(rows: list[Row], path: str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(Row)])
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


def write_json(rows: list[Row], meta: dict, path: str) -> None:
    clean = lambda v: None if isinstance(v, float) and math.isnan(v) else v
    with open(path, "w") as f:
        json.dump({**meta, "rows": [{k: clean(v) for k, v in asdict(r).items()} for r in rows]}, f, indent=1)


def plot(rows: list[Row], path: str, title: str, limit_mib: float | None = None) -> str | None:
    """Write the PNG; return None, or the reason it was skipped (matplotlib missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker as ticker
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    styles = {"revolve": ("o", "C0", "Revolve (RAM)"), "multilevel": ("^", "C2", "MultiLevel (RAM + HDF5)"),
              "storeall": ("*", "C3", "store-all")}
    for kind, (marker, color, label) in styles.items():
        group = sorted((r for r in rows if r.kind == kind), key=lambda r: r.peak_mib)
        if not group:
            continue
        x = [r.peak_mib for r in group]
        ax.plot(x, [r.wall_s for r in group], marker=marker, color=color, ms=11 if kind == "storeall" else 6,
                label=f"{label}, measured")
        ax.plot(x, [r.theory_s for r in group], marker="x", ls="--", color=color, alpha=0.6,
                label=f"{label}, theory")
        for r in group:
            if kind != "storeall":
                ax.annotate(f"{r.ram_snapshots}" + (f"+{r.disk_snapshots}" if kind == "multilevel" else ""),
                            (r.peak_mib, r.wall_s), textcoords="offset points", xytext=(4, 4), fontsize=8)
    store = next((r for r in rows if r.kind == "storeall"), None)
    if store is not None:
        ax.axhline(store.wall_s, color="C3", lw=0.8, ls=":")
    if limit_mib is not None:
        ax.axvline(limit_mib, color="k", lw=0.8, ls="-.", label=f"memory limit {limit_mib:g} MiB")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("peak memory (MiB, counted by the stepper)")
    ax.set_ylabel("gradient wall time (s)")
    ax.set_title(textwrap.fill(title, 95), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, title="theory: the paths the schedule's run takes x their unit costs",
              title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
