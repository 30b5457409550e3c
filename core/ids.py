"""The one id rule: what a user_id or an item_id may be, wherever an id enters (input contracts, ranker, events API).

An id is 1 to ``ID_MAX_CHARS`` printable characters: letters of any script, digits, punctuation, symbols and
inner spaces; no control, format, private-use or unassigned characters, no line or paragraph separators and no
space but the ASCII one (``str.isprintable``); no leading or trailing space; and not ``.`` or ``..`` (a URL path
segment cannot carry them, so the ranker could never serve such a user). The input contracts quarantine rows
that break it (rule ``<column>:valid_id``), the ranker and ``POST /v1/events`` answer 422, so every id a run
publishes can be asked for and reported on.
"""

from __future__ import annotations

ID_MAX_CHARS = 256
ID_RULE = (
    f"1 to {ID_MAX_CHARS} printable characters (letters of any script, digits, punctuation, inner spaces), "
    "no leading or trailing space, not '.' or '..'"
)
PREVIEW_CHARS = 32
DOT_SEGMENTS = (".", "..")


def id_problem(value: str) -> str | None:
    """Return why value is not a valid id (a short sentence), or None when it is one."""
    if not 1 <= len(value) <= ID_MAX_CHARS:
        return f"an id has 1 to {ID_MAX_CHARS} characters, this one {len(value)}"
    if not value.isprintable():
        return "an id holds printable characters only (no control, format or separator characters but the space)"
    if value != value.strip(" "):
        return "an id does not start or end with a space"
    if value in DOT_SEGMENTS:
        return "an id is not '.' or '..'"
    return None


def valid_id(value: object) -> bool:
    """Return whether value is a string that follows the id rule."""
    return isinstance(value, str) and id_problem(value) is None


def id_preview(value: str) -> str:
    """Return the first PREVIEW_CHARS characters of a (possibly huge) id, for error messages and logs."""
    return value if len(value) <= PREVIEW_CHARS else value[:PREVIEW_CHARS] + "…"
