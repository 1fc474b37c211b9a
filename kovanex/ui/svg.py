"""SVG drawn on the server: the cluster graph and a health heatmap.

Pure functions of the data the API returns, so a page is the same bytes for the same
state and needs no JS charting library (the page-weight goal is 150 KB).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from kovanex.core.graph import ClusterGraph

# GAP_X leaves room between two boxes of a row for an edge label ("replica: <repo>");
# with 60 px a label ran under the boxes, which are drawn over the edges
NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 220, 132, 130, 40, 16
EDGE_GAP, LABEL_GAP = 16, 7  # between two edges of one pair; from an edge to its label
LABEL_CHAR_W = 6.5  # a generous mean width of an 11 px sans-serif character
STATUS_STROKE = {"alive": "#1b5e20", "suspect": "#e65100", "dead": "#212121"}


def health_colour(score: float | None) -> str:
    """Red (0) through amber to green (1); grey when unknown."""
    if score is None or (isinstance(score, float) and math.isnan(score)):
        return "#bdbdbd"
    s = min(max(float(score), 0.0), 1.0)
    return f"hsl({round(120 * s)},65%,{round(78 - 18 * s)}%)"


def _t(x: float, y: float, text: str, cls: str = "", size: int = 12) -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.0f}" y="{y:.0f}" font-size="{size}"{c}>{escape(text)}</text>'


def _clip(box: tuple[float, float], toward: tuple[float, float]) -> tuple[float, float]:
    """Where the line from this box's centre to the other box's centre leaves this box."""
    cx, cy = box[0] + NODE_W / 2, box[1] + NODE_H / 2
    dx, dy = toward[0] - box[0], toward[1] - box[1]
    if dx == 0 and dy == 0:
        return cx, cy
    t = min((NODE_W / 2) / abs(dx) if dx else math.inf, (NODE_H / 2) / abs(dy) if dy else math.inf)
    return cx + dx * t, cy + dy * t


def _lanes(edges: Sequence[Any]) -> dict[int, float]:
    """Edges between the same two nodes (an env hop and a replication, either way round)
    each get their own lane: offsets across the line, centred on it, EDGE_GAP apart."""
    pairs: dict[frozenset[str], list[Any]] = {}
    for e in edges:
        pairs.setdefault(frozenset((e.src, e.dst)), []).append(e)
    out: dict[int, float] = {}
    for group in pairs.values():
        for i, e in enumerate(group):
            out[id(e)] = (i - (len(group) - 1) / 2) * EDGE_GAP
    return out


def _normal(a: tuple[float, float], b: tuple[float, float], forward: bool) -> tuple[float, float]:
    """The unit normal of a-b, taken for the pair's name order (`forward`), so a->b and b->a
    share one frame and their lanes never land on each other."""
    dx, dy = (b[0] - a[0], b[1] - a[1]) if forward else (a[0] - b[0], a[1] - b[1])
    n = math.hypot(dx, dy) or 1.0
    return -dy / n, dx / n


def fit_label(label: str, a: tuple[float, float], b: tuple[float, float]) -> str:
    """The label cut (with an ellipsis) to the stretch of its edge between the two boxes,
    so no box hides part of it; the whole label is the edge's <title>."""
    room = int(max(math.hypot(b[0] - a[0], b[1] - a[1]) - 8, 0) / LABEL_CHAR_W)
    if len(label) <= room:
        return label
    return label[: max(room - 1, 1)] + "…"


def _crosses(a: tuple[float, float], b: tuple[float, float], box: tuple[float, float]) -> bool:
    """Whether the segment a-b passes through the box (sampled: boxes are large)."""
    for i in range(1, 64):
        t = i / 64
        x, y = a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t
        if box[0] - 4 <= x <= box[0] + NODE_W + 4 and box[1] - 4 <= y <= box[1] + NODE_H + 4:
            return True
    return False


def _centre(box: tuple[float, float]) -> tuple[float, float]:
    return box[0] + NODE_W / 2, box[1] + NODE_H / 2


def _detour(e: Any, pos: Mapping[str, tuple[float, float]]) -> bool:
    """A straight edge would run under another node's box (wu1 -> wu3 past wu2 in one
    row): it is drawn as a curve below them instead, or it would not be seen at all."""
    a, b = _centre(pos[e.src]), _centre(pos[e.dst])
    return any(_crosses(a, b, box) for n, box in pos.items() if n not in (e.src, e.dst))


