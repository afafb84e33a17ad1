"""The project's one table printer: rows of cells laid out as aligned text (console) or as Markdown (report files).

Every stage, report and benchmark builds its rows (what to show, how each number is formatted) and hands the layout
to this module, so a column width, separator or Markdown rule is computed in one place. Two layouts, because the
text goes to two kinds of reader: :func:`text_table` pads columns for a terminal or a log, :func:`markdown_table`
writes GitHub Markdown (report.md, diagnostics.md, docs/results), where padding means nothing and a ``|`` inside a
cell must be escaped.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def text_table(rows: Iterable[Sequence[Any]], header: Sequence[Any] | None = None, *, align: str = "l",
               sep: str = "  ", rule: str | None = None, indent: str = "") -> str:
    """Fixed-width columns: every cell is ``str()``-ed and padded to its column's widest cell (header included).

    ``align`` holds one letter per column, ``l`` (left) or ``r`` (right); its last letter covers the columns it does
    not reach (``"l"``: all left, ``"lr"``: first left, the rest right). ``sep`` joins the cells of a line, ``indent``
    starts every line; ``rule`` (e.g. ``"  "`` or ``"-+-"``) adds a line of dashes under the header, joined by it.
    Trailing blanks are cut from every line, so a left-aligned last column is not padded.
    """
    cells = [[str(c) for c in row] for row in rows]
    if header is not None:
        cells.insert(0, [str(c) for c in header])
    ncols = max((len(r) for r in cells), default=0)
    widths = [max((len(r[j]) for r in cells if j < len(r)), default=0) for j in range(ncols)]
    letters = (align or "l") + (align or "l")[-1] * ncols

    def line(row: list[str]) -> str:
        padded = (c.rjust(w) if letters[j] == "r" else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths)))
        return (indent + sep.join(padded)).rstrip()

    lines = [line(r) for r in cells]
    if header is not None and rule is not None:
        lines.insert(1, indent + rule.join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_cell(value: Any) -> str:
    """A Markdown table cell: a literal ``|`` (as in ``|T0|``) would otherwise end the cell."""
    return str(value).replace("|", "\\|")


def markdown_table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table: the header, a ``|---|`` rule, one line per row; cells are escaped
    (:func:`markdown_cell`)."""
    def line(row: Sequence[Any]) -> str:
        return "| " + " | ".join(markdown_cell(c) for c in row) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(r) for r in rows)])
