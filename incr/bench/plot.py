"""``NAME.png``: per increment, incr against recompute, the streaming peer and the floor.

One panel per increment size, time per step on a log axis (the initial load and the
increments differ by orders of magnitude), delete increments shaded, and each panel's title
giving the ratios at the last increment, so the figure reads at a glance.

The iterative benchmarks (``kmeans``, ``pagerank``) get :func:`plot_iterative`: per size, time
per batch (incr against recompute, the iterate moves incr ran written under its points) above
the error against the exact answer per batch (incr's and the recompute's).

``incr bench sharing`` gets :func:`plot_sharing`: the median time per increment against the
number of views, with sharing on and off.

``python -m incr.bench.plot OUT/NAME.csv ...`` redraws ``NAME.png`` next to each CSV.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from incr.bench.results import IncrementRow, read_csv

if TYPE_CHECKING:
    from incr.bench.sharing import Row

QUERIES = {"groupby": "SELECT x, AVG(y) FROM S GROUP BY x",
           "joingroupby": "SELECT X.A, SUM(Y.B) FROM X JOIN Y ON X.C = Y.C GROUP BY X.A"}


def title(label: str, initial: int) -> str:
    """The figure's title: the run, its query and its initial size."""
    workload = label.split("-", 1)[0]
    per = " per stream" if workload == "joingroupby" else ""
    extras = []
    if "-deletes" in label:
        extras.append("every 3rd increment deletes")
    if "-append-only" in label:
        extras.append("streams declared append-only")
    more = "".join(", " + e for e in extras)
    return (f"{label}: {QUERIES.get(workload, workload)}\n"
            f"{initial:,} initial rows{per}{more} — time per step, lower is better")

def _pyplot():
    """Pyplot, drawing to files only (the benchmark machine has no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _log_axis(ax, axis: str = "y") -> None:
    """A log scale on ``ax``'s ``axis`` ticked at 1, 2, 5 × 10^k, in plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    getattr(ax, f"set_{axis}scale")("log")
    scale = getattr(ax, f"{axis}axis")
    scale.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    scale.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    scale.set_minor_formatter(NullFormatter())


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


SERIES = (  # (attribute, label, style)
    ("incremental_s", "incr (incremental)", {"color": "tab:blue", "marker": "o", "lw": 2.2}),
    ("recompute_s", "recompute all data (Spark)", {"color": "tab:red", "marker": "s", "ls": "--"}),
    ("peer_s", "Structured Streaming peer", {"color": "tab:green", "marker": "^", "ls": "-."}),
    ("floor_s", "floor: read + h only", {"color": "tab:gray", "marker": ".", "ls": ":"}),
)


def plot(rows: list[IncrementRow], path: Path, title: str) -> None:
    """Writes the figure for ``rows`` (one run, any number of increment sizes) to ``path``."""
    plt = _pyplot()
    sizes = sorted({r.size for r in rows})
    cols = min(2, len(sizes))
    nrows = (len(sizes) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(max(9.0, 6.4 * cols), 4.2 * nrows + 1.2),
                             squeeze=False, sharey=True)
    for ax in axes.flat[len(sizes):]:
        ax.set_visible(False)
    for ax, size in zip(axes.flat, sizes):
        run = sorted((r for r in rows if r.size == size), key=lambda r: r.increment)
        xs = [r.increment for r in run]
        for attr, label, style in SERIES:
            ys = [getattr(r, attr) for r in run]
            if all(y is None for y in ys):
                continue
            ax.plot(xs, [float("nan") if y is None else y for y in ys], label=label, ms=5,
                    **style)
        for r in run:
            if r.kind == "delete":
                ax.axvspan(r.increment - 0.4, r.increment + 0.4, color="tab:orange", alpha=0.15,
                           lw=0)
        last = run[-1]
        ratios = f"recompute÷incr {last.speedup:.2g}"
        if last.peer_s is not None:
            ratios += f", peer÷incr {last.vs_peer:.2g}"
        ax.set_title(f"increments of {size:,} rows — at increment {last.increment}:\n{ratios} "
                     f"(>1: incr faster); incr÷floor {last.vs_floor:.2g}", fontsize=10)
        _log_axis(ax)
        ax.tick_params(axis="y", labelleft=True)
        ax.set_xticks(xs)
        ax.set_xticklabels(["0\ninitial" if x == 0 else (f"{x}\ndelete" if r.kind == "delete"
                                                       else str(x))
                            for x, r in zip(xs, run)])
        ax.set_xlabel("increment (0 = initial load)")
        ax.set_ylabel("time per step (seconds, log scale)")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _save(fig, path)


