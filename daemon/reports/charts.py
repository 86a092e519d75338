"""Inline SVG charts for reports: deterministic text, no scripts, no fonts or images fetched.

Every chart scales to its container (a viewBox, width 100%) and labels both axes with ticks at
round numbers and an axis title that names the unit. Tick labels carry the class `tick-x` or
`tick-y` and axis titles `axis-x` or `axis-y`, so a test can find them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#7f7f7f")
STATUS_FILL = {"measured": "#2ca02c", "failed": "#d62728", "invalid": "#e0a000", "deferred": "#9aa7b8"}
W = 720


def fmt(v: float) -> str:
    """Compact, stable number text (no locale, no float noise): 950, 1.2k, 135k, 3.4M, 0.25."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if a >= 1000:
        return f"{v / 1e3:.2g}k" if v % 100 else f"{v / 1e3:g}k"
    if float(v).is_integer():
        return f"{v:.0f}"
    return f"{v:.3g}"


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Ticks at 1, 2 or 5 times a power of ten that cover [lo, hi] (the first at or below lo, the
    last at or above hi)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    n = math.ceil((hi - first) / step - 1e-9)
    return [round(first + i * step, 10) for i in range(n + 1)]


class Scale:
    """A linear map from data to pixels, over the span of its ticks."""

    def __init__(self, lo: float, hi: float, p0: float, p1: float, target: int = 5, tight: bool = False):
        """`tight`: the span is exactly [lo, hi] and only the round ticks inside it are drawn (an
        index axis); otherwise the span widens to the round ticks around the data."""
        if hi <= lo:
            lo, hi = lo - 1, hi + 1
        ticks = nice_ticks(lo, hi, target)
        if tight:
            self.ticks = [t for t in ticks if lo <= t <= hi]
            self.lo, self.hi = lo, hi
        else:
            self.ticks = ticks
            self.lo, self.hi = ticks[0], ticks[-1]
        self.p0, self.p1 = p0, p1

    def __call__(self, v: float) -> float:
        return self.p0 + (v - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)


def _svg(title: str, height: float, body: list[str], width: float = W) -> str:
    return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height:.0f}" width="100%" '
                      f'style="max-width:{width * 1.5:.0f}px" role="img" aria-label="{escape(title)}">',
                      f'<text x="4" y="16" font-size="13" font-weight="bold">{escape(title)}</text>', *body, "</svg>"])


def _x_axis(sx: Scale, y: float, label: str, top: float | None = None, unit_fmt=fmt) -> list[str]:
    out = [f'<line x1="{sx.p0:.1f}" y1="{y:.1f}" x2="{sx.p1:.1f}" y2="{y:.1f}" stroke="#444"/>']
    for t in sx.ticks:
        x = sx(t)
        if top is not None:
            out.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{y + 4:.1f}" stroke="#444"/>')
        out.append(f'<text class="tick-x" x="{x:.1f}" y="{y + 15:.1f}" font-size="10" text-anchor="middle">'
                   f'{escape(unit_fmt(t))}</text>')
    out.append(f'<text class="axis-x" x="{(sx.p0 + sx.p1) / 2:.1f}" y="{y + 29:.1f}" font-size="11" '
               f'text-anchor="middle">{escape(label)}</text>')
    return out


