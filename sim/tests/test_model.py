"""IOR workloads on small and full machines: regimes, aggregation, conservation."""

import numpy as np
import pytest

from bbsim.ior import IorSpec, flow_groups_for, run_point, select_nodes, select_servers
from bbsim.machine import load_machine
from bbsim.model import FlowGroup, build_problem

MiB = 1 << 20


def test_client_bound_point_is_nodes_times_node_cap(trinity):
    for n in (1, 7, 100):
        p = run_point(trinity, IorSpec(nodes=n, servers=230))
        assert p["gbps"] == pytest.approx(n * trinity.node_cap)
        assert p["binding"] == "client node cap"


def test_server_bound_point_is_servers_times_server_bandwidth(trinity):
    p = run_point(trinity, IorSpec(nodes=8192, servers=100))
    streams_per_server = 8192 * 32 / 100
    expected = 100 * trinity.server_bandwidth("write", MiB, streams_per_server)
    assert p["gbps"] == pytest.approx(expected, rel=1e-9)
    assert p["binding"] == "server bandwidth"


def test_router_classes_equal_per_node_classes(trinity):
    """Aggregating a router's nodes into one class changes nothing."""
    spec = IorSpec(nodes=600, servers=230)
    nids = select_nodes(trinity, 600)
    servers = select_servers(trinity, 230)
    grouped = build_problem(trinity, flow_groups_for(trinity, spec, nids, servers)).solve()
    fg = FlowGroup(job="x", op="write", routers=trinity.router_of(nids), nodes=np.ones(600),
                   streams=np.full(600, 32.0), servers=servers, shares=np.full(230, 1 / 230),
                   transfer_size=MiB)
    single = build_problem(trinity, [fg]).solve()
    assert single.group_rate(0) == pytest.approx(grouped.group_rate(0), rel=1e-9)
    rates = dict(zip(grouped.problem.groups[0].routers, grouped.allocation.rate))
    per_node = single.allocation.rate
    assert np.allclose(per_node, [rates[r] for r in trinity.router_of(nids)])


def test_bytes_are_conserved_through_servers_and_links(trinity):
    spec = IorSpec(nodes=1000, servers=57)
    nids, servers = select_nodes(trinity, 1000), select_servers(trinity, 57)
    sol = build_problem(trinity, flow_groups_for(trinity, spec, nids, servers)).solve()
    p = sol.problem
    total = sum(sol.group_rate(i) for i in range(len(p.groups)))
    into_servers = sol.allocation.load[p.offsets["bb_in"]:p.offsets["bb_out"]].sum()
    assert into_servers == pytest.approx(total, rel=1e-9)
    # with minimal routing, what leaves the job's groups crosses exactly one global link
    topo = trinity.topology
    job_groups = set(np.unique(trinity.group_of(nids)))
    server_groups = trinity.group_of(trinity.bb_nids[servers])
    remote_share = np.mean([g not in job_groups for g in server_groups])
    on_global = sol.allocation.load[topo.global_offset:topo.n_links].sum()
    assert on_global >= total * remote_share * 0.99


def test_regime_two_needs_the_calibrated_wiring(trinity):
    """The plateau comes from the routers where groups 0 and 1's global links land together:
    spreading the global ports removes it, and with one link per pair instead of two it does
    not end (1024 nodes stay on it)."""
    base = {n: run_point(trinity, IorSpec(nodes=n, servers=230)) for n in (256, 512, 1024)}
    assert base[512]["gbps"] / base[256]["gbps"] < 1.5 and base[512]["binding"] in ("green", "black")
    assert base[1024]["gbps"] >= 0.85 * 1200
    flat = load_machine("trinity", (("topology.global_port_assignment", "round_robin"),))
    spread = run_point(flat, IorSpec(nodes=512, servers=230))
    assert spread["gbps"] == pytest.approx(1024) and spread["binding"] == "client node cap"
    one = load_machine("trinity", (("topology.global_links_per_pair", 1),))
    assert run_point(one, IorSpec(nodes=1024, servers=230))["gbps"] < 0.85 * 1200


def test_shared_file_and_iops_factors_apply():
    m = load_machine("cori-p1")
    nn = run_point(m, IorSpec(nodes=1120, ppn=4, servers=140))
    n1 = run_point(m, IorSpec(nodes=1120, ppn=4, servers=140, pattern="n1"))
    assert n1["gbps"] == pytest.approx(nn["gbps"] * m.shared_file_efficiency["write"])
    small = run_point(m, IorSpec(nodes=1120, ppn=4, servers=140, transfer_size=4096))
    assert small["iops"] == pytest.approx(140 * m.iops["write"])
    assert small["binding"] == "server IOPS"


