"""The dashboard's usage view, drawn here as SVG (README "Dashboard and metrics").

Pure: numbers in, SVG text out. Two panels in one picture: device-hours
per user per day as stacked bars, and the queue wait (p50 and p95) per day
as two lines. Every user-supplied string (a user name) is XML-escaped; the
picture has no script, no style element and no external reference, so the
dashboard may insert it under its Content-Security-Policy. Each bar carries
`data-day`, `data-user` and `data-seconds`, each wait point `data-day`,
`data-p50` and `data-p95`, so a test (and a curious user) can read the
numbers back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from xml.sax.saxutils import escape, quoteattr

__all__ = ["PALETTE", "usage_svg"]

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
"""Bar colours, one per user in order of their device-time (then repeated)."""

WIDTH, BAR_H, WAIT_H, LEFT, TOP, GAP = 680, 200, 120, 56, 24, 56
USERS_SHOWN = 10
"""At most this many users get their own colour; the rest are stacked as "others"."""


def _nice(top: float) -> float:
    """A round axis maximum at or above `top` (1, 2, 5 × a power of ten)."""
    if top <= 0:
        return 1.0
    step = 1.0
    while step * 10 <= top:
        step *= 10
    while step > top * 10:
        step /= 10
    for m in (1, 2, 5, 10):
        if m * step >= top:
            return m * step
    return 10 * step


def _fmt(v: float) -> str:
    return f"{v:.3f}".rstrip("0").rstrip(".") or "0"


def usage_svg(
    days: Sequence[str],
    seconds: Mapping[tuple[str, str], float],
    waits: Mapping[str, tuple[float, float]],
) -> str:
    """The usage picture.

    days: the days shown, oldest first (YYYY-MM-DD); seconds: (day, user) →
    device-seconds; waits: day → (p50, p95) seconds of the grants that day
    (a day left out had none). Returns an SVG document (text).
    """
    totals: dict[str, float] = {}
    for (_d, u), s in seconds.items():
        totals[u] = totals.get(u, 0.0) + s
    ranked = sorted(totals, key=lambda u: (-totals[u], u))
    shown = ranked[:USERS_SHOWN]
    others = set(ranked[USERS_SHOWN:])
    per_day: dict[str, float] = {d: 0.0 for d in days}
    for (d, _u), s in seconds.items():
        if d in per_day:
            per_day[d] += s
    top_h = _nice(max(per_day.values(), default=0.0) / 3600)
    n = max(1, len(days))
    slot = (WIDTH - LEFT - 16) / n
    bar_w = max(2.0, slot * 0.7)
    height = TOP + BAR_H + GAP + WAIT_H + 40
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
            f'width="{WIDTH}" height="{height}" role="img" class="usage-chart" '
            'font-family="sans-serif" font-size="11">'
        ),
        f'<text x="{LEFT}" y="14" font-weight="bold">Device-hours per user per day</text>',
    ]
    base = TOP + BAR_H
    for frac in (0, 0.5, 1):
        y = base - frac * BAR_H
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - 16}" y1="{y:.1f}" y2="{y:.1f}" stroke="#8884"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(frac * top_h)}</text>'
        )
    colour = {u: PALETTE[i % len(PALETTE)] for i, u in enumerate(shown)}
    for i, d in enumerate(days):
        x = LEFT + i * slot + (slot - bar_w) / 2
        y = base
        stack = [(u, seconds.get((d, u), 0.0)) for u in shown]
        rest = sum(s for (dd, u), s in seconds.items() if dd == d and u in others)
        if rest:
            stack.append(("others", rest))
        for u, s in stack:
            if s <= 0:
                continue
            h = s / 3600 / top_h * BAR_H
            y -= h
            fill = colour.get(u, "#999")
            label = f"{u} {d}: {_fmt(s / 3600)} device-hours"
            out.append(
                f"<rect x={quoteattr(f'{x:.1f}')} y={quoteattr(f'{y:.2f}')} "
                f"width={quoteattr(f'{bar_w:.1f}')} height={quoteattr(f'{h:.2f}')} "
                f"fill={quoteattr(fill)} data-day={quoteattr(d)} data-user={quoteattr(u)} "
                f"data-seconds={quoteattr(_fmt(s))}><title>{escape(label)}</title></rect>"
            )
        if i % max(1, n // 7) == 0 or i == n - 1:
            out.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{base + 14}" text-anchor="middle">'
                f"{escape(d[5:])}</text>"
            )
    lx = LEFT
    for u in [*shown, *(["others"] if others else [])]:
        out.append(
            f'<rect x="{lx}" y="{base + 22}" width="10" height="10" '
            f"fill={quoteattr(colour.get(u, '#999'))}/>"
            f'<text x="{lx + 14}" y="{base + 31}">{escape(u)}</text>'
        )
        lx += 24 + 7 * len(u)
    # queue wait per day: p50 and p95
    wtop = base + GAP
    wbase = wtop + WAIT_H
    top_w = _nice(max((p95 for _p50, p95 in waits.values()), default=0.0) / 60)
    out.append(f'<text x="{LEFT}" y="{wtop - 8}" font-weight="bold">Queue wait (minutes)</text>')
    for frac in (0, 0.5, 1):
        y = wbase - frac * WAIT_H
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - 16}" y1="{y:.1f}" y2="{y:.1f}" stroke="#8884"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(frac * top_w)}</text>'
        )
    for which, idx, stroke in (("p50", 0, "#4e79a7"), ("p95", 1, "#e15759")):
        pts = []
        for i, d in enumerate(days):
            if d in waits:
                x = LEFT + i * slot + slot / 2
                y = wbase - waits[d][idx] / 60 / top_w * WAIT_H
                pts.append(f"{x:.1f},{y:.1f}")
        if pts:
            out.append(
                f'<polyline points="{" ".join(pts)}" fill="none" stroke="{stroke}" '
                f'stroke-width="2" data-series="{which}"/>'
            )
    for i, d in enumerate(days):
        if d in waits:
            p50, p95 = waits[d]
            x = LEFT + i * slot + slot / 2
            y = wbase - p95 / 60 / top_w * WAIT_H
            out.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#e15759" '
                f"data-day={quoteattr(d)} data-p50={quoteattr(_fmt(p50))} "
                f"data-p95={quoteattr(_fmt(p95))}><title>{escape(d)}: p50 {_fmt(p50)} s, "
                f"p95 {_fmt(p95)} s</title></circle>"
            )
    out.append(
        f'<text x="{LEFT}" y="{wbase + 18}" fill="#4e79a7">— p50</text>'
        f'<text x="{LEFT + 60}" y="{wbase + 18}" fill="#e15759">— p95</text>'
    )
    out.append("</svg>")
    return "".join(out)