def _y_axis(sy: Scale, x: float, right: float, label: str) -> list[str]:
    out = [f'<line x1="{x:.1f}" y1="{sy.p0:.1f}" x2="{x:.1f}" y2="{sy.p1:.1f}" stroke="#444"/>']
    for t in sy.ticks:
        y = sy(t)
        out.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{right:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text class="tick-y" x="{x - 5:.1f}" y="{y + 3.5:.1f}" font-size="10" text-anchor="end">{fmt(t)}</text>')
    mid = (sy.p0 + sy.p1) / 2
    out.append(f'<text class="axis-y" x="{x - 40:.1f}" y="{mid:.1f}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 {x - 40:.1f} {mid:.1f})">{escape(label)}</text>')
    return out


def _legend(items: Sequence[tuple[str, str]], x: float, y: float) -> list[str]:
    out, cx = [], x
    for name, colour in items:
        out.append(f'<rect x="{cx:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{cx + 14:.1f}" y="{y:.1f}" font-size="11">{escape(name)}</text>')
        cx += 24 + 6.2 * len(name)
    return out


def empty(title: str) -> str:
    return _svg(title, 44, ['<text x="4" y="36" font-size="12" fill="#666">no data recorded</text>'])


MAX_POINTS = 600  # per series: a chart 560 px wide shows no more, and long windows have 10^5 points


def _thin(s: list[tuple]) -> list[tuple]:
    """At most MAX_POINTS of a series' points, evenly spaced, its last one kept."""
    if len(s) <= MAX_POINTS:
        return s
    step = len(s) / (MAX_POINTS - 1)
    return [s[int(i * step)] for i in range(MAX_POINTS - 1)] + [s[-1]]


class Decimated:
    """A series thinned as it streams, never held whole: every `stride`-th point is kept, and when
    MAX_POINTS would be reached the stride doubles and every other kept point goes; the last point
    is always drawn. The same points whether it is fed from a log or from a report's columns."""

    __slots__ = ("kept", "stride", "seen", "last")

    def __init__(self) -> None:
        self.kept: list[tuple[float, float]] = []
        self.stride, self.seen = 1, 0
        self.last: tuple[float, float] | None = None

    def add(self, x: float, y: float) -> None:
        p = (x, y)
        if self.seen % self.stride == 0:
            self.kept.append(p)
            if len(self.kept) >= MAX_POINTS:
                del self.kept[1::2]
                self.stride *= 2
        self.seen += 1
        self.last = p

    def extend(self, xs: Iterable[float | None], ys: Iterable[float | None]) -> None:
        """The points (x, y) of two aligned columns, those with both values, as `add` of each in
        order would keep them: a slice of them at a time rather than a call each."""
        pts = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
        n, i = len(pts), -self.seen % self.stride  # the first point whose count the stride divides
        while i < n:
            take = pts[i:i + (MAX_POINTS - len(self.kept)) * self.stride:self.stride]
            self.kept += take
            if len(self.kept) < MAX_POINTS:
                break
            del self.kept[1::2]
            after = i + (len(take) - 1) * self.stride + 1  # the point after the one that filled it
            self.stride *= 2
            i = after + -(self.seen + after) % self.stride
        if n:
            self.seen += n
            self.last = pts[-1]

    def points(self) -> list[tuple[float, float]]:
        if self.last is None:
            return []
        return self.kept if self.kept[-1] is self.last else self.kept + [self.last]


def lines(title: str, series: Sequence[tuple[str, Sequence[tuple[float, float | None]]]], x_label: str, y_label: str,
          marks: Sequence[tuple[float, str]] = (), x_span: tuple[float, float] | None = None) -> str:
    """Polylines, one per named series of (x, y) points, with dashed vertical marks (x, label). A later
    series is drawn dashed over an earlier one, so two series with equal values both stay visible.
    `x_span`: the x axis exactly this span (a window's minutes), not widened to round ticks. A point
    whose y is None is a break: the line stops there and starts again at the next point."""
    thinned = [(n, _thin(list(s))) for n, s in series if s]
    pts = [(x, y) for _n, s in thinned for x, y in s if y is not None]
    if not pts:
        return empty(title)
    xs = [p[0] for p in pts] + [m[0] for m in marks]
    ml, mt, h = 80, 40, 270
    if x_span is not None:
        sx = Scale(min(x_span[0], *xs), max(x_span[1], *xs), ml, W - 20, tight=True)
    else:
        sx = Scale(min(xs), max(xs), ml, W - 20)
    sy = Scale(0, max(max(p[1] for p in pts), 1), h - 50, mt)
    body = _y_axis(sy, ml, W - 20, y_label) + _x_axis(sx, h - 50, x_label)
    for i, (_name, s) in enumerate(thinned):
        c = PALETTE[i % len(PALETTE)]
        for seg in _segments(s):
            if len(seg) == 1:
                body.append(f'<circle cx="{sx(seg[0][0]):.1f}" cy="{sy(seg[0][1]):.1f}" r="3" fill="{c}"/>')
                continue
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in seg)
            dash = "" if i == 0 else f' stroke-dasharray="{4 + 3 * i} {3 + i}"'
            body.append(f'<polyline fill="none" stroke="{c}" stroke-width="{2.6 if i == 0 else 1.8}"{dash} points="{path}"/>')
    for i, (x, label) in enumerate(marks):
        px = sx(x)
        # a label reads away from the plot's nearer edge, so that one near the y axis is not cut off
        right = px - ml < 6.2 * len(label)
        body.append(f'<line x1="{px:.1f}" y1="{mt}" x2="{px:.1f}" y2="{h - 50}" stroke="#888" stroke-dasharray="4 3"/>')
        body.append(f'<text x="{px + 3 if right else px - 3:.1f}" y="{mt + 10 + 12 * i}" font-size="10" fill="#555" '
                    f'text-anchor="{"start" if right else "end"}">{escape(label)}</text>')
    body += _legend([(n, PALETTE[i % len(PALETTE)]) for i, (n, _s) in enumerate(thinned)], ml, 32)
    return _svg(title, h, body)