def test_loadbalance_reads_one_replica_per_node(trinity):
    p = run_point(trinity, IorSpec(nodes=4, op="read", servers=4, access_mode="loadbalance", ppn=1))
    assert p["gbps"] == pytest.approx(4 * trinity.stream_cap["read"])


def test_full_machine_point_runs(trinity):
    p = run_point(trinity, IorSpec(nodes=len(trinity.compute_nids)))
    assert p["binding"] == "server bandwidth"
    assert p["stats"]["classes"] == len(np.unique(trinity.router_of(trinity.compute_nids)))


def test_class_report_names_each_class_binding(trinity):
    """Two classes of one job on one server: a node whose 64 streams share its 2 GB/s cap
    (below the server's fair share), and a router of 4 nodes x 8 streams bound by the server."""
    server = 0                                           # nid00000: group 0, chassis 0, slot 0
    assert trinity.bb_nids[server] == trinity.nid_at(0, 0, 0, 0)
    a = trinity.nid_at(0, 3, 8, 0) // 4                  # routers in other chassis and slots
    b = trinity.nid_at(0, 2, 8, 0) // 4
    fg = FlowGroup(job="j", op="write", routers=[a, b], nodes=[1, 4], streams=[64, 32], servers=[server],
                   shares=[1.0], transfer_size=MiB)
    sol = build_problem(trinity, [fg]).solve()
    rows = sol.class_bindings(0)
    assert [r["router"] for r in rows] == ["g0:c3s8", "g0:c2s8"]
    capped, shared = rows
    assert capped["constraint"] == "client node cap" and capped["gbps"] == pytest.approx(trinity.node_cap)
    assert capped["gbps_per_stream"] == pytest.approx(trinity.node_cap / 64)
    server_gbps = trinity.server_bandwidth("write", MiB, 96)
    assert shared["constraint"] == "server bandwidth" and shared["bound_by"] == "server bandwidth nid00000"
    assert shared["utilization"] == pytest.approx(1.0)
    assert shared["gbps"] == pytest.approx(server_gbps - trinity.node_cap)
    assert capped["gbps"] + shared["gbps"] == pytest.approx(sol.group_rate(0))


def test_every_class_of_a_point_is_named_and_adds_up(trinity):
    p = run_point(trinity, IorSpec(nodes=384, servers=230), classes=True)
    classes = p["classes"]
    assert len(classes) == p["stats"]["classes"]
    assert sum(c["nodes"] for c in classes) == 384
    assert sum(c["gbps"] for c in classes) == pytest.approx(p["gbps"])
    kinds = {c["constraint"] for c in classes}
    assert kinds <= {"green", "black", "client node cap"} and kinds & {"green", "black"}
    for c in classes:
        if c["constraint"] in ("green", "black"):
            assert c["bound_by"].startswith(c["constraint"] + " g") and c["utilization"] == pytest.approx(1.0)
        else:
            assert c["gbps"] == pytest.approx(c["nodes"] * trinity.node_cap)


def test_mixed_access_sizes_use_the_harmonic_mean_efficiency(trinity):
    """Half the bytes in 256 KiB calls and half in 4 MiB calls: each byte takes 1/eff(size)
    of the server's time, so the server delivers peak x f(streams) / mean(1/eff)."""
    router = trinity.nid_at(0, 2, 8, 0) // 4
    mix = ((256 * 1024, 0.5), (4 * MiB, 0.5))
    mean_call = 1.0 / (0.5 / (256 * 1024) + 0.5 / (4 * MiB))      # bytes over calls

    def rate(**kw):
        fg = FlowGroup(job="j", op="read", routers=[router], nodes=[4], streams=[128], servers=[0],
                       shares=[1.0], **kw)
        sol = build_problem(trinity, [fg]).solve()
        assert sol.class_bindings(0)[0]["constraint"] == "server bandwidth"
        return sol.group_rate(0)

    p = trinity.profile
    harmonic = 1.0 / (0.5 / p.size_factor(256 * 1024) + 0.5 / p.size_factor(4 * MiB))
    expected = p.peak["read"] * float(p.stream_factor(128)) * harmonic
    assert rate(transfer_size=mean_call, size_mix=mix) == pytest.approx(expected, rel=1e-9)
    # the same bytes at one size: the plain eff(size)
    assert rate(transfer_size=4 * MiB) == pytest.approx(trinity.server_bandwidth("read", 4 * MiB, 128))
    assert rate(transfer_size=mean_call) != pytest.approx(expected, rel=1e-3)   # the mix matters
