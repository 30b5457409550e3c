"""Render the warehouse's column reference (storage/warehouse/columns.py) into docs/tables.md, or check it is current.

python scripts/column_reference.py           # exit 1 when docs/tables.md is older than the reference
python scripts/column_reference.py --write   # rewrite the block between the markers
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from storage.warehouse.columns import BEGIN, END, reference_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "tables.md"


def rendered(document: str) -> str:
    """Return the document with its column reference block replaced by the current one."""
    head, found, rest = document.partition(BEGIN)
    if not found or END not in rest:
        raise SystemExit(f"{DOC} has no column reference block ({BEGIN} ... {END})")
    return head + reference_markdown() + rest.partition(END)[2]


def main() -> int:
    """Write or check the block; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite docs/tables.md's block")
    args = parser.parse_args()
    document = DOC.read_text()
    current = rendered(document)
    if args.write:
        DOC.write_text(current)
        return 0
    if current != document:
        print(f"{DOC} is older than storage/warehouse/columns.py: run python scripts/column_reference.py --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
