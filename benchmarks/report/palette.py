"""One colour per library, shared by every chart, so a colour means the same library everywhere.

Colour-blind-safe hues (Okabe-Ito); the baseline itself is never drawn, it is the 1x line.
"""

from __future__ import annotations

HEADLINE_COMPETITORS = ("jax", "optree")
"""The libraries the headline figure and the variant tables compare against."""

LIBRARY_COLORS = {
    "jax": "#0072B2",  # blue
    "optree": "#E69F00",  # orange
    "dm-tree": "#009E73",  # green
    "torch": "#D55E00",  # vermillion
    "nnx": "#CC79A7",  # purple-pink
    "fastree-plain": "#999999",  # grey
    "fastree-noaux": "#56B4E9",  # sky blue
}
SAME_COLOR = "#BBBBBB"
"""A figure whose interval includes 1x: drawn grey, never as a slowdown."""
SLOWER_COLOR = "#CC3311"
"""A figure whose whole interval says the baseline is slower."""
INSTALLED_COLOR = "#332288"
"""End-to-end workloads: fastree installed vs plain JAX (indigo, unlike any library)."""
FALLBACK_COLORS = ("#F0E442", "#000000", "#8C564B")
"""For a library not listed above (a new adapter), in order of appearance."""

LIBRARY_LABELS = {
    "jax": "jax.tree_util",
    "fastree-plain": "fastree, plain registration",
    "fastree-noaux": "fastree, aux checks off",
    "nnx": "flax.nnx split/merge",
}


def color_of(library: str, others: list[str]) -> str:
    """The library's colour; unknown libraries take the fallbacks in the order given."""
    if library in LIBRARY_COLORS:
        return LIBRARY_COLORS[library]
    unknown = [name for name in others if name not in LIBRARY_COLORS]
    index = unknown.index(library) if library in unknown else 0
    return FALLBACK_COLORS[index % len(FALLBACK_COLORS)]


def label_of(library: str) -> str:
    return LIBRARY_LABELS.get(library, library)
