"""A workflow's DAG laid out in layers, left to right, and drawn as inline SVG.

The layout is computed here, in Python, so the console needs no JavaScript library: a
node's layer is the length of the longest dependency path that reaches it, and the nodes
of a layer are ordered by the mean position of their dependencies (one barycentre pass,
enough to keep the edges of a fan-out and its join from crossing). Every text in the SVG
goes through markupsafe's escape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

NODE_W, NODE_H = 168, 50
GAP_X, GAP_Y = 56, 18
PAD = 12
WAIT_TYPES = {"sleep": "sleep", "signal": "signal", "child": "child run"}


@dataclass(frozen=True)
class GraphNode:
    """One node to draw: its id and deps, and what the box says."""

    id: str
    deps: tuple[str, ...]
    type: str = "task"
    kind: str = ""
    state: str = ""  # a step's state; "" for a definition
    detail: str = ""  # e.g. the signal's name, the sleep's length
    href: str = ""  # a link (the child run of a child node)


@dataclass(frozen=True)
class Placed:
    node: GraphNode
    x: int
    y: int


def _depths(nodes: Sequence[GraphNode]) -> dict[str, int]:
    """A node's layer: 1 + the largest layer of its deps (roots: 0)."""
    by_id = {n.id: n for n in nodes}
    depth: dict[str, int] = {}
    for start in nodes:  # iterative DFS: a definition may be 10,000 nodes deep
        stack = [(start.id, False)]
        while stack:
            nid, expanded = stack.pop()
            if nid in depth:
                continue
            deps = [d for d in by_id[nid].deps if d in by_id]
            if expanded:
                depth[nid] = 1 + max((depth[d] for d in deps), default=-1)
                continue
            stack.append((nid, True))
            stack.extend((d, False) for d in deps if d not in depth)
    return depth


def layers(nodes: Sequence[GraphNode]) -> tuple[list[list[GraphNode | str]], dict[tuple[str, str], list[str]]]:
    """The nodes in layers, and the route of every edge that skips layers.

    An edge dep -> node that spans more than one layer passes through one waypoint (a str
    key) in each layer between, which takes a place in that layer's order like a node, so
    that the edge never runs through another node's box. Each layer is ordered by the mean
    row of the node's deps (or the waypoint's predecessor) in the layer before; ties keep
    definition order.
    """
    depth = _depths(nodes)
    out: list[list[GraphNode | str]] = [[] for _ in range(1 + max(depth.values(), default=-1))]
    for n in nodes:
        out[depth[n.id]].append(n)
    routes: dict[tuple[str, str], list[str]] = {}
    preds: dict[str, list[str]] = {n.id: [d for d in n.deps if d in depth] for n in nodes}
    for n in nodes:
        for d in preds[n.id]:
            if depth[n.id] - depth[d] > 1:
                prev, route = d, []
                for layer in range(depth[d] + 1, depth[n.id]):
                    key = f"\0{d}\0{n.id}\0{layer}"
                    out[layer].append(key)
                    preds[key] = [prev]
                    route.append(key)
                    prev = key
                routes[(d, n.id)] = route
                preds[n.id] = [route[-1] if p == d else p for p in preds[n.id]]
    row: dict[str, float] = {}
    for layer in out:
        keyed = []
        for i, item in enumerate(layer):
            key = item if isinstance(item, str) else item.id
            rows = [row[d] for d in preds[key] if d in row]
            keyed.append((sum(rows) / len(rows) if rows else float(i), i, item))
        keyed.sort(key=lambda k: (k[0], k[1]))
        layer[:] = [k[2] for k in keyed]
        for i, item in enumerate(layer):
            row[item if isinstance(item, str) else item.id] = float(i)
    return out, routes