def _segments(s: list[tuple]) -> list[list[tuple[float, float]]]:
    """A series' runs of points between its breaks (points whose y is None)."""
    out: list[list[tuple[float, float]]] = [[]]
    for x, y in s:
        if y is None:
            if out[-1]:
                out.append([])
        else:
            out[-1].append((x, y))
    return [seg for seg in out if seg]


def hbars(title: str, bars: list[tuple[str, float, bool]], x_label: str, bad_note: str = "did not settle") -> str:
    """Horizontal bars (label, value, ok) on a ticked axis; bars that are not ok are drawn hatched red."""
    if not bars:
        return empty(title)
    ml, mt, row = 230, 28, 18
    h = mt + row * len(bars) + 44
    sx = Scale(0, max(max(v for _l, v, _ok in bars), 1e-9), ml, W - 70)
    body = ['<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
            '<rect width="6" height="6" fill="#f4c7c3"/><line x1="0" y1="0" x2="0" y2="6" stroke="#d62728" '
            'stroke-width="3"/></pattern></defs>']
    body += _x_axis(sx, mt + row * len(bars) + 4, x_label, top=mt)
    for i, (label, v, ok) in enumerate(bars):
        y = mt + i * row
        wbar = max(sx(v) - ml, 1)
        body.append(f'<text x="{ml - 6}" y="{y + 12}" font-size="11" text-anchor="end">{escape(label)}</text>')
        body.append(f'<rect x="{ml}" y="{y + 2}" width="{wbar:.1f}" height="13" fill="{"#2ca02c" if ok else "url(#hatch)"}"/>')
        body.append(f'<text x="{ml + wbar + 4:.1f}" y="{y + 12}" font-size="10">{fmt(v)}{"" if ok else " (" + bad_note + ")"}</text>')
    return _svg(title, h, body)


def gantt(title: str, rows: list[tuple[str, float, float, str]], window_min: float, stop_min: float,
          marks: Sequence[tuple[float, str]] = ()) -> str:
    """Phases as bars over the window's minutes (label, start, end, status), with the stop minute,
    the window's end and the restore reservation between them, plus labelled marks (an abort)."""
    if not rows:
        return empty(title)
    ml, mt, row = 150, 58, 15
    plot_bottom = mt + row * len(rows) + 4
    h = plot_bottom + 56
    sx = Scale(0, window_min, ml, W - 20, target=9, tight=True)
    # the band's name sits above the stop and end labels, on a row of its own
    body = [f'<rect x="{sx(stop_min):.1f}" y="{mt - 6}" width="{sx(window_min) - sx(stop_min):.1f}" '
            f'height="{plot_bottom - mt + 6}" fill="#f3ecff"/>',
            f'<text x="{(sx(stop_min) + sx(window_min)) / 2:.1f}" y="{mt - 34}" font-size="10" fill="#5b3f8c" '
            f'text-anchor="middle">restore reservation</text>']
    body += _x_axis(sx, plot_bottom, "window minute (min)", top=mt - 6)
    for x, label, colour in ((stop_min, f"stop {fmt(stop_min)}", "#b8860b"), (window_min, f"end {fmt(window_min)}", "#444")):
        body.append(f'<line x1="{sx(x):.1f}" y1="{mt - 24}" x2="{sx(x):.1f}" y2="{plot_bottom}" stroke="{colour}" '
                    f'stroke-width="1.5" stroke-dasharray="5 3"/>')
        body.append(f'<text x="{sx(x) - 3:.1f}" y="{mt - 16}" font-size="10" fill="{colour}" text-anchor="end">'
                    f'{escape(label)}</text>')
    for x, label in marks:
        body.append(f'<line x1="{sx(x):.1f}" y1="{mt - 6}" x2="{sx(x):.1f}" y2="{plot_bottom}" stroke="#d62728" stroke-width="2"/>')
        body.append(f'<text x="{sx(x) + 3:.1f}" y="{mt + 4}" font-size="10" fill="#d62728">{escape(label)}</text>')
    for i, (label, start, end, status) in enumerate(rows):
        y = mt + i * row
        x0, x1 = sx(start), sx(max(end, start))
        body.append(f'<text x="{ml - 6}" y="{y + 11}" font-size="10.5" text-anchor="end">{escape(label)}</text>')
        body.append(f'<rect x="{x0:.1f}" y="{y + 2}" width="{max(x1 - x0, 1.5):.1f}" height="11" '
                    f'fill="{STATUS_FILL.get(status, "#1f77b4")}"><title>{escape(label)}: minute {start:.1f} to '
                    f'{end:.1f} ({escape(status)})</title></rect>')
    body += _legend([(s, c) for s, c in STATUS_FILL.items()] + [("restore", "#1f77b4")], ml, h - 6)
    return _svg(title, h, body)


