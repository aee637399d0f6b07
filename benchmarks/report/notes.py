"""Skip and exclusion notes, grouped so one reason for many trees is said once."""

from __future__ import annotations

from benchmarks.measure.results import Note


def grouped_notes(notes: list[Note]) -> list[str]:
    """``dm-tree: dm-tree has no treedef object (structure on transformer-12, mlp, ...)``."""
    where: dict[tuple[str, str], list[str]] = {}
    for note in notes:
        places = where.setdefault((note.library or "suite", note.reason), [])
        place = "/".join(part for part in (note.op, note.tree) if part)
        if place and place not in places:
            places.append(place)
    lines = []
    for (library, reason), places in where.items():
        suffix = f" ({_abbreviate(places)})" if places else ""
        lines.append(f"{library}: {reason}{suffix}")
    return lines


def _abbreviate(places: list[str], limit: int = 6) -> str:
    shown = ", ".join(places[:limit])
    return shown if len(places) <= limit else f"{shown}, and {len(places) - limit} more"