def place(nodes: Sequence[GraphNode]) -> tuple[list[Placed], dict[tuple[str, str], list[tuple[int, int]]], int, int]:
    """Each node's top-left corner, each long edge's waypoints (centre points), and the drawing's size.
    Layers are centred vertically; a waypoint takes half a node's height."""
    grid, routes = layers(nodes)

    def h(item: GraphNode | str) -> int:
        return NODE_H // 2 if isinstance(item, str) else NODE_H

    spans = [sum(h(i) for i in layer) + max(0, len(layer) - 1) * GAP_Y for layer in grid]
    height = PAD * 2 + max(spans, default=0)
    placed, points = [], {}
    for col, layer in enumerate(grid):
        y = PAD + (height - 2 * PAD - spans[col]) // 2
        x = PAD + col * (NODE_W + GAP_X)
        for item in layer:
            if isinstance(item, str):
                points[item] = (x + NODE_W // 2, y + h(item) // 2)
            else:
                placed.append(Placed(item, x, y))
            y += h(item) + GAP_Y
    width = PAD * 2 + len(grid) * NODE_W + max(0, len(grid) - 1) * GAP_X
    return placed, {edge: [points[k] for k in route] for edge, route in routes.items()}, width, height


def _clip(text: str, limit: int = 22) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def svg(nodes: Sequence[GraphNode], *, title: str = "") -> Markup:
    """The graph as an <svg> element; each node is a <g class="node state-S" data-node=ID data-state=S>."""
    placed, waypoints, width, height = place(nodes)
    at = {p.node.id: p for p in placed}
    parts = [f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title or "workflow graph")}">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
             'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" class="arrowhead"/></marker></defs>']
    for p in placed:
        for dep in p.node.deps:
            d = at.get(dep)
            if d is None:
                continue
            # From the dep's right side, through the waypoints of a long edge, to the node's left side.
            stops = [(d.x + NODE_W, d.y + NODE_H // 2)]
            for cx, cy in waypoints.get((dep, p.node.id), []):
                stops += [(cx - NODE_W // 2, cy), (cx + NODE_W // 2, cy)]
            stops.append((p.x - 2, p.y + NODE_H // 2))
            path = [f"M {stops[0][0]} {stops[0][1]}"]
            for (x1, y1), (x2, y2) in zip(stops, stops[1:]):
                if y1 == y2 or x2 - x1 == NODE_W:
                    path.append(f"L {x2} {y2}")
                else:
                    mid = (x1 + x2) // 2
                    path.append(f"C {mid} {y1}, {mid} {y2}, {x2} {y2}")
            parts.append(f'<path class="edge" d="{" ".join(path)}" marker-end="url(#arrow)"/>')
    for p in placed:
        n = p.node
        wait = WAIT_TYPES.get(n.type)
        classes = ["node", f"type-{n.type}"] + ([f"state-{n.state}"] if n.state else ["def"]) + (
            ["wait"] if wait else [])
        sub = n.kind if n.type == "task" else f"{wait}{': ' + n.detail if n.detail else ''}"
        tip = f"{n.id} ({n.type}{', kind ' + n.kind if n.kind else ''}){': ' + n.state if n.state else ''}"
        group = (f'<g class="{" ".join(classes)}" data-node="{escape(n.id)}" data-state="{escape(n.state)}" '
                 f'data-type="{escape(n.type)}" transform="translate({p.x},{p.y})">'
                 f'<title>{escape(tip)}</title>'
                 f'<rect width="{NODE_W}" height="{NODE_H}" rx="7"/>'
                 f'<text class="label" x="10" y="19">{escape(_clip(n.id))}</text>'
                 f'<text class="sub" x="10" y="36">{escape(_clip(sub, 26))}</text>')
        if n.state:
            group += f'<text class="badge" x="{NODE_W - 8}" y="19" text-anchor="end">{escape(_short(n.state))}</text>'
        if wait:
            group += f'<text class="waitmark" x="{NODE_W - 8}" y="36" text-anchor="end">{_WAIT_MARK[n.type]}</text>'
        group += "</g>"
        if n.href:
            group = f'<a href="{escape(n.href)}" class="child-link">{group}</a>'
        parts.append(group)
    parts.append("</svg>")
    return Markup("".join(parts))


_WAIT_MARK = {"sleep": "\u25f7", "signal": "\u2709", "child": "\u21b3"}
_SHORT = {"waiting_signal": "waiting", "waiting_timer": "waiting", "waiting_child": "waiting"}


def _short(state: str) -> str:
    return _SHORT.get(state, state)


def from_definition(nodes: Sequence[Mapping[str, Any]]) -> list[GraphNode]:
    """Graph nodes of a stored definition ({"nodes": [...]} with every option filled in)."""
    out = []
    for n in nodes:
        detail = ""
        if n.get("type") == "sleep" and n.get("sleep") is not None:
            detail = f"{n['sleep']:g} s"
        elif n.get("type") == "signal":
            detail = str(n.get("signal") or n["id"])
        elif n.get("type") == "child":
            detail = str(n.get("workflow") or "")
        out.append(GraphNode(id=str(n["id"]), deps=tuple(n.get("deps") or ()), type=str(n.get("type") or "task"),
                             kind=str(n.get("kind") or ""), detail=detail))
    return out


def from_steps(steps: Sequence[Mapping[str, Any]]) -> list[GraphNode]:
    """Graph nodes of a run's steps (engine.get_run rows), coloured by state; a child node links to its run."""
    out = []
    for s in steps:
        detail = ""
        if s["type"] == "sleep" and s.get("sleep_for") is not None:
            detail = f"{s['sleep_for'].total_seconds():g} s"
        elif s["type"] == "signal":
            detail = str(s.get("signal_name") or "")
        elif s["type"] == "child":
            detail = str(s.get("child_workflow") or "")
        href = f"/runs/{s['child_run_id']}" if s.get("child_run_id") else ""
        out.append(GraphNode(id=str(s["node"]), deps=tuple(s.get("deps") or ()), type=str(s["type"]),
                             kind=str(s["kind"]), state=str(s["state"]), detail=detail, href=href))
    return out