def _bucket_max(s: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """At most MAX_POINTS columns: consecutive points share one, at their largest value (a panel of
    10^5 requests shows where any reuse happened, as a sample could not)."""
    if len(s) <= MAX_POINTS:
        return s
    step = math.ceil(len(s) / MAX_POINTS)
    return [(s[i][0], max(y for _x, y in s[i:i + step])) for i in range(0, len(s), step)]


def columns_grid(title: str, panels: list[tuple[str, list[tuple[float, float]]]], x_label: str, y_label: str,
                 per_row: int = 2) -> str:
    """Small multiples: one column chart per panel (name, [(x, y)]), on a shared y scale, each with
    its own x ticks; a panel whose values are all zero says so on its face."""
    panels = [(n, s) for n, s in panels if s]
    if not panels:
        return empty(title)
    pw, ph, ml = (W - 10) / per_row, 170, 62
    ymax = max(max(y for _x, y in s) for _n, s in panels)
    rows = math.ceil(len(panels) / per_row)
    h = 26 + rows * ph
    body: list[str] = []
    for i, (name, s) in enumerate(panels):
        ox, oy = 10 + (i % per_row) * pw, 26 + (i // per_row) * ph
        xs = [x for x, _y in s]
        sx = Scale(min(xs) - 0.5, max(xs) + 0.5, ox + ml, ox + pw - 12, tight=True)
        sy = Scale(0, max(ymax, 1), oy + ph - 52, oy + 18, target=4)
        body.append(f'<text x="{ox + ml}" y="{oy + 10}" font-size="11" font-weight="bold">{escape(name)}</text>')
        body += _y_axis(sy, ox + ml, ox + pw - 12, y_label)
        body += _x_axis(sx, oy + ph - 52, x_label)
        bw = max(1.0, (sx.p1 - sx.p0) / max(1, (sx.hi - sx.lo)) * 0.8)
        for x, y in _bucket_max(s):
            if y:
                body.append(f'<rect x="{sx(x) - bw / 2:.1f}" y="{sy(y):.1f}" width="{bw:.1f}" '
                            f'height="{sy(0) - sy(y):.1f}" fill="{PALETTE[0]}"/>')
        if not any(y for _x, y in s):
            body.append(f'<text x="{(sx.p0 + sx.p1) / 2:.1f}" y="{(sy.p0 + sy.p1) / 2:.1f}" font-size="12" '
                        f'fill="#8c1d18" text-anchor="middle">0 on all {len(s)} requests</text>')
    return _svg(title, h, body)


def hbars_grid(title: str, panels: list[tuple[str, list[tuple[str, float, str]]]], x_label: str,
               per_row: int = 2, max_value: float | None = None, value_fmt=fmt) -> str:
    """Small multiples of horizontal bars: one panel per name, bars (label, value, note) on a
    ticked x axis (shared when `max_value` is given, as for percentages)."""
    panels = [(n, b) for n, b in panels if b]
    if not panels:
        return empty(title)
    pw, ml, row = (W - 10) / per_row, 110, 15
    nrows = max(len(b) for _n, b in panels)
    ph = 30 + row * nrows + 44
    h = 24 + math.ceil(len(panels) / per_row) * ph
    body: list[str] = []
    for i, (name, bars) in enumerate(panels):
        ox, oy = 10 + (i % per_row) * pw, 24 + (i // per_row) * ph
        top = oy + 22
        sx = Scale(0, max_value if max_value is not None else max(max(v for _l, v, _n in bars), 1), ox + ml,
                   ox + pw - 70, target=max(2, int((pw - ml - 70) / 55)))
        body.append(f'<text x="{ox + 4}" y="{oy + 10}" font-size="11" font-weight="bold">{escape(name)}</text>')
        body += _x_axis(sx, top + row * nrows + 2, x_label, top=top, unit_fmt=value_fmt)
        for k, (label, v, note) in enumerate(bars):
            y = top + k * row
            body.append(f'<text x="{ox + ml - 5}" y="{y + 10}" font-size="10" text-anchor="end">{escape(label)}</text>')
            body.append(f'<rect x="{sx.p0:.1f}" y="{y + 2}" width="{max(sx(v) - sx.p0, 0.8 if v else 0):.1f}" '
                        f'height="10" fill="{PALETTE[0]}"/>')
            if note:
                body.append(f'<text x="{max(sx(v), sx.p0) + 3:.1f}" y="{y + 10}" font-size="9.5" fill="#333">{escape(note)}</text>')
    return _svg(title, h, body)


def ranges(title: str, panels: list[tuple[str, list[tuple[str, float | None, float | None]]]], x_label: str) -> str:
    """Per panel, one row per label with its p50 (dot) and p90 (end of the line) on a shared axis."""
    shown = [(n, [(label, p50, p90) for label, p50, p90 in rs if p50 is not None]) for n, rs in panels]
    shown = [(n, rs) for n, rs in shown if rs]
    if not shown:
        return empty(title)
    vmax = max(max((p90 if p90 is not None else p50) for _label, p50, p90 in rs) for _n, rs in shown)
    pw, ml, row = (W - 10) / len(shown), 128, 14
    nrows = max(len(rs) for _n, rs in shown)
    h = 26 + 22 + row * nrows + 48
    body: list[str] = []
    for i, (name, rs) in enumerate(shown):
        ox, top = 10 + i * pw, 48
        sx = Scale(0, vmax, ox + ml, ox + pw - 14, target=4)
        body.append(f'<text x="{ox + 4}" y="{top - 12}" font-size="11" font-weight="bold">{escape(name)}</text>')
        body += _x_axis(sx, top + row * nrows + 2, x_label, top=top)
        for k, (label, p50, p90) in enumerate(rs):
            y = top + k * row + 7
            body.append(f'<text x="{ox + ml - 5}" y="{y + 3.5}" font-size="10" text-anchor="end">{escape(label)}</text>')
            if p90 is not None:
                body.append(f'<line x1="{sx(p50):.1f}" y1="{y}" x2="{sx(p90):.1f}" y2="{y}" stroke="{PALETTE[0]}" stroke-width="2"/>'
                            f'<line x1="{sx(p90):.1f}" y1="{y - 4}" x2="{sx(p90):.1f}" y2="{y + 4}" stroke="{PALETTE[0]}" stroke-width="2"/>')
            body.append(f'<circle cx="{sx(p50):.1f}" cy="{y}" r="3.5" fill="{PALETTE[1]}"/>')
    body += _legend([("p50", PALETTE[1]), ("p90 (bar end)", PALETTE[0])], 10 + ml, h - 4)
    return _svg(title, h, body)


def guard(title: str, points: list[tuple[float, float, bool]], threshold: float, y_label: str,
          spans: Sequence[tuple[float, float, str]] = (), marks: Sequence[tuple[float, str]] = ()) -> str:
    """A steady-state guard over the window: its value at each evaluation (a breach drawn red), its
    threshold as a dashed line, the phases as shaded spans (start, end, label) and labelled marks."""
    if not points:
        return empty(title)
    ml, mt, h = 80, 40, 290
    xs = [p[0] for p in points] + [m[0] for m in marks] + [x for s in spans for x in s[:2]]
    sx = Scale(min(xs), max(xs), ml, W - 20)
    ys = [p[1] for p in points] + [threshold]
    lo = min(0.0, min(ys))
    sy = Scale(lo, max(max(ys) * 1.1, lo + 1e-9), h - 70, mt)
    body: list[str] = []
    for i, (x0, x1, label) in enumerate(spans):
        body.append(f'<rect x="{sx(x0):.1f}" y="{mt}" width="{max(sx(x1) - sx(x0), 1):.1f}" height="{h - 70 - mt}" '
                    f'fill="{"#eef4fb" if i % 2 == 0 else "#f6f6f6"}"><title>{escape(label)}</title></rect>')
    body += _y_axis(sy, ml, W - 20, y_label) + _x_axis(sx, h - 70, "window minute (min)")
    ty = sy(threshold)
    body.append(f'<line x1="{ml}" y1="{ty:.1f}" x2="{W - 20}" y2="{ty:.1f}" stroke="#d62728" stroke-dasharray="6 3"/>')
    body.append(f'<text x="{W - 22}" y="{ty - 4:.1f}" font-size="10" fill="#d62728" text-anchor="end">'
                f'threshold {escape(fmt(threshold))}</text>')
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _b in _thin(points))
    body.append(f'<polyline fill="none" stroke="{PALETTE[0]}" stroke-width="1.6" points="{path}"/>')
    for x, y, bad in points:
        if bad:
            body.append(f'<circle class="breach" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.2" fill="#d62728">'
                        f'<title>breach at minute {x:.2f}: {escape(fmt(y))}</title></circle>')
    for i, (x, label) in enumerate(marks):
        px = sx(x)
        body.append(f'<line x1="{px:.1f}" y1="{mt}" x2="{px:.1f}" y2="{h - 70}" stroke="#888" stroke-dasharray="4 3"/>')
        body.append(f'<text x="{px + 3:.1f}" y="{mt + 10 + 12 * i}" font-size="10" fill="#555">{escape(label)}</text>')
    body += _legend([("value", PALETTE[0]), ("breach", "#d62728")], ml, h - 8)
    return _svg(title, h, body)


def settle(title: str, rows: Sequence[tuple[str, float | None, bool, float | None, bool]], limit: float | None,
           x_label: str) -> str:
    """Time to settle per row (label, before, settled, after, settled): a hollow mark before, a filled one
    after, on an axis that always reaches the limit, drawn as a dashed red line; a drain that did not
    settle is a red cross at the value it gave up at."""
    if not rows:
        return empty(title)
    ml, mt, row = 170, 40, 15
    plot_bottom = mt + row * len(rows) + 4
    h = plot_bottom + 58
    values = [v for r in rows for v in (r[1], r[3]) if v is not None]
    sx = Scale(0, max([*values, limit or 0, 1e-9]), ml, W - 30)
    body = _x_axis(sx, plot_bottom, x_label, top=mt - 4)
    if limit:
        lx = sx(limit)
        body.append(f'<line class="limit" x1="{lx:.1f}" y1="{mt - 14}" x2="{lx:.1f}" y2="{plot_bottom}" stroke="#d62728" '
                    f'stroke-width="1.5" stroke-dasharray="6 3"/>')
        body.append(f'<text x="{lx - 3:.1f}" y="{mt - 18}" font-size="10" fill="#d62728" text-anchor="end">'
                    f'limit {escape(fmt(limit))} s</text>')
    for i, (label, before, ok_b, after, ok_a) in enumerate(rows):
        y = mt + i * row + 7
        body.append(f'<text class="row" x="{ml - 6}" y="{y + 3.5}" font-size="10.5" text-anchor="end">{escape(label)}</text>')
        for v, ok, filled, when in ((before, ok_b, False, "before"), (after, ok_a, True, "after")):
            if v is None:
                continue
            tip = f"<title>{escape(label)}, {when}: {fmt(v)} s{'' if ok else ', did not settle'}</title>"
            x = sx(v) + (2.5 if filled else -2.5)  # side by side where both settled at the same poll
            if not ok:
                body.append(f'<path class="unsettled" d="M{x - 4:.1f},{y - 4} l8,8 m0,-8 l-8,8" stroke="#d62728" '
                            f'stroke-width="2">{tip}</path>')
            else:
                fill = PALETTE[0] if filled else "white"
                body.append(f'<circle cx="{x:.1f}" cy="{y}" r="3.4" fill="{fill}" stroke="{PALETTE[0]}" '
                            f'stroke-width="1.4">{tip}</circle>')
    body += ['<circle cx="{0}" cy="{1}" r="3.4" fill="white" stroke="{2}" stroke-width="1.4"/>'.format(ml + 4, h - 10, PALETTE[0]),
             f'<text x="{ml + 12}" y="{h - 6}" font-size="11">before the phase</text>',
             f'<circle cx="{ml + 124}" cy="{h - 10}" r="3.4" fill="{PALETTE[0]}"/>',
             f'<text x="{ml + 132}" y="{h - 6}" font-size="11">after it</text>',
             f'<text x="{ml + 190}" y="{h - 6}" font-size="11" fill="#d62728">× did not settle</text>']
    return _svg(title, h, body)
