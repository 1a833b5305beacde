"""A rich Table that draws its plain cases without rich's per-cell layout.

rich measures and renders every cell of a Table as a renderable of its own (a Padding
around a Text): about 0.5 ms a row, 0.1 to 0.2 s for the few hundred rows of `localdet
status` with 200 experiments or `localdet metrics`, most of a command's time. `FastTable`
draws the same characters and styles: it measures the cells' texts directly (rich's column
widths, shrinking included, come from those measurements) and draws a cell that fits on
its line without rich's machinery (one that wraps goes through rich's own wrapping). It
does so for the look localdet's tables have (rich's default box, header, edges and padding
(0, 1), text cells); anything else (a grid, row styles, fixed column widths, renderables in
cells) is drawn by rich as before. tests/test_fast_table.py compares the two.

    table = FastTable(title="Experiments")
    table.add_column("ID", justify="right")
    table.add_row("1")
    console.print(table)
"""

from __future__ import annotations

# rich's column measuring and cell internals: checked against rich 15.0 (pyproject's bound <15.1)
from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.containers import Lines
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style, StyleType
from rich.table import Column, Table
from rich.text import Text

_JUSTIFIED = ("left", "center", "right")  # what Lines.justify does as Text's rendering does


class FastTable(Table):
    # column -> its header's and cells' (least, most) widths as Text measures them, while
    # measuring
    _texts: dict[int, list[tuple[int, int]]] | None = None

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
                        and isinstance(column.header, str) for column in self.columns))

    def _measure_column(self, console: Console, options: ConsoleOptions,
                        column: Column) -> Measurement:
        """rich's measurement of a column, from its texts rendered once: what
        Measurement.get makes of each cell's Padding around its Text."""
        texts = self._texts.get(column._index) if self._texts is not None else None
        if texts is None:
            return super()._measure_column(console, options, column)
        max_width = options.max_width
        if max_width < 1:
            return Measurement(0, 0)
        smallest, largest = [], []
        for low, high in texts:
            # Measurement.get of the Padding around the Text, in plain numbers (rich's objects
            # took most of a 1,000-row table's time). A text's measure is already normal
            # (0 <= longest word <= longest line), so normalizing changes nothing: capped, an
            # empty one measures nothing, then two more for the padding, capped again.
            if max_width < 3:  # Padding.__rich_measure__ (and a width of 0: nothing)
                low = high = max(0, max_width)
            else:
                if high < 1:
                    low = high = 0
                low, high = min(min(low, max_width) + 2, max_width), \
                    min(min(high, max_width) + 2, max_width)
            smallest.append(low)
            largest.append(high)
        return Measurement(max(smallest) if smallest else 1,
                           max(largest) if largest else max_width).with_maximum(max_width)

    def _drawn(self, console: Console, options: ConsoleOptions) -> list[Segment] | None:
        if self.box is None or not self.columns or not self._plain():
            return None
        get_style = console.get_style
        texts: dict[int, list[str | Text]] = {}
        for index, column in enumerate(self.columns):
            cells = [cell for cell in (column.header, *column._cells)
                     if isinstance(cell, str) and "\t" not in cell]
            if len(cells) != len(column._cells) + 1:
                return None  # a renderable in a cell, or a tab
            # A cell of one line without markup or an emoji code stays a string: what
            # render_str would make of it is a Text of that string, without styles (most
            # cells; making Texts of them was a third of a 1,000-row table's time).
            texts[index] = [cell if "[" not in cell and ":" not in cell and "\n" not in cell
                            else console.render_str(cell, highlight=False) for cell in cells]
        # Each column as wide as its widest line, as rich makes it when the table fits;
        # else rich's shrinking, over measurements of these texts.
        widths = [max(max((cell_len(line) for line in _plain(text).splitlines()), default=0)
                      for text in column) + 2 for column in texts.values()]
        if sum(widths) + self._extra_width > options.max_width:
            self._texts = {index: [_measure(text) for text in column]
                           for index, column in texts.items()}
            try:
                widths = self._calculate_column_widths(
                    console, options.update_width(options.max_width - self._extra_width))
            finally:
                self._texts = None
        table_width = sum(widths) + self._extra_width
        render_options = options.update(width=table_width, highlight=self.highlight,
                                        height=None)
        safe = console.safe_box if self.safe_box is None else self.safe_box
        box = self.box.substitute(options, safe=safe)
        border = get_style("")
        drawn: list[Segment] = []
        if self.title:
            drawn += self._annotation(console, render_options, self.title,
                                      Style.pick_first(self.title_style, "table.title"),
                                      self.title_justify)
        drawn += [Segment(box.get_top(widths), border), Segment.line()]
        header_styles = [get_style(self.header_style or "") + get_style(column.header_style)
                         for column in self.columns]
        body_styles = [get_style(column.style or "") for column in self.columns]
        rows = len(texts[0])  # the header and the rows
        for index in range(rows):
            if index == 0:
                left, vertical, right = box.head_left, box.head_vertical, box.head_right
            elif index == rows - 1:
                left, vertical, right = box.foot_left, box.foot_vertical, box.foot_right
            else:
                left, vertical, right = box.mid_left, box.mid_vertical, box.mid_right
            styles = header_styles if index == 0 else body_styles
            row = [self._cell(console, render_options, texts[number][index], width, column,
                                styles[number])
                     for number, (column, width) in enumerate(zip(self.columns, widths,
                                                                  strict=True))]
            height = max(1, *(len(cell) for cell in row))
            for cell, width, style in zip(row, widths, styles, strict=True):
                cell += [[Segment(" " * width, style)]] * (height - len(cell))  # rich's align_top
            for line in range(height):
                segments = [Segment(left, border)]
                for number, cell in enumerate(row):
                    if number:
                        segments.append(Segment(vertical, border))
                    segments += cell[line]
                segments.append(Segment(right, border))
                drawn += _joined(segments)
                drawn.append(Segment.line())
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
    def _cell(console: Console, options: ConsoleOptions, text: str | Text, width: int,
              column: Column, style: Style) -> list[list[Segment]]:
        """One cell's lines as rich's Padding draws them: a space, the text justified, a
        space, all over the cell's style. A text that fits on its line skips rich's
        wrapping; one that does not goes through it. A string is a Text without styles."""
        inner = width - 2
        if inner < 1:
            return []  # rich renders nothing in no width
        pad = Segment(" ", Style.null())
        if isinstance(text, str):
            plain, size = text, cell_len(text)
            if size > inner:
                text = Text(plain)  # wrapped below, as rich wraps it
            fits = size <= inner
        else:
            plain, size = text.plain, text.cell_len
            fits = size <= inner and "\n" not in plain and text.justify is None
        if fits and (isinstance(text, str) or not text.spans) \
                and column.justify in _JUSTIFIED:
            # What Lines.justify and Text.render make of a text without styles, as one string
            # (a Text without spans renders as one unstyled segment).
            if column.justify == "left":
                content = plain + " " * (inner - size)
            else:
                stripped = plain.rstrip()
                spare = inner - cell_len(stripped)
                left = spare // 2 if column.justify == "center" else spare
                content = " " * left + stripped + " " * (spare - left)
            return [list(Segment.apply_style([pad, Segment(content), pad], style))]
        if isinstance(text, str):  # (a str fits, or became a Text above)
            text = Text(plain)
        if not fits and not text.spans:
            # What render_lines makes of a text without styles that wraps: rich's own wrap,
            # then each line padded to the cell (its Segment machinery left out).
            wrapped = text.wrap(
                console, inner, justify=text.justify or column.justify or "default",
                overflow=text.overflow or column.overflow or "fold",
                tab_size=(console.tab_size if text.tab_size is None else text.tab_size) or 8,
                no_wrap=text.no_wrap if text.no_wrap is not None else bool(column.no_wrap))
            lines = []
            for line in wrapped:
                content = line.plain
                size = cell_len(content)
                if size > inner:
                    content = set_cell_size(content, inner)
                lines.append([pad, Segment(content), Segment(" " * (inner - size), Style.null()),
                              pad] if size < inner else [pad, Segment(content), pad])
            return [list(Segment.apply_style(line, style)) for line in lines]
        if fits and column.justify in _JUSTIFIED:
            line = text.copy()
            line.end = ""
            Lines([line]).justify(console, inner, justify=column.justify,
                                  overflow=text.overflow or column.overflow or "fold")
            lines = [list(line.render(console, end=""))]
        else:
            cell_options = options.update(width=width, justify=column.justify,
                                          no_wrap=column.no_wrap, overflow=column.overflow,
                                          height=None, highlight=column.highlight)
            lines = console.render_lines(text, cell_options.update_width(inner),
                                         style=Style.null(), pad=True)
        return [list(Segment.apply_style([pad, *line, pad], style)) for line in lines]

    @staticmethod
    def _annotation(console: Console, options: ConsoleOptions, text: str | Text,
                    style: StyleType, justify: JustifyMethod) -> list[Segment]:
        """The title or the caption, as rich draws them."""
        shown = console.render_str(text, style=style, highlight=False) \
            if isinstance(text, str) else text
        return list(console.render(shown, options.update(justify=justify)))


def _plain(text: str | Text) -> str:
    return text if isinstance(text, str) else text.plain


def _measure(text: str | Text) -> tuple[int, int]:
    """Text.__rich_measure__: its longest word, its longest line."""
    plain = _plain(text)
    lines = plain.splitlines()
    most = max(cell_len(line) for line in lines) if lines else 0
    words = plain.split()
    return (max(cell_len(word) for word in words) if words else most), most


def _joined(segments: list[Segment]) -> list[Segment]:
    """The segments with each run of unstyled ones (no style, or the null style: neither
    writes a code) as one: the same characters and codes, in a few segments where a row
    had dozens, each of which the console measures and crops again."""
    joined: list[Segment] = []
    run: list[str] = []
    for segment in segments:
        if segment.style or segment.control:
            if run:
                joined.append(Segment("".join(run)))
                run = []
            joined.append(segment)
        else:
            run.append(segment.text)
    if run:
        joined.append(Segment("".join(run)))
    return joined
