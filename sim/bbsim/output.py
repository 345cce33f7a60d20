"""Writing results: CSV, JSON, PNG plots and the text tables the CLI prints."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

BINDING_COLORS = {
    "client node cap": "#1b9e77", "client stream cap": "#66a61e", "compute node link": "#a6761d",
    "green": "#d95f02", "black": "#e7298a", "global": "#7570b3", "server link": "#e6ab02",
    "server bandwidth": "#666666", "server IOPS": "#000000",
}


def to_jsonable(value):
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [to_jsonable(v) for v in value.tolist()]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


def dumps(value) -> str:
    return json.dumps(to_jsonable(value), indent=2)


def write_json(path: Path, value) -> None:
    path.write_text(dumps(value) + "\n")


def example_of(point: dict) -> str:
    for entry in point.get("bottlenecks", []):
        if entry["examples"]:
            return entry["examples"][0]["name"]
    return ""


def write_ior_csv(path: Path, points: list) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["variant", "machine", "op", "pattern", "nodes", "ppn", "transfer_bytes", "servers",
                    "gbps", "gbps_per_node", "iops", "binding", "saturated_resources", "example"])
        for p in points:
            first = p["bottlenecks"][0] if p["bottlenecks"] else {}
            w.writerow([p.get("variant", "base"), p["machine"], p["op"], p["pattern"], p["nodes"], p["ppn"],
                        int(p["transfer_size"]), p["servers"], f"{p['gbps']:.4f}", f"{p['gbps_per_node']:.4f}",
                        f"{p['iops']:.0f}", p["binding"], first.get("saturated_resources", 0), example_of(p)])


def plot_ior(path: Path, points: list, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=100)
    series: dict = {}
    for p in points:
        series.setdefault((p.get("variant", "base"), p["op"]), []).append(p)
    variants = list(dict.fromkeys(k[0] for k in series))
    for (variant, op), pts in series.items():
        pts = sorted(pts, key=lambda q: q["nodes"])
        x = [q["nodes"] for q in pts]
        y = [q["gbps"] for q in pts]
        if len(variants) == 1:
            ls, color, label = "-", ("#1f77b4" if op == "write" else "#ff7f0e"), op
        else:
            ls = "-" if op == "write" else "--"
            color = plt.cm.tab10(variants.index(variant) % 10)
            label = f"{variant}, {op}"
        ax.plot(x, y, ls, color=color, lw=1.5, label=label)
        for q in pts:
            ax.plot(q["nodes"], q["gbps"], "o", ms=5, color=BINDING_COLORS.get(q["binding"], "#999999"),
                    markeredgecolor="white", markeredgewidth=0.5)
    seen = list(dict.fromkeys(p["binding"] for p in points))
    for b in seen:
        ax.plot([], [], "o", color=BINDING_COLORS.get(b, "#999999"), label=f"bound by {b}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("compute nodes")
    ax.set_ylabel("aggregate bandwidth (GB/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_timeline(path: Path, timeline: list, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.0), dpi=100)
    names = list(timeline[0][2]) if timeline else []
    for i, name in enumerate(names):
        xs, ys = [], []
        for t0, t1, rates in timeline:
            xs += [t0, t1]
            ys += [rates[name], rates[name]]
        ax.plot(xs, ys, ("-", "--", ":", "-.")[i % 4], lw=2.2 - 0.4 * (i % 3), label=name)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("job bandwidth (GB/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_timeline_csv(path: Path, timeline: list) -> None:
    names = list(timeline[0][2]) if timeline else []
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t_start_s", "t_end_s"] + [f"{n}_gbps" for n in names])
        for t0, t1, rates in timeline:
            w.writerow([f"{t0:.6f}", f"{t1:.6f}"] + [f"{rates[n]:.4f}" for n in names])


def human_size(nbytes: float) -> str:
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= factor:
            return f"{nbytes / factor:.2f} {unit}"
    return f"{nbytes:.0f} B"


def table(rows: list, headers: list, align: str | None = None) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    align = align or "l" * len(headers)

    def fmt(row):
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, align)).rstrip()
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells])
