"""The one place that draws: `--plot FILE.png` of the benchmarks and of `metrale replay`.

matplotlib is optional (the `plot` extra): it is imported only here and only when a plot is asked
for, so every benchmark runs without it.
"""

from __future__ import annotations

import textwrap


def pyplot(command: str):
    """matplotlib.pyplot on the Agg backend; a clear exit where matplotlib is missing. Benchmarks call
    it before measuring, so a missing matplotlib costs seconds, not the whole run."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(f"{command} --plot needs matplotlib: pip install 'metrale[plot]'") from None
    matplotlib.use("Agg")  # no screen: render to the file
    import matplotlib.pyplot as plt

    return plt


def figure(command: str, title: str, rows: int = 1, cols: int = 1, size: tuple[float, float] = (10, 6)):
    """A titled figure and its grid of axes (always 2-D, so callers index axes[r][c])."""
    plt = pyplot(command)
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False)
    fig.suptitle(title)
    return fig, axes


def save(fig, path: str, footer: str = "") -> None:
    """Writes the PNG with the benchmark's key=value line beneath the plots, then frees the figure."""
    plt = pyplot("save")
    lines = textwrap.wrap(footer, 120)  # the line breaks only at its spaces, between keys
    if lines:
        fig.text(0.5, 0.01, "\n".join(lines), ha="center", va="bottom", fontsize=8, family="monospace")
    fig.tight_layout(rect=(0, 0.025 * len(lines) + 0.01, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def even(ax, label: str = "1.0 = even") -> None:
    """The break-even line of a ratio axis."""
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":", label=label)
