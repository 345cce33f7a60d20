"""Event-driven replay: timing, sequencing and interference."""

import numpy as np
import pytest

from bbsim.darshan_ingest import Phase, read_darshan
from bbsim.machine import load_machine
from bbsim.replay import ReplayJob, place_jobs, replay, slowdown_matrix
from bbsim.units import GB


@pytest.fixture(scope="module")
def cori():
    return load_machine("cori")


def job(name, phases, nodes, servers, machine, offset=0.0, start_nid=0):
    nids = machine.compute_nids[start_nid:start_nid + nodes]
    return ReplayJob(name, phases, nids, servers, offset)


def test_single_phase_ends_after_bytes_over_rate(cori):
    # one node, 2 streams of 0.41 GB/s writing 8.2 GB: client-bound, 10 s
    p = Phase(node=0, op="write", start=1.0, end=2.0, bytes=8.2e9, ops=8200, streams=2, shared=False)
    res = replay(cori, [job("a", [p], 1, np.arange(8), cori)])
    j = res.job("a")
    assert j["start"] == pytest.approx(1.0)
    assert j["end"] == pytest.approx(1.0 + 8.2e9 / (2 * 0.41 * GB))


def test_phases_of_a_node_run_in_order(cori):
    a = Phase(0, "write", 0.0, 1.0, 4.1e9, 4100, 1, False)      # 10 s at 0.41 GB/s
    b = Phase(0, "read", 0.5, 1.0, 8.1e9, 8100, 1, False)       # waits for a, then 10 s at 0.81
    res = replay(cori, [job("a", [a, b], 1, np.arange(4), cori)])
    assert res.job("a")["end"] == pytest.approx(20.0)


def test_shared_servers_slow_both_jobs_and_disjoint_do_not(cori):
    big = [Phase(n, "write", 0.0, 1.0, 50e9, 50000, 4, False) for n in range(256)]
    small = [Phase(n, "write", 0.0, 1.0, 50e9, 50000, 4, False) for n in range(64)]
    servers = np.arange(16)
    shared = [job("big", big, 256, servers, cori), job("small", small, 64, servers, cori, start_nid=256)]
    m = slowdown_matrix(cori, shared)
    assert m["slowdown"][1][0] > 1.5           # the small job suffers on shared servers
    apart = [job("big", big, 256, servers[:8], cori), job("small", small, 64, servers[8:], cori, start_nid=256)]
    m2 = slowdown_matrix(cori, apart)
    assert m2["slowdown"][1][0] == pytest.approx(1.0)


def test_two_wheel_logs_replay_together(trinity, wheel_logs):
    a = read_darshan(wheel_logs["sample-badost.darshan"], 24)
    b = read_darshan(wheel_logs["example.darshan"], 24)
    nids, servers = place_jobs(trinity, [a.nodes, b.nodes], 32)
    jobs = [ReplayJob(a.name, a.phases, nids[0], servers[0]),
            ReplayJob(b.name, b.phases, nids[1], servers[1], offset=-3.4)]
    together = replay(trinity, jobs)
    alone = replay(trinity, jobs[:1])
    assert together.job(a.name)["bytes"] == pytest.approx(a.posix_bytes["write"])
    assert together.job(a.name)["end"] > alone.job(a.name)["end"]       # interference
    moved = sum((t1 - t0) * r[a.name] for t0, t1, r in together.timeline) * GB
    assert moved == pytest.approx(a.posix_bytes["write"], rel=1e-6)      # timeline integrates to bytes
