"""``History.plot``: a PNG of chosen log entries over the run (matplotlib, optional)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["plot_history"]


def plot_history(
    collect: Callable[[str, str], Any],
    keys: Sequence[str | Sequence[str]],
    *,
    path: str | os.PathLike[str] | None = None,
    x: str = "steps",
    title: str | None = None,
) -> Any:
    """Plots ``keys`` over ``x``, one panel per key (a tuple of keys shares a panel).

    ``collect(x, key)`` gives the values; returns the matplotlib ``Figure``, saved at ``path``.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("History.plot needs matplotlib: pip install 'ciclo-core[plot]'") from None
    if not keys:
        raise ValueError('History.plot needs at least one key, e.g. history.plot("loss").')
    panels = [(key,) if isinstance(key, str) else tuple(key) for key in keys]
    figure = Figure(figsize=(6.4, 2.2 + 1.8 * len(panels)), layout="constrained")
    axes = figure.subplots(len(panels), 1, squeeze=False, sharex=True)[:, 0]
    for ax, panel in zip(axes, panels, strict=True):
        for key in panel:
            xs, ys = collect(x, key)
            ax.plot(xs, ys, label=key, marker="." if len(xs) < 50 else None)
        ax.set_ylabel(panel[0] if len(panel) == 1 else "value")
        if len(panel) > 1:
            ax.legend()
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel(x)
    if title:
        figure.suptitle(title)
    if path is not None:
        figure.savefig(path)
    return figure
