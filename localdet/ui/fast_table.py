"""A rich Table that draws its plain cases without rich's per-cell layout.

rich measures, wraps and renders every cell of a Table as a renderable of its own: about
0.7 ms a row, 0.2 s for the few hundred rows of `localdet status` with 200 experiments or
`localdet metrics`, most of a command's time. `FastTable` draws the same characters and
styles line by line when every cell is one line of text and the table fits the width, with
the table's default look (box, header, edges, padding (0, 1)); anything else (a wrapped
cell, a grid, row styles, a width it must shrink to) is drawn by rich as before.

    table = FastTable(title="Experiments")
    table.add_column("ID", justify="right")
    table.add_row("1")
    console.print(table)
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.containers import Lines
from rich.segment import Segment
from rich.style import Style, StyleType
from rich.table import Table
from rich.text import Text


class FastTable(Table):
    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = self._drawn(console, options)
        if lines is None:
            yield from super().__rich_console__(console, options)
        else:
            yield from lines

    def _plain(self) -> bool:
        """Whether this table has the look this class draws itself."""
        return (self.box is not None and self.show_header and not self.show_footer
                and self.show_edge and not self.show_lines and not self.leading
                and tuple(self.padding) == (0, 1, 0, 1) and self.pad_edge
                and not self.collapse_padding and not self.expand and self.width is None
                and self.min_width is None and not self.row_styles
                and self.style in (None, "", "none") and self.border_style is None
                and not self.highlight
                and all(row.style is None and not row.end_section for row in self.rows)
                and all(column.width is None and column.min_width is None
                        and column.max_width is None and column.ratio is None
                        and column.vertical == "top" and not column.highlight
                        and column.overflow == "ellipsis" and not column.no_wrap
                        and isinstance(column.header, str) for column in self.columns))

    def _drawn(self, console: Console, options: ConsoleOptions) -> list[Segment] | None:
        if self.box is None or not self.columns or not self._plain():
            return None
        get_style = console.get_style
        columns: list[tuple[Style, list[Text]]] = []  # (the body cells' style, the cells)
        for column in self.columns:
            cells = [cell for cell in (column.header, *column._cells)
                     if isinstance(cell, str) and "\n" not in cell and "\t" not in cell]
            if len(cells) != len(column._cells) + 1:
                return None  # a renderable, or a line rich would break
            columns.append((get_style(column.style or ""),
                            [console.render_str(cell, highlight=False) for cell in cells]))
        widths = [max(text.cell_len for text in texts) + 2 for _, texts in columns]
        table_width = sum(widths) + len(widths) + 1
        if table_width > options.max_width:
            return None  # rich shrinks and wraps it
        safe = console.safe_box if self.safe_box is None else self.safe_box
        box = self.box.substitute(options, safe=safe)
        border = get_style("")
        render_options = options.update(width=table_width, highlight=self.highlight,
                                        height=None)
        drawn: list[Segment] = []
        if self.title:
            drawn += self._annotation(console, render_options, self.title,
                                      Style.pick_first(self.title_style, "table.title"),
                                      self.title_justify)
        drawn += [Segment(box.get_top(widths), border), Segment.line()]
        header_style = [get_style(self.header_style or "") + get_style(column.header_style)
                        for column in self.columns]
        rows = len(columns[0][1])
        for index in range(rows):
            if index == 0:
                left, vertical, right = box.head_left, box.head_vertical, box.head_right
            elif index == rows - 1:
                left, vertical, right = box.foot_left, box.foot_vertical, box.foot_right
            else:
                left, vertical, right = box.mid_left, box.mid_vertical, box.mid_right
            drawn.append(Segment(left, border))
            for number, (column, width, (body_style, texts)) in enumerate(
                    zip(self.columns, widths, columns, strict=True)):
                if number:
                    drawn.append(Segment(vertical, border))
                style = header_style[number] if index == 0 else body_style
                drawn += self._cell(console, texts[index], width - 2, column.justify, style)
            drawn += [Segment(right, border), Segment.line()]
            if index == 0:
                drawn += [Segment(box.get_row(widths, "head", edge=True), border),
                          Segment.line()]
        drawn += [Segment(box.get_bottom(widths), border), Segment.line()]
        if self.caption:
            drawn += self._annotation(console, render_options, self.caption,
                                      Style.pick_first(self.caption_style, "table.caption"),
                                      self.caption_justify)
        return drawn

    @staticmethod
    def _annotation(console: Console, options: ConsoleOptions, text: str | Text,
                    style: StyleType, justify: JustifyMethod) -> list[Segment]:
        """The title or the caption, as rich draws them."""
        shown = console.render_str(text, style=style, highlight=False) \
            if isinstance(text, str) else text
        return list(console.render(shown, options.update(justify=justify)))

    @staticmethod
    def _cell(console: Console, text: Text, width: int, justify: JustifyMethod | None,
              style: Style) -> list[Segment]:
        """One cell as rich's Padding draws it: a space, the text justified, a space, all
        over the cell's style (a column of nothing but padding: the padding as one)."""
        if width == 0:
            return [Segment("  ", style)]
        line = text.copy()
        line.end = ""
        Lines([line]).justify(console, width, justify=justify or "left", overflow="ellipsis")
        segments = [Segment(" ", Style.null()), *line.render(console, end=""),
                    Segment(" ", Style.null())]
        return list(Segment.apply_style(segments, style))