# The iterative benchmarks (kmeans, pagerank): per size, time per batch above and the error
# against the exact answer below; (column, label, style) for the left (log) and right axes.
ITERATIVE_ERRORS = {
    "kmeans": (("centroid_shift", "recompute_centroid_shift",
                "largest centroid distance\nto batch k-means (log)"),
               ("inertia_ratio", "recompute_inertia_ratio",
                "inertia ÷ batch k-means' inertia")),
    "pagerank": (("l1_per_node", "recompute_l1_per_node",
                  "L1 distance to exact ranks\nper node (log)"),
                 ("top100_overlap", "recompute_top100_overlap", "top-100 overlap with exact")),
}
FLOOR = 1e-16


def plot_iterative(rows: list[dict], path: Path, title: str) -> None:
    """Writes the figure of an iterative benchmark's CSV rows (any number of sizes)."""
    from matplotlib.ticker import FuncFormatter

    plt = _pyplot()
    name = "kmeans" if str(rows[0]["name"]).startswith("kmeans") else "pagerank"
    unit = "points" if name == "kmeans" else "edges"
    (left, left_rec, left_label), (right, right_rec, right_label) = ITERATIVE_ERRORS[name]
    sizes = sorted({r["size"] for r in rows})
    cols = min(2, len(sizes))
    blocks = (len(sizes) + cols - 1) // cols
    fig, axes = plt.subplots(2 * blocks, cols, figsize=(max(10.0, 6.8 * cols), 7.6 * blocks + 1.0),
                             squeeze=False, gridspec_kw={"height_ratios": [1.15, 1] * blocks})
    for i in range(len(sizes), blocks * cols):
        axes[2 * (i // cols), i % cols].set_visible(False)
        axes[2 * (i // cols) + 1, i % cols].set_visible(False)
    for i, size in enumerate(sizes):
        top, bottom = axes[2 * (i // cols), i % cols], axes[2 * (i // cols) + 1, i % cols]
        run = sorted((r for r in rows if r["size"] == size), key=lambda r: r["batch"])
        xs = [r["batch"] for r in run]
        top.plot(xs, [r["incremental_s"] for r in run], color="tab:blue", marker="o", lw=2.2,
                 ms=5, label="incr (incremental)")
        if any(r["recompute_s"] is not None for r in run):
            top.plot(xs, [_nan(r["recompute_s"]) for r in run], color="tab:red", marker="s",
                     ls="--", ms=5, label="recompute from scratch (same engine, all data)")
        for r in run:
            if r["kind"] == "delete":
                for ax in (top, bottom):
                    ax.axvspan(r["batch"] - 0.4, r["batch"] + 0.4, color="tab:orange",
                               alpha=0.15, lw=0)
        incs = [r for r in run if r["batch"] > 0 and r["speedup"] is not None]
        ratio = ""
        if incs:
            ratio = (f" — recompute÷incr at batch {run[-1]['batch']}: "
                     f"{run[-1]['speedup']:.2g} (>1: incr faster)")
        top.set_title(f"batches of {size:,} {unit}{ratio}", fontsize=10)
        _log_axis(top)
        top.set_ylabel("seconds per batch (log)")
        top.grid(True, which="both", alpha=0.3)
        labels = ["0\ninitial" if r["batch"] == 0 else
                  (f"{r['batch']}\ndelete" if r["kind"] == "delete" else str(r["batch"]))
                  for r in run]
        for ax in (top, bottom):
            ax.set_xticks(xs)
        top.set_xticklabels([f"{lab}\n{r['moves']} mv" for lab, r in zip(labels, run)],
                            fontsize=8.5)
        top.set_xlabel("batch; mv = iterate moves incr ran in the batch", fontsize=9)
        bottom.set_xticklabels(labels)
        # errors
        bottom.plot(xs, [_nan(r[left], FLOOR) for r in run], color="tab:blue", marker="o", lw=2,
                    ms=5, label=f"incr: {left_label.replace(' (log)', '')}".replace("\n", " "))
        if any(r[left_rec] is not None for r in run):
            bottom.plot(xs, [_nan(r[left_rec], FLOOR) for r in run], color="tab:red", marker="s",
                        ls="--", ms=4, label="recompute: same metric")
        bottom.set_yscale("log")
        bottom.set_ylabel(left_label.replace("(log)", "(log; 0 at 1e-16)") if name == "kmeans"
                          else left_label, fontsize=9)
        bottom.set_xlabel("batch (0 = initial load)")
        bottom.grid(True, which="both", alpha=0.3)
        twin = bottom.twinx()
        twin.plot(xs, [_nan(r[right]) for r in run], color="tab:green", marker="^", lw=1.6, ms=6,
                  label=f"incr: {right_label} (right axis)")
        if any(r[right_rec] is not None for r in run):
            twin.plot(xs, [_nan(r[right_rec]) for r in run], color="tab:olive", marker="v",
                      ls=":", ms=5, label=f"recompute: {right_label} (right axis)")
        values = [v for r in run for v in (r[right], r[right_rec]) if v is not None]
        if name == "pagerank":
            twin.set_ylim(-0.02, 1.05)
        elif values:
            lo, hi = min(values + [0.999]), max(values + [1.001])
            pad = (hi - lo) * 0.15
            twin.set_ylim(lo - pad, hi + pad)
            twin.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.4f}"))
        twin.set_ylabel(right_label, fontsize=9, color="tab:green")
        last = run[-1]
        digits = 2 if name == "pagerank" else 6
        bottom.set_title(f"at batch {last['batch']}: incr {left.replace('_', ' ')} "
                         f"{_g(last[left])}, {right.replace('_', ' ')} "
                         f"{_g(last[right], digits, fixed=True)}", fontsize=10)
        if i == 0:
            top.legend(loc="best", fontsize=8, framealpha=0.85)
            lines = bottom.get_lines() + twin.get_lines()
            twin.legend(lines, [ln.get_label() for ln in lines], loc="upper center",
                        bbox_to_anchor=(0.5, -0.3), ncol=2, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10.5)
    fig.tight_layout()
    _save(fig, path)


SHARING = {"on": ("sharing on (one state per source, WHERE and GROUP BY)",
                   {"color": "tab:blue", "marker": "o", "lw": 2.2}),
           "off": ("sharing off (a state per view)",
                   {"color": "tab:red", "marker": "s", "ls": "--"}),
           "rollup": ("sharing with rollup (coarser groupings from a finer state too)",
                      {"color": "tab:purple", "marker": "^", "lw": 1.8})}


def plot_sharing(rows: list[Row], path: Path, title: str, target: float) -> None:
    """Writes ``incr bench sharing``'s figure: time per increment against the number of views.

    One line per share setting through the medians over the increments, a band from the
    fastest to the slowest increment, each point's ratio to the smallest N written beside it,
    the target (``target`` × the smallest N's median with sharing on) as a dotted line, and,
    when the views were measured alone, the floor: the costliest of the first N alone, as a
    multiple of the first view alone (they ran in a phase of their own) times the smallest
    N's median with sharing on, so it compares with the target line.
    """
    import statistics

    from incr.bench.sharing import summary

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.0, 5.6))
    counts = sorted({r.views for r in rows if r.share in SHARING})
    summ = summary(rows)["by_views"]
    ratios = [summ[str(n)]["floor_over_base"] for n in counts]
    base = summ[str(counts[0])]["median_on_s"]
    if base is not None and None not in ratios:
        floor = [base * r for r in ratios]
        ax.plot(counts, floor, color="tab:gray", ls="-.", lw=1.5, marker="x", ms=5,
                label="floor: the costliest of the N views alone, ÷ the first alone × 1 view on "
                      "(no sharing goes below it)")
    base_on = None
    for share, (label, style) in SHARING.items():
        times = [[r.seconds for r in rows if r.views == n and r.share == share and r.batch > 0]
                 for n in counts]
        if not all(times):
            continue
        medians = [statistics.median(t) for t in times]
        ax.plot(counts, medians, label=label, ms=6, **style)
        ax.fill_between(counts, [min(t) for t in times], [max(t) for t in times],
                        color=style["color"], alpha=0.12, lw=0)
        for n, m in zip(counts, medians):
            ax.annotate(f"{m / medians[0]:.2g}×", (n, m), textcoords="offset points",
                        xytext={"on": (6, 6), "off": (6, -12)}.get(share, (-30, -12)), fontsize=8.5,
                        color=style["color"])
        if share == "on":
            base_on = medians[0]
    if base_on is not None:
        ax.axhline(target * base_on, color="tab:green", ls=":", lw=1.5,
                   label=f"target: {target:g}× {counts[0]} view(s), sharing on")
    _log_axis(ax, "x")
    _log_axis(ax, "y")
    ax.set_xticks(counts)
    ax.set_xlabel("views in the program (the first N of the catalogue)")
    ax.set_ylabel("seconds per increment (median; band: fastest to slowest)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=9, framealpha=0.85)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def _nan(value: float | None, floor: float | None = None) -> float:
    """NaN for a missing value (a gap in the line); at least ``floor`` on log axes."""
    if value is None:
        return float("nan")
    return max(floor, value) if floor is not None else value


def _g(value: object, digits: int = 2, fixed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if fixed else f"{value:.{digits}g}"


def main(argv: list[str]) -> int:
    """Redraws the figure of each CSV given (written by ``incr bench``)."""
    for name in argv:
        path = Path(name)
        with path.open() as fh:
            header = fh.readline()
        if "share" in header.split(","):  # incr bench sharing
            from incr.bench.sharing import draw

            draw(path)
            continue
        if "moves" in header.split(","):  # an iterative benchmark (kmeans, pagerank)
            from incr.bench.iterative import iterative_title
            from incr.bench.iterative import read_csv as read_iterative

            rows = read_iterative(path)
            meta = json.loads(path.with_suffix(".json").read_text())
            plot_iterative(rows, path.with_suffix(".png"), iterative_title(
                rows[0]["name"], rows, meta["iterations"], meta["tolerance"]))
            continue
        rows = read_csv(path)
        plot(rows, path.with_suffix(".png"), title(rows[0].name, rows[0].initial_rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
