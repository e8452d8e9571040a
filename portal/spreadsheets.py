"""Cells of the files a spreadsheet opens (every CSV and XLSX the portal writes): text stays text.

A spreadsheet runs a cell that starts with `=`, `+`, `-` or `@` (and, in some, a tab or carriage return
before one) as a formula, so text written as given — a legal name, a PO number, a user name — could
compute, fetch a URL or run a command on the reader's machine. Every export writes its rows through here:

- CSV: a text cell with such a start gets a leading `'`, as a person typing it as text would;
- XLSX: every text cell is written as a string cell, never a formula, and one with such a start is
  marked with the quote prefix; characters XLSX cannot hold become U+FFFD instead of failing the file.

Numbers (hours, prices, amounts, negative ones included) are passed as numbers and stay numbers.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from typing import Any

from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE
from openpyxl.worksheet.worksheet import Worksheet

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """The value as a CSV cell: text that a spreadsheet would run gets a leading `'`; anything else as is."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return f"'{value}"
    return value


class CsvWriter:
    """`csv.writer` whose every cell goes through `csv_cell`."""

    def __init__(self, out) -> None:
        self._writer = csv.writer(out)

    def writerow(self, row: Iterable[Any]):
        return self._writer.writerow([csv_cell(value) for value in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def append_row(sheet: Worksheet, row: Iterable[Any]) -> None:
    """Append `row` to `sheet`, text as string cells (never a formula), numbers as numbers."""
    sheet.append(
        [ILLEGAL_CHARACTERS_RE.sub("\ufffd", value) if isinstance(value, str) else value for value in row]
    )
    for cell in sheet[sheet.max_row]:
        if isinstance(cell.value, str):
            cell.data_type = "s"  # openpyxl takes a string that starts with "=" for a formula
            if cell.value.startswith(FORMULA_STARTS):
                cell.quotePrefix = True
