"""The PNG chart of ``bench_client.py --chart``: one horizontal bar of msgs/s per test, go-liftbridge bars apart."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

COLOURS = {"go": "#00758f", "python": "#f0a030", "gufo": "#9a9a9a"}
LEGEND = {
    "go": "go-liftbridge (reference)",
    "python": "this client (liftbridge_provider)",
    "gufo": "gufo-liftbridge",
}


@dataclass
class Bar:
    label: str
    rate: float  # msgs/s
    kind: str  # "go", "python" or "gufo"
    note: str  # written at the end of the bar, e.g. "0.62x go"
    group_start: bool = False  # a thin line above: a new group (sync, publish, read)


def write_chart(path: Path, bars: list[Bar], title: str, subtitle: str) -> None:
    """Write the chart (matplotlib, Agg backend): the first bar on top, msgs/s on a log scale."""
    import matplotlib  # noqa: PLC0415 - only needed with --chart

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    height = 1.2 + 0.42 * len(bars)
    figure, axes = plt.subplots(figsize=(11, height), dpi=110)
    positions = list(range(len(bars)))[::-1]
    for y, bar in zip(positions, bars, strict=True):
        go = bar.kind == "go"
        axes.barh(
            y,
            bar.rate,
            height=0.7,
            color=COLOURS[bar.kind],
            edgecolor="black" if go else "none",
            hatch="//" if go else None,
            linewidth=0.8,
        )
        axes.text(
            bar.rate * 1.06,
            y,
            f"{bar.rate:,.0f}  {bar.note}",
            va="center",
            fontsize=9,
            fontweight="bold" if go else "normal",
        )
        if bar.group_start and y != positions[0]:
            axes.axhline(y + 0.5, color="#cccccc", linewidth=0.8)
    axes.set_yticks(positions, [bar.label for bar in bars], fontsize=9)
    for tick, bar in zip(axes.get_yticklabels(), bars, strict=True):
        if bar.kind == "go":
            tick.set_fontweight("bold")
    axes.set_xscale("log")
    lowest = min((b.rate for b in bars if b.rate > 0), default=1.0)
    highest = max((b.rate for b in bars), default=10.0)
    axes.set_xlim(lowest / 2, highest * 6)  # room for the numbers at the bar ends
    axes.set_xlabel("messages per second (log scale; ratio to the go-liftbridge bar of the same kind)")
    axes.grid(axis="x", which="major", color="#e5e5e5")
    axes.set_axisbelow(True)
    kinds = [kind for kind in COLOURS if any(b.kind == kind for b in bars)]
    handles = [
        Patch(facecolor=COLOURS[k], edgecolor="black" if k == "go" else "none", hatch="//" if k == "go" else None)
        for k in kinds
    ]
    axes.legend(
        handles,
        [LEGEND[k] for k in kinds],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.55 / max(height - 1.4, 1.0)),  # below the x label
        ncol=len(kinds),
        fontsize=9,
        frameon=False,
    )
    figure.suptitle(title, fontsize=11, fontweight="bold", x=0.01, ha="left")
    axes.set_title(textwrap.fill(subtitle, 140), fontsize=8.5, loc="left", color="#444444")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, bbox_inches="tight")
    plt.close(figure)
