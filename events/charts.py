"""Inline SVG charts for reports: deterministic text, no scripts, no fonts or images fetched."""

from __future__ import annotations

from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")
W, H = 720, 260
ML, MR, MT, MB = 70, 160, 30, 40  # margins: left (y labels), right (legend), top (title), bottom (x labels)


def _num(v: float) -> str:
    """Compact, stable number text (no locale, no float noise)."""
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.0f}k"
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def _frame(title: str, x_label: str, y_label: str, x0: float, x1: float, y1: float) -> list[str]:
    pw, ph = W - ML - MR, H - MT - MB
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
           f'role="img" aria-label="{escape(title)}">',
           f'<text x="{ML}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
           f'<line x1="{ML}" y1="{MT + ph}" x2="{ML + pw}" y2="{MT + ph}" stroke="#444"/>',
           f'<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{MT + ph}" stroke="#444"/>']
    for i in range(5):
        y = MT + ph - ph * i / 4
        out.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{ML - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{_num(y1 * i / 4)}</text>')
    out.append(f'<text x="{ML}" y="{H - 8}" font-size="10">{_num(x0)}</text>')
    out.append(f'<text x="{ML + pw}" y="{H - 8}" font-size="10" text-anchor="end">{_num(x1)}</text>')
    out.append(f'<text x="{ML + pw / 2:.1f}" y="{H - 8}" font-size="11" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text x="14" y="{MT + ph / 2:.1f}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 14 {MT + ph / 2:.1f})">{escape(y_label)}</text>')
    return out


def _legend(names: list[str]) -> list[str]:
    out = []
    for i, name in enumerate(names):
        y = MT + 8 + i * 16
        c = PALETTE[i % len(PALETTE)]
        out.append(f'<rect x="{W - MR + 12}" y="{y - 8}" width="10" height="10" fill="{c}"/>')
        out.append(f'<text x="{W - MR + 28}" y="{y + 1}" font-size="11">{escape(name)}</text>')
    return out


MAX_POINTS = 600  # per series: a chart 560 px wide shows no more, and long windows have 10^5 points


def _thin(s: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(s) <= MAX_POINTS:
        return s
    step = len(s) / (MAX_POINTS - 1)
    return [s[int(i * step)] for i in range(MAX_POINTS - 1)] + [s[-1]]


def lines(title: str, series: list[tuple[str, list[tuple[float, float]]]], x_label: str, y_label: str,
          marks: list[tuple[float, str]] = ()) -> str:  # type: ignore[assignment]
    """Polylines, one per named series of (x, y) points, with dashed vertical marks (x, label);
    an empty chart says there is no data."""
    series = [(n, _thin(s)) for n, s in series]
    pts = [p for _n, s in series for p in s]
    if not pts:
        return _empty(title)
    xs = [p[0] for p in pts] + [m[0] for m in marks]
    x0, x1 = min(xs), max(xs)
    y1 = max(max(p[1] for p in pts), 1)
    pw, ph = W - ML - MR, H - MT - MB
    sx = (lambda x: ML + (x - x0) / (x1 - x0) * pw) if x1 > x0 else (lambda x: ML + pw / 2)
    sy = lambda y: MT + ph - y / y1 * ph  # noqa: E731
    out = _frame(title, x_label, y_label, x0, x1, y1)
    for i, (_name, s) in enumerate(series):
        c = PALETTE[i % len(PALETTE)]
        if len(s) == 1:
            out.append(f'<circle cx="{sx(s[0][0]):.1f}" cy="{sy(s[0][1]):.1f}" r="3" fill="{c}"/>')
        elif s:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
            out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.8" points="{path}"/>')
    for i, (x, label) in enumerate(marks):
        px = sx(x)
        out.append(f'<line x1="{px:.1f}" y1="{MT}" x2="{px:.1f}" y2="{MT + ph}" stroke="#888" stroke-dasharray="4 3"/>')
        # labels sit left of their line (clear of the legend), staggered so neighbours do not overlap
        out.append(f'<text x="{px - 3:.1f}" y="{MT + 10 + 12 * i}" font-size="10" fill="#555" '
                   f'text-anchor="end">{escape(label)}</text>')
    out += _legend([n for n, _s in series])
    out.append("</svg>")
    return "\n".join(out)


def hbars(title: str, bars: list[tuple[str, float, bool]], x_label: str) -> str:
    """Horizontal bars (label, value, ok); bars that are not ok are drawn hatched red."""
    if not bars:
        return _empty(title)
    n = len(bars)
    h = MT + MB + 18 * n
    vmax = max(max(v for _l, v, _ok in bars), 1e-9)
    pw = W - 260 - 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img" '
           f'aria-label="{escape(title)}">',
           '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
           '<rect width="6" height="6" fill="#f4c7c3"/><line x1="0" y1="0" x2="0" y2="6" stroke="#d62728" '
           'stroke-width="3"/></pattern></defs>',
           f'<text x="10" y="18" font-size="13" font-weight="bold">{escape(title)}</text>']
    for i, (label, v, ok) in enumerate(bars):
        y = MT + i * 18
        wbar = max(v / vmax * pw, 1)
        fill = "#2ca02c" if ok else "url(#hatch)"
        out.append(f'<text x="250" y="{y + 12}" font-size="11" text-anchor="end">{escape(label)}</text>')
        out.append(f'<rect x="260" y="{y + 2}" width="{wbar:.1f}" height="13" fill="{fill}"/>')
        out.append(f'<text x="{264 + wbar:.1f}" y="{y + 12}" font-size="10">{_num(v)} s{"" if ok else " (timed out)"}</text>')
    out.append(f'<text x="260" y="{h - 10}" font-size="11">{escape(x_label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _empty(title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} 60" width="{W}" height="60" role="img" '
            f'aria-label="{escape(title)}"><text x="10" y="18" font-size="13" font-weight="bold">{escape(title)}</text>'
            f'<text x="10" y="42" font-size="12" fill="#666">no data recorded</text></svg>')
