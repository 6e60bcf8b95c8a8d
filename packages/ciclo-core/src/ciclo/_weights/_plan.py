"""The plan of a load: which parameters are loaded, kept, ignored, mismatched or cast, as
``ciclo.weights_plan`` returns it and ``ciclo.load_weights`` prints it (one screen)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["WeightsPlan"]

#: How many names of each kind the printed plan shows.
SHOWN = 4


class WeightsPlan(NamedTuple):
    """What ``load_weights`` does: ``loaded`` (the state's names that take the source's
    values, from the source's ``sources[name]``), ``kept`` (the state's names that keep
    their own initialization), ``ignored`` (the source's names not used), ``mismatched``
    (``"name: state (3, 4) float32, source (4, 4) float32"``) and ``cast`` (loaded names
    whose dtype is widened, ``"name: float16 -> float32"``)."""

    loaded: list[str]
    kept: list[str]
    ignored: list[str]
    mismatched: list[str]
    cast: list[str]
    sources: dict[str, str]

    def __str__(self) -> str:
        kinds = ("loaded", "kept", "ignored", "mismatched", "cast")
        lines = ["weights plan: " + ", ".join(f"{len(getattr(self, k))} {k}" for k in kinds)]
        for kind in kinds:
            names: list[str] = getattr(self, kind)
            if names:
                more = f" (+{len(names) - SHOWN} more)" if len(names) > SHOWN else ""
                lines.append(f"  {kind:<10} {', '.join(names[:SHOWN])}{more}")
        return "\n".join(lines)
