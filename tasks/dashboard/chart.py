"""The start-rate chart as inline SVG, drawn on the server (no script, no build step).

Per minute of the last hour: grants and denials as bars, the rate the bucket reported
as a line (all in starts per minute, so one axis serves), penalties as red marks.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

from tasks.acquisition.starthistory import Sample

WIDTH, HEIGHT = 760, 240
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 22, 30
GRANT_FILL, DENIAL_FILL, RATE_STROKE, PENALTY_FILL = "#3a8f4b", "#d08a2e", "#2d5fa8", "#c0392b"


def _nice_max(value: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten at or above `value` (at least 1)."""
    step = 1.0
    while True:
        for m in (1, 2, 5):
            if m * step >= value:
                return m * step
        step *= 10


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def render(bucket: str, samples: Sequence[Sample]) -> Markup:
    """One bucket's chart; `samples` oldest first, one per minute."""
    n = max(len(samples), 1)
    peak = max([1.0, *(max(s.grants, s.denials, s.rate or 0.0) for s in samples)])
    top = _nice_max(peak)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / n
    bar = max(slot / 2 - 0.5, 0.5)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - min(value, top) / top)

    name = escape(bucket)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} '
           f'{HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
           f'aria-label="start rate of bucket {name}" data-bucket="{name}">',
           f"<title>Starts per minute, bucket {name}, last {n} minutes</title>"]
    for frac in (0.0, 0.5, 1.0):
        gy = y(top * frac)
        out.append(f'<line x1="{LEFT}" y1="{gy:.1f}" x2="{WIDTH - RIGHT}" y2="{gy:.1f}" '
                   f'stroke="#ddd" stroke-width="1"/>')
        out.append(f'<text x="{LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end" font-size="11" '
                   f'fill="#555">{_num(top * frac)}</text>')
    for i in range(0, n + 1, 15):
        gx = LEFT + slot * i
        label = "now" if i == n else f"-{n - i}m"
        out.append(f'<text x="{gx:.1f}" y="{HEIGHT - 10}" text-anchor="middle" font-size="11" '
                   f'fill="#555">{label}</text>')
    points, dots = [], []
    for i, s in enumerate(samples):
        x0 = LEFT + slot * i
        when = s.minute.strftime("%H:%M UTC")
        if s.grants:
            out.append(f'<rect class="grants" data-count="{s.grants}" x="{x0:.1f}" '
                       f'y="{y(s.grants):.1f}" width="{bar:.1f}" '
                       f'height="{TOP + plot_h - y(s.grants):.1f}" fill="{GRANT_FILL}">'
                       f"<title>{when}: {s.grants} granted</title></rect>")
        if s.denials:
            out.append(f'<rect class="denials" data-count="{s.denials}" x="{x0 + bar:.1f}" '
                       f'y="{y(s.denials):.1f}" width="{bar:.1f}" '
                       f'height="{TOP + plot_h - y(s.denials):.1f}" fill="{DENIAL_FILL}">'
                       f"<title>{when}: {s.denials} denied</title></rect>")
        if s.penalties:
            cx = x0 + slot / 2
            out.append(f'<path class="penalty" data-count="{s.penalties}" '
                       f'd="M{cx - 5:.1f},{TOP - 12} h10 l-5,9 z" fill="{PENALTY_FILL}">'
                       f"<title>{when}: {s.penalties} penalty</title></path>")
        if s.rate is not None:
            px, py = x0 + slot / 2, y(s.rate)
            points.append(f"{px:.1f},{py:.1f}")
            dots.append(f'<circle class="rate" data-rate="{_num(s.rate)}" cx="{px:.1f}" '
                       f'cy="{py:.1f}" r="2.5" fill="{RATE_STROKE}">'
                       f"<title>{when}: rate {_num(s.rate)}/min</title></circle>")
    if len(points) > 1:
        out.append(f'<polyline points="{" ".join(points)}" fill="none" '
                   f'stroke="{RATE_STROKE}" stroke-width="1.5"/>')
    out.extend(dots)
    out.append("</svg>")
    return Markup("".join(out))
