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


@pytest.mark.parametrize("valiant", [0.0, 0.4])
@pytest.mark.parametrize("op", ["write", "read"])
def test_inter_group_route_hops_and_conservation(valiant, op):
    m = load_machine("trinity", (("routing.valiant_fraction", valiant),))
    topo = m.topology
    server = 50                                          # a server in group 5
    router = int(m.router_of(m.compute_nids[0]))         # a compute router in group 0
    p = _single_flow_problem(m, router, server, op)
    row = (p.usage.left @ p.usage.right).toarray()[0]
    local, glob = row[:topo.global_offset], row[topo.global_offset:topo.n_links]
    # every byte crosses one global link minimally, two via an intermediate group
    assert np.isclose(glob.sum(), 1.0 + valiant)
    # router links: <= 2 local in each group visited plus the global hops
    assert local.sum() + glob.sum() <= (2 + 1 + 2) * (1 - valiant) + (2 + 1 + 2 + 1 + 2) * valiant + 1e-9
    # the server's node link carries the whole flow in the right direction
    link = p.offsets["bb_in" if op == "write" else "bb_out"] + server
    assert np.isclose(row[link], 1.0)


def test_too_few_global_ports_is_rejected():
    with pytest.raises(ValueError):
        Dragonfly(Shape(57, 6, 16, 4, 10, 1, "consecutive"))


def test_route_uses_the_pair_gateways(trinity):
    topo = trinity.topology
    p = _single_flow_problem(trinity, int(trinity.router_of(trinity.compute_nids[0])), 50)
    row = (p.usage.left @ p.usage.right).toarray()[0]
    used = np.flatnonzero(row[topo.global_offset:topo.n_links]) + topo.global_offset
    assert [topo.describe_link(r)["to_group"] for r in used] == [5]
