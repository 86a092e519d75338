"""A long window's per-request parts (request rows, counter series, natural failures), rendered
once as the projection makes them into temporary files that the three formats are assembled from.

A window of a million events has 10^5 request rows and as many scrapes: held as objects they are
most of a report's memory, and made again from the log they are a second pass. Here each is
formatted for json, md and html the moment it is made and written out, so the report's memory does
not grow with the window and the log is read once.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
import msgspec

from flare_diag.daemon.reports.charts import Decimated
from flare_diag.events.report import CHARTED_COUNTERS, SERIES_KEYS
from flare_diag.daemon.reports.report_html import PHASE_TABLE_CLOSE, phase_table_open, request_head, request_tr, table_row
from flare_diag.daemon.reports.report_md import md_row
from flare_diag.daemon.reports.report_view import REQUEST_COLUMNS, failure_cells, request_columns, request_row, scale_of

_json = msgspec.json.Encoder()
_PENDING = 256  # rows buffered before they are encoded and written


class Spooled:
    """Bytes in an anonymous temporary file, written in pieces and read back in blocks, with pieces
    inserted at places already written (a table's head that counts its rows) when they are read."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()
        self.pending: list[str] = []
        self.inserts: list[tuple[int, bytes]] = []  # (offset, bytes), offsets ascending

    def add(self, piece: str) -> None:
        self.pending.append(piece)
        if len(self.pending) >= _PENDING:
            self.flush()

    def add_bytes(self, b: bytes | memoryview) -> None:
        self.flush()
        self.file.write(b)

    def flush(self) -> None:
        if self.pending:
            self.file.write("".join(self.pending).encode())
            self.pending.clear()

    def tell(self) -> int:
        """The offset the next piece will be written at."""
        self.flush()
        return self.file.tell()

    def insert(self, at: int, piece: str) -> None:
        """`piece` read back at offset `at` (from tell()), before what was written there: the rows of a
        long table go straight to the file, and its head, which counts them, joins them when read."""
        if self.inserts and at < self.inserts[-1][0]:
            raise ValueError("inserts are made in the order of their offsets")
        self.inserts.append((at, piece.encode()))

    def blocks(self) -> Iterator[bytes]:
        self.flush()
        self.file.seek(0)
        pos = 0
        for at, piece in self.inserts:
            yield from self._read(at - pos)
            pos = at
            yield piece
        yield from self._read(-1)

    def _read(self, n: int) -> Iterator[bytes]:
        """The next n bytes of the file (all that is left when n < 0), a block at a time."""
        while n:
            b = self.file.read(1 << 20 if n < 0 else min(n, 1 << 20))
            if not b:
                return
            n -= len(b) if n > 0 else 0
            yield b

    def close(self) -> None:
        self.file.close()


class _JsonList:
    """A JSON array written to a temporary file a batch of items at a time; read back with its brackets."""

    def __init__(self) -> None:
        self.out, self.n = Spooled(), 0
        self.batch: list[object] = []

    def add(self, item: object) -> None:
        self.batch.append(item)
        if len(self.batch) >= _PENDING:
            self._write()

    def extend(self, items) -> None:
        self.batch.extend(items)
        if len(self.batch) >= _PENDING:
            self._write()

    def _write(self) -> None:
        if self.batch:
            if self.n:
                self.out.add_bytes(b",")
            self.out.add_bytes(memoryview(_json.encode(self.batch))[1:-1])  # its items, not copied without the brackets
            self.n += len(self.batch)
            self.batch.clear()

    def blocks(self) -> Iterator[bytes]:
        self._write()
        yield b"["
        yield from self.out.blocks()
        yield b"]"

    def close(self) -> None:
        self.out.close()


class ReportSpool:
    """What the projection hands over per request, scrape and natural failure, kept as the bytes each
    format will show; `render_chunks` assembles the files around them."""

    def __init__(self) -> None:
        self.requests = _JsonList()
        self.md = Spooled()
        self.html = Spooled()
        self.counters = {k: _JsonList() for k in ("minute", *SERIES_KEYS)}
        self._scrapes: list[tuple] = []  # (minute, *values) a batch at a time, written out as columns
        self._charted = {k: (1 + SERIES_KEYS.index(k), Decimated()) for k in CHARTED_COUNTERS}  # thinned as they come
        self.failures = _JsonList()
        self.failures_html = Spooled()
        self.failure_count = 0
        self._cells: tuple[float, bool, str] | None = None  # scale, wall column, html table head (the clock's)
        self._phase: str | None = None
        # the open phase's html rows go to the file as they come; its table's head, whose summary
        # counts them, is inserted before them when the phase ends
        self._phase_at = 0
        self._phase_count = 0
        self._phases = 0

    # --- fed by the projection -------------------------------------------------------------

    def request(self, req, clock: dict) -> None:
        """One request row (a dict, or a RequestRow for an answered request), in each format."""
        if self._cells is None:
            r = {"clock": clock}
            self._cells = (scale_of(r), len(request_columns(r)) != len(REQUEST_COLUMNS), request_head(r))
        scale, wall, _head = self._cells
        self.requests.add(req)
        row = request_row(req, scale, wall)
        self.md.add("\n" + md_row(row))
        if row[0] != self._phase:  # a phase's rows are consecutive in the log
            self._close_phase()
            self._phase, self._phase_at = row[0], self.html.tell()
        self.html.add(request_tr(row))
        self._phase_count += 1

    def _close_phase(self) -> None:
        if self._phase is None:
            return
        head = self._cells[2] if self._cells else ""
        self.html.insert(self._phase_at, ("\n" if self._phases else "") + phase_table_open(head, self._phase, self._phase_count))
        self.html.add(PHASE_TABLE_CLOSE)
        self._phases += 1
        self._phase, self._phase_count = None, 0

    def scrape(self, minute: float | None, values: tuple) -> None:
        self._scrapes.append((minute, *values))
        if len(self._scrapes) >= _PENDING:
            self._columns()

    def _columns(self) -> None:
        if self._scrapes:
            cols = list(zip(*self._scrapes))
            for out, xs in zip(self.counters.values(), cols):
                out.extend(xs)
            for i, d in self._charted.values():
                d.extend(cols[0], cols[i])
            self._scrapes.clear()

    def natural_failure(self, f: dict) -> None:
        self.failures.add(f)
        self.failure_count += 1
        self.failures_html.add(table_row(failure_cells(f)))

    def finish(self) -> None:
        self._close_phase()
        self._columns()

    # --- read by the assemblers ------------------------------------------------------------

    def counter_points(self) -> dict[str, list[tuple[float, float]]]:
        """The charted counters' points, thinned as the counter chart of the whole series would be."""
        return {k: d.points() for k, (_i, d) in self._charted.items()}

    @property
    def request_count(self) -> int:
        return self.requests.n + len(self.requests.batch)

    def json_parts(self) -> dict[str, Iterator[bytes]]:
        """The report.json values that live here, by top-level key."""
        return {"requests": self.requests.blocks(), "counters": self._counter_blocks(),
                "natural_failures": self.failures.blocks()}

    def _counter_blocks(self) -> Iterator[bytes]:
        for i, (k, col) in enumerate(self.counters.items()):
            yield (b"{" if i == 0 else b",") + _json.encode(k) + b":"
            yield from col.blocks()
        yield b"}"

    def close(self) -> None:
        spools: list[Spooled | _JsonList] = [self.requests, self.md, self.html, self.failures, self.failures_html,
                                             *self.counters.values()]
        for s in spools:
            s.close()

    def __enter__(self) -> ReportSpool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