def _edge(e: Any, pos: Mapping[str, tuple[float, float]], lane: float) -> str:
    """One edge: a straight line in its lane, or a curve around the boxes in between, with
    its label beside it (cut to fit) and the whole label as its <title>."""
    dash = "" if e.kind == "env" else ' stroke-dasharray="5 4"'
    label = "promote" if e.kind == "env" else "replica: " + ", ".join(e.repos)
    if _detour(e, pos):
        ca, cb = _centre(pos[e.src]), _centre(pos[e.dst])
        nx, ny = _normal(ca, cb, e.src < e.dst)
        if ny < 0 or (ny == 0 and nx < 0):
            nx, ny = -nx, -ny  # always bend downward, into the gap under the row
        bend = NODE_H / 2 + GAP_Y / 2 + abs(lane)  # the apex clears the boxes' bottoms
        mx, my = (ca[0] + cb[0]) / 2, (ca[1] + cb[1]) / 2
        cx, cy = mx + nx * 2 * bend, my + ny * 2 * bend  # a quadratic's apex is half-way
        toward = (cx - NODE_W / 2, cy - NODE_H / 2)
        a, b = _clip(pos[e.src], toward), _clip(pos[e.dst], toward)
        shape = (f'<path d="M{a[0]:.0f},{a[1]:.0f} Q{cx:.0f},{cy:.0f} {b[0]:.0f},{b[1]:.0f}" '
                 f'fill="none"')  # fmt: skip
        lx, ly = mx + nx * (bend + LABEL_GAP + 4), my + ny * (bend + LABEL_GAP + 4)
        text = fit_label(label, a, b)
    else:
        a, b = _clip(pos[e.src], pos[e.dst]), _clip(pos[e.dst], pos[e.src])
        nx, ny = _normal(a, b, e.src < e.dst)
        x1, y1, x2, y2 = a[0] + nx * lane, a[1] + ny * lane, b[0] + nx * lane, b[1] + ny * lane
        shape = f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}"'
        off = lane + (LABEL_GAP if lane >= 0 else -LABEL_GAP)  # beside its own line, outward
        lx, ly = (a[0] + b[0]) / 2 + nx * off, (a[1] + b[1]) / 2 + ny * off
        text = fit_label(label, a, b)
    return (
        f'<g class="edge edge-{e.kind}" data-src="{escape(e.src)}" data-dst="{escape(e.dst)}">'
        f'{shape} stroke="#555" stroke-width="2"{dash} marker-end="url(#arr)"/>'
        f'<text x="{lx:.0f}" y="{ly:.0f}" font-size="11" class="edge-label" '
        f'text-anchor="middle">{escape(text)}</text>'
        f"<title>{escape(e.kind)} {escape(e.src)} → {escape(e.dst)}: {escape(label)}</title>"
        "</g>"
    )


def cluster_svg(members: Sequence[Mapping[str, Any]], here: str, per_row: int = 4) -> str:
    """One box per node (fill = health, border = gossip state), env and replication edges.

    Each node is a link to its page, and carries data-node/data-status so the DOM (and a
    browser test) can read the state without parsing colours.
    """
    g = ClusterGraph.from_members(members)
    order = g.column_order()
    pos: dict[str, tuple[float, float]] = {}
    for i, v in enumerate(order):
        col, row = i % per_row, i // per_row
        pos[v.name] = (PAD + col * (NODE_W + GAP_X), PAD + row * (NODE_H + GAP_Y))
    cols = min(len(order), per_row) or 1
    rows = max(1, math.ceil(len(order) / per_row))
    width = PAD * 2 + cols * NODE_W + (cols - 1) * GAP_X
    height = PAD * 2 + rows * NODE_H + (rows - 1) * GAP_Y
    if any(_detour(e, pos) for e in g.edges):
        height += GAP_Y  # room under the last row for an edge bent around a box
    by_name = {str(m["name"]): m for m in members}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="cluster-graph" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}">',
        "<title>cluster graph</title>",
        '<defs><marker id="arr" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0L10,5L0,10z" fill="#555"/></marker></defs>',
    ]
    lanes = _lanes(g.edges)
    for e in g.edges:
        out.append(_edge(e, pos, lanes[id(e)]))
    for v in order:
        x, y = pos[v.name]
        m = by_name.get(v.name, {})
        stroke = STATUS_STROKE.get(v.status, "#616161")
        dash = ' stroke-dasharray="8 4"' if v.status == "suspect" else ""
        fill = "#9e9e9e" if v.status == "dead" else health_colour(v.health)
        labels = " ".join(f"{k}={val}" for k, val in sorted(v.labels.items())) or "no labels"
        repos = ", ".join(v.repos_owned) or "-"
        replicas = ", ".join(v.repos_replica) or "-"
        me = " (this node)" if v.name == here else ""
        cordon = " cordoned" if m.get("cordoned") else ""
        out += [
            f'<a href="/ui/nodes/{escape(v.name)}" class="node" data-node="{escape(v.name)}" '
            f'data-status="{escape(v.status)}" data-health="{v.health:.2f}">',
            f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="8" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="3"{dash}/>',
            _t(x + 10, y + 20, v.name + me, "name", 15),
            _t(x + 10, y + 38, f"{v.role} · {v.status}{cordon} · health {v.health:.2f}"),
            _t(x + 10, y + 56, labels),
            _t(x + 10, y + 74, f"owns: {repos}"),
            _t(x + 10, y + 92, f"replicas: {replicas}"),
            _t(x + 10, y + 110, f"runner units: {v.runners_used}/{v.runners_total} busy"),
            "</a>",
        ]
    out.append("</svg>")
    return "\n".join(out)


def heatmap_svg(matrix: Mapping[str, Sequence[float | None]], cell: int = 10) -> str:
    """Metric × time: one row per metric (oldest sample left), each row scaled to its own
    range so a CPU percentage and a queue length share one picture."""
    if not matrix:
        return '<p class="empty">no samples yet</p>'
    label_w = 130
    cols = max(len(r) for r in matrix.values())
    width, height = label_w + cols * cell + 4, len(matrix) * (cell + 2) + 4
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" viewBox="0 0 {width} '
        f'{height}" width="{width}" height="{height}">'
    ]
    for r, (metric, row) in enumerate(sorted(matrix.items())):
        known = [float(v) for v in row if v is not None]
        lo, hi = (min(known), max(known)) if known else (0.0, 0.0)
        y = 2 + r * (cell + 2)
        out.append(_t(2, y + cell - 1, metric, "metric", 10))
        for c, val in enumerate(row):
            if val is None:
                colour = "#eeeeee"
            else:
                frac = 0.5 if hi == lo else (float(val) - lo) / (hi - lo)
                colour = f"hsl(220,70%,{round(92 - 62 * frac)}%)"
            out.append(
                f'<rect x="{label_w + c * cell}" y="{y}" width="{cell - 1}" height="{cell}" '
                f'fill="{colour}"><title>{escape(metric)} = {val}</title></rect>'
            )
    out.append("</svg>")
    return "".join(out)
