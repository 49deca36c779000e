"""Lay a pipeline's DAG out for an inline SVG: columns by depth, rows within a column.

Pure and small on purpose: a definition has tens of nodes, not thousands, and a
layered left-to-right drawing is what people read best for that size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NODE_W, NODE_H = 184, 46
GAP_X, GAP_Y = 64, 22
PAD = 16


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    kind: str
    body: str
    status: str
    detail: str
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Edge:
    path: str
    label: str
    label_x: int
    label_y: int


@dataclass(frozen=True, slots=True)
class Dag:
    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int
    node_w: int = NODE_W
    node_h: int = NODE_H


def _depths(ids: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Longest distance from a root; nodes left on a cycle keep the depth reached."""
    depth = dict.fromkeys(ids, 0)
    for _ in range(len(ids)):
        changed = False
        for source, target in edges:
            if source in depth and target in depth and depth[target] < depth[source] + 1:
                depth[target] = depth[source] + 1
                changed = True
        if not changed:
            break
    return depth


def layout(
    definition: Mapping[str, Any],
    statuses: Mapping[str, str] | None = None,
    details: Mapping[str, str] | None = None,
) -> Dag:
    """Positions of the nodes and paths of the edges of a stored definition."""
    nodes = [n for n in definition.get("nodes", []) if isinstance(n, Mapping)]
    ids = [str(n.get("id")) for n in nodes]
    raw_edges = [e for e in definition.get("edges", []) if isinstance(e, Mapping)]
    pairs = [(str(e.get("from")), str(e.get("to"))) for e in raw_edges]
    depth = _depths(ids, pairs)
    columns: dict[int, list[str]] = {}
    for node_id in ids:
        columns.setdefault(depth[node_id], []).append(node_id)
    pos: dict[str, tuple[int, int]] = {}
    for col, members in columns.items():
        for row, node_id in enumerate(members):
            pos[node_id] = (PAD + col * (NODE_W + GAP_X), PAD + row * (NODE_H + GAP_Y))
    laid = [
        Node(
            id=node_id,
            kind=str(n.get("kind", "")),
            body=str(n.get("bodyKey") or ""),
            status=(statuses or {}).get(node_id, ""),
            detail=(details or {}).get(node_id, ""),
            x=pos[node_id][0],
            y=pos[node_id][1],
        )
        for node_id, n in zip(ids, nodes, strict=True)
    ]
    drawn = []
    for e, (source, target) in zip(raw_edges, pairs, strict=True):
        if source not in pos or target not in pos:
            continue
        x1, y1 = pos[source][0] + NODE_W, pos[source][1] + NODE_H // 2
        x2, y2 = pos[target][0], pos[target][1] + NODE_H // 2
        bend = max((x2 - x1) // 2, 24)
        path = f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"
        drawn.append(Edge(path, str(e.get("routeKey") or ""), (x1 + x2) // 2, (y1 + y2) // 2 - 4))
    width = max((x for x, _ in pos.values()), default=0) + NODE_W + 2 * PAD
    height = max((y for _, y in pos.values()), default=0) + NODE_H + 2 * PAD
    return Dag(laid, drawn, width, height)
