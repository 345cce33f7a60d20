"""Dragonfly structure: link counts, gateways and route bounds."""

import numpy as np
import pytest

from bbsim.machine import load_machine
from bbsim.model import FlowGroup, ServerTable, build_problem
from bbsim.topology import BLACK, GREEN, Dragonfly, Shape


def test_trinity_link_counts(trinity):
    counts = trinity.topology.link_counts()
    k = trinity.shape.links_per_pair
    assert counts["green"] == 57 * 6 * 16 * 15
    assert counts["black"] == 57 * 16 * 6 * 5
    assert counts["global"] == 57 * 56 * k


def test_node_counts_match_the_paper(trinity):
    c = trinity.counts()
    assert (c["compute"], c["burst_buffer"], c["lnet"], c["empty"]) == (57 * 360, 570, 228, 570)


@pytest.mark.parametrize("routing", ["minimal", "minimal-single"])
def test_intra_group_routes_have_at_most_two_hops_and_conserve_flow(routing):
    topo = Dragonfly(Shape(3, 6, 16, 4, 2, 4, "consecutive", routing))
    C = topo.C
    for a in range(topo.RC):
        for b in range(topo.RC):
            route = topo.local_route(a, b)
            if a == b:
                assert route == []
                continue
            out_of_a = sum(f for link, f in route if topo.local_src[link] == a)
            into_b = sum(f for link, f in route if topo.local_dst[link] == b)
            assert np.isclose(out_of_a, 1.0) and np.isclose(into_b, 1.0)
            hops = sum(f for _, f in route)          # fraction-weighted hop count
            assert hops <= 2.0 + 1e-12
            for link, _ in route:                    # green stays in a row, black in a column
                s, d = topo.local_src[link], topo.local_dst[link]
                if topo.local_class[link] == GREEN:
                    assert s // C == d // C
                else:
                    assert topo.local_class[link] == BLACK and s % C == d % C


def test_gateways_respect_ports_and_pair_every_group():
    shape = Shape(9, 2, 4, 4, 3, 4, "consecutive")
    topo = Dragonfly(shape)
    for g in range(9):
        assert topo.ports_used[g].max() <= 4
        assert topo.ports_used[g].sum() == 8 * 3
    idx = topo.global_index(np.repeat(np.arange(9), 9 * 3), np.tile(np.repeat(np.arange(9), 3), 9),
                            np.tile(np.arange(3), 81))
    valid = np.repeat(np.arange(9), 27) != np.tile(np.repeat(np.arange(9), 3), 9)
    assert len(set(idx[valid].tolist())) == topo.n_global        # one resource per (g, h, j)


def _single_flow_problem(machine, router, server_index, op="write"):
    servers = ServerTable.of_machine(machine)
    fg = FlowGroup(job="t", op=op, routers=[router], nodes=[1], streams=[1], servers=[server_index],
                   shares=[1.0], transfer_size=1 << 20)
    return build_problem(machine, [fg], servers)


def _router_flow(topo, row):
    """Edges (from router, to router, flow) of the network links a usage row loads."""
    edges = []
    for r in np.flatnonzero(row[:topo.n_links] > 1e-12):
        d = topo.describe_link(r)
        edges.append((d["from_router"], d["to_router"], row[r], d["class"]))
    return edges


def _longest_path(edges, start):
    """Hops of the longest path from `start` over the edges (which must form a DAG)."""
    out = {}
    for a, b, _, _ in edges:
        out.setdefault(a, []).append(b)
    memo, visiting = {}, set()

    def walk(node):
        if node in memo:
            return memo[node]
        assert node not in visiting, "the routes form a cycle"
        visiting.add(node)
        memo[node] = max((1 + walk(n) for n in out.get(node, [])), default=0)
        visiting.discard(node)
        return memo[node]
    return walk(start)


@pytest.mark.parametrize("valiant", [0.0, 0.4])
@pytest.mark.parametrize("op", ["write", "read"])
def test_inter_group_route_hops_and_conservation(valiant, op):
    m = load_machine("trinity", (("routing.valiant_fraction", valiant),))
    topo = m.topology
    server = 50                                          # a server in group 5
    router = int(m.router_of(m.compute_nids[0]))         # a compute router in group 0
    server_router = int(m.router_of(m.bb_nids[server]))
    p = _single_flow_problem(m, router, server, op)
    row = (p.usage.left @ p.usage.right).toarray()[0]
    glob = row[topo.global_offset:topo.n_links]
    # every byte crosses one global link minimally, two via an intermediate group
    assert np.isclose(glob.sum(), 1.0 + valiant)
    # the loaded links carry one unit of flow from the source router to the sink router:
    # conservation at every router
    src, dst = (router, server_router) if op == "write" else (server_router, router)
    edges = _router_flow(topo, row)
    net = {}
    for a, b, f, _ in edges:
        net[a] = net.get(a, 0.0) + f
        net[b] = net.get(b, 0.0) - f
    for node, value in net.items():
        expected = 1.0 if node == src else -1.0 if node == dst else 0.0
        assert np.isclose(value, expected, atol=1e-9), (node, value)
    # hop bounds on every path: minimal <= 2 local + 1 global + 2 local = 5 router links;
    # through an intermediate group <= 2 + 1 + 2 + 1 + 2 = 8
    longest = _longest_path(edges, src)
    assert longest <= (8 if valiant else 5)
    # k links per pair: minimally the pair's k, through an intermediate group k per hop
    k = topo.k
    assert sum(1 for e in edges if e[3] == "global") == k * (1 if not valiant else 1 + 2 * 55)
    # the server's node link carries the whole flow in the right direction
    link = p.offsets["bb_in" if op == "write" else "bb_out"] + server
    assert np.isclose(row[link], 1.0)


def test_intra_group_route_to_a_server_has_at_most_two_hops(trinity):
    server = 0                                           # group 0, chassis 0, slot 0
    assert trinity.bb_nids[server] == trinity.nid_at(0, 0, 0, 0)
    router = trinity.nid_at(0, 4, 9, 0) // 4             # other chassis and column: two 2-hop paths
    p = _single_flow_problem(trinity, router, server)
    row = (p.usage.left @ p.usage.right).toarray()[0]
    edges = _router_flow(trinity.topology, row)
    assert _longest_path(edges, router) == 2 and len(edges) == 4
    assert all(e[3] in ("green", "black") and np.isclose(e[2], 0.5) for e in edges)


def test_too_few_global_ports_is_rejected():
    with pytest.raises(ValueError):
        Dragonfly(Shape(57, 6, 16, 4, 10, 1, "consecutive"))


def test_route_uses_the_pair_gateways(trinity):
    topo = trinity.topology
    p = _single_flow_problem(trinity, int(trinity.router_of(trinity.compute_nids[0])), 50)
    row = (p.usage.left @ p.usage.right).toarray()[0]
    used = np.flatnonzero(row[topo.global_offset:topo.n_links]) + topo.global_offset
    assert [topo.describe_link(r)["to_group"] for r in used] == [5] * topo.k       # the pair's k links
    assert np.allclose(row[used], 1.0 / topo.k)
