"""The console's DAG layout (cyclone_server/console/graph.py): layers, long edges around boxes, escaping."""

from __future__ import annotations

from cyclone_server.console import graph
from cyclone_server.console.graph import NODE_H, NODE_W, GraphNode


def n(id: str, *deps: str, **kw: str) -> GraphNode:
    return GraphNode(id=id, deps=tuple(deps), **kw)


def test_a_node_sits_one_layer_after_its_deepest_dep() -> None:
    grid, routes = graph.layers([n("a"), n("b", "a"), n("c", "a"), n("d", "b", "c"), n("e", "a", "d")])
    ids = [[i if isinstance(i, str) else i.id for i in layer] for layer in grid]
    assert [[x for x in layer if not x.startswith("\0")] for layer in ids] == [["a"], ["b", "c"], ["d"], ["e"]]
    assert len(routes[("a", "e")]) == 2  # a -> e skips two layers: one waypoint in each
    assert set(routes) == {("a", "e")}


def test_long_edges_pass_beside_the_boxes_not_through_them() -> None:
    nodes = [n("extract"), n("clean", "extract"), n("score", "extract"), n("approve", "clean", "score"),
             n("cool", "clean"), n("child", "approve"), n("publish", "child", "cool")]
    placed, waypoints, width, height = graph.place(nodes)
    boxes = [(p.x, p.y, p.x + NODE_W, p.y + NODE_H) for p in placed]
    for (x0, y0, x1, y1) in boxes:
        assert 0 <= x0 and x1 <= width and 0 <= y0 and y1 <= height
    for a in boxes:  # no two boxes overlap
        for b in boxes:
            if a != b:
                assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
    (route,) = [r for edge, r in waypoints.items() if edge == ("cool", "publish")]
    for cx, cy in route:
        assert not any(x0 <= cx <= x1 and y0 <= cy <= y1 for (x0, y0, x1, y1) in boxes)


def test_svg_marks_wait_nodes_links_children_and_escapes_text() -> None:
    svg = graph.svg([n("a<b>", kind="k&1"), n("w", "a<b>", type="signal", detail="<x>"),
                     n("c", "w", type="child", state="waiting_child", href="/runs/123")])
    assert 'data-node="a&lt;b&gt;"' in svg and "k&amp;1" in svg and "<b>" not in svg
    assert 'class="node type-signal def wait"' in svg and "signal: &lt;x&gt;" in svg
    assert '<a href="/runs/123" class="child-link"><g class="node type-child state-waiting_child wait"' in svg


def test_a_deep_chain_lays_out_without_recursion() -> None:
    chain = [n("s0")] + [n(f"s{i}", f"s{i - 1}") for i in range(1, 3000)]
    grid, _ = graph.layers(chain)
    assert len(grid) == 3000
