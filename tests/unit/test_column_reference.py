"""The column reference: every column of every analysts' table is documented, and docs/tables.md shows it as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.warehouse.columns import BEGIN, END, described, reference_markdown
from storage.warehouse.schema import TABLES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("table", "column"), [(t, c) for t, columns in TABLES.items() for c in columns])
def test_every_published_column_is_documented(table: str, column: str) -> None:
    meaning = described(table, column)
    assert meaning and len(meaning) > 10, f"{table}.{column} has no meaning in storage/warehouse/columns.py"


def test_docs_tables_holds_the_current_reference() -> None:
    document = (ROOT / "docs" / "tables.md").read_text()
    block = BEGIN + document.partition(BEGIN)[2].partition(END)[0] + END
    assert block == reference_markdown(), "run: python scripts/column_reference.py --write"


def test_the_readme_points_to_the_reference_instead_of_copying_columns() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/tables.md" in readme
    assert "| `rows_in` |" not in readme and "| `topic_score` |" not in readme  # no second, older column list
