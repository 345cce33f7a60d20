"""The validation table of the simulator spec (§6): published figure, model value, error.

Every model value is computed here, by running the model on a shipped machine; the published
values are the figures of the source documents. A row passes when |model/published - 1| is
within its tolerance (15% unless stated), or, for the behaviour rows, when the stated
condition holds. The server profile is the same for every row (docs/bbsim.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .ior import IorSpec, flow_groups_for, run_point, select_nodes, select_servers
from .machine import load_machine
from .model import build_problem

KiB, MiB, GiB = 1024, 1024**2, 1024**3
TOLERANCE = 0.15
T3_NODES = (1024, 2048, 4096, 8192)


@dataclass
class Row:
    id: str
    system: str
    case: str
    metric: str
    published: object             # number, or text for behaviour rows
    model: object
    kind: str                     # validation | calibration | shape | behaviour
    tolerance: float | None = TOLERANCE
    binding: str = ""
    note: str = ""
    passed: bool = field(init=False, default=False)
    error: float | None = field(init=False, default=None)

    def __post_init__(self):
        if isinstance(self.published, (int, float)) and isinstance(self.model, (int, float)):
            self.error = self.model / self.published - 1.0
            self.passed = abs(self.error) <= self.tolerance + 1e-12

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("id", "system", "case", "metric", "published", "model",
                                              "error", "tolerance", "passed", "kind", "binding", "note")}


def _gbps(machine, **spec) -> dict:
    return run_point(machine, IorSpec(**spec))


def trinity_rows() -> list:
    m = load_machine("trinity")
    base = dict(ppn=32, servers=230, transfer_size=1 * MiB, block_size=8 * GiB)
    rows = []
    # T1: 1-256 nodes, client-bound at 2.0 GB/s per node
    for op in ("write", "read"):
        points = {n: _gbps(m, nodes=n, op=op, **base) for n in (1, 16, 64, 128, 256)}
        client = all(p["binding"] == "client node cap" for p in points.values())
        worst = max(abs(p["gbps"] / (2.0 * n) - 1) for n, p in points.items())
        rows.append(Row("T1", "Trinity", f"IOR N-N 1 MiB, 256 nodes, {op}", "GB/s", 512.0,
                        points[256]["gbps"], "validation", binding=points[256]["binding"],
                        note=f"1-256 nodes: max deviation from 2.0 x N {worst:.1%}; "
                             f"binding = client cap at every point: {client}"))
        rows[-1].passed = rows[-1].passed and client and worst < 1e-6
    # T2: the 256-512 plateau, and which links bind it
    for op in ("write", "read"):
        p256 = _gbps(m, nodes=256, op=op, **base)
        p512 = _gbps(m, nodes=512, op=op, **base)
        ratio = p512["gbps"] / p256["gbps"]
        named, detail = _regime2_links(m, op, base)
        row = Row("T2", "Trinity", f"IOR N-N, agg(512)/agg(256), {op}", "ratio", "< 1.5", ratio,
                  "validation (after calibration)", tolerance=None, binding=p512["binding"],
                  note=detail)
        row.passed = ratio < 1.5 and named
        rows.append(row)
    # T3: regime 3, 230 servers, at every power of two from 1024 to 8192. The spec's range
    # starts at 512, but 512 nodes is the end of T2's plateau (agg(512) < 1.5 x 512 GB/s =
    # 768 cannot also be ~1200), so regime 3 is checked from the next point of the sweep on.
    points = {(n, op): _gbps(m, nodes=n, op=op, **base) for n in T3_NODES for op in ("write", "read")}
    for n in T3_NODES:
        for op in ("write", "read"):
            p = points[(n, op)]
            note = ""
            if not p["binding"].startswith("server"):
                first = next((k for k in T3_NODES if points[(k, op)]["binding"].startswith("server")), None)
                examples = p["bottlenecks"][0]["examples"]
                note = (f"{n} nodes, {op}: still link-bound (the tail of regime 2)"
                        + (f", e.g. {examples[0]['name']}" if examples else "")
                        + (f"; the {first}-node row is server-bound" if first else ""))
            rows.append(Row("T3", "Trinity", f"IOR N-N 1 MiB, {n} nodes, 230 BB, {op}", "GB/s", 1200.0,
                            p["gbps"], "validation", binding=p["binding"], note=note))
    return rows


def _regime2_links(machine, op, base) -> tuple:
    """Do the links binding 512 nodes sit where the job's global links land?

    True when every binding resource is a local (green/black) link leaving (write: leaving,
    read: entering) a router that terminates a global link of one of the job's groups. The
    detail names an example link and the job groups' global links that land on its router.
    """
    spec = IorSpec(nodes=512, op=op, **base)
    nids = select_nodes(machine, 512)
    problem = build_problem(machine, flow_groups_for(machine, spec, nids, select_servers(machine, 230)))
    solution = problem.solve()
    topo = machine.topology
    job_groups = np.unique(machine.group_of(nids))
    landing: dict = {}                 # router -> the job groups' global links ending there
    for g in job_groups:
        for h in range(topo.G):
            if h != g:
                for j in range(topo.k):
                    router = h * topo.RC + int(topo.gateway[h, g, j])
                    landing.setdefault(router, []).append(f"g{g}->g{h} #{j}" if op == "write" else f"g{h}->g{g} #{j}")
    saturated = solution.saturated()
    links = [r for r in saturated if r < topo.n_links]
    if not links:
        return False, "no link saturates (client- or server-bound)"
    ok, classes, example = True, set(), None
    for r in links:
        info = problem.describe(r)
        classes.add(info["class"])
        end = info.get("from_router") if op == "write" else info.get("to_router")
        if info["class"] not in ("green", "black") or end not in landing:
            ok = False
        elif example is None:
            example = (info["name"], topo.router_name(end), landing[end])
    groups = ", ".join(f"g{g}" for g in job_groups)
    side = "leaving" if op == "write" else "entering"
    text = (f"{len(links)} saturated links, class {'/'.join(sorted(classes))}, each {side} a router where "
            f"global links of job groups {groups} land: {ok}")
    if example:
        text += f"; e.g. {example[0]} ({example[1]} holds global {', '.join(example[2])})"
    return ok, text


def cori_rows() -> list:
    p1 = load_machine("cori-p1")
    full = load_machine("cori")
    rows = []
    c1 = dict(nodes=1120, ppn=4, servers=140, transfer_size=1 * MiB, block_size=8 * 10**9)
    published = {("C1", "write"): 873.0, ("C1", "read"): 905.0, ("C2", "write"): 351.0, ("C2", "read"): 803.0}
    for op in ("write", "read"):
        p = _gbps(p1, op=op, **c1)
        rows.append(Row("C1", "Cori P1", f"IOR POSIX FPP 1120 n x 4, 140 BB, {op}", "GB/s",
                        published[("C1", op)], p["gbps"], "validation", binding=p["binding"]))
    for op in ("write", "read"):
        p = _gbps(p1, op=op, pattern="n1", **c1)
        rows.append(Row("C2", "Cori P1", f"IOR MPI-IO shared file, {op}", "GB/s", published[("C2", op)],
                        p["gbps"], "calibration", binding=p["binding"],
                        note=f"N-1 factor {p1.shared_file_efficiency[op]}"))
    for op, pub in (("read", 12.6e6), ("write", 12.5e6)):
        p = _gbps(p1, op=op, **{**c1, "transfer_size": 4 * KiB, "block_size": 1 * MiB})
        rows.append(Row("C3", "Cori P1", f"IOR 4 KiB transfers, {op}", "IOPS", pub, p["iops"],
                        "calibration", binding=p["binding"], note=f"{p1.iops[op]:.0f} IOPS per server"))
    c4 = dict(nodes=11120, ppn=4, servers=287, transfer_size=1 * MiB, block_size=8 * 10**9)
    for op, fpp, shared in (("read", 1700.0, 1300.0), ("write", 1600.0, 1400.0)):
        p = _gbps(full, op=op, **c4)
        rows.append(Row("C4", "Cori", f"IOR POSIX FPP 11120 n x 4, 287 BB, {op}", "GB/s", fpp, p["gbps"],
                        "validation", binding=p["binding"]))
    for op, fpp, shared in (("read", 1700.0, 1300.0), ("write", 1600.0, 1400.0)):
        p = _gbps(full, op=op, pattern="n1", **c4)
        rows.append(Row("C5", "Cori", f"IOR MPI-IO shared file, {op}", "GB/s", shared, p["gbps"],
                        "calibration", binding=p["binding"],
                        note=f"N-1 factor {full.shared_file_efficiency[op]}"))
    for op, pub in (("read", 28e6), ("write", 13e6)):
        p = _gbps(full, op=op, **{**c4, "transfer_size": 4 * KiB, "block_size": 1 * MiB})
        rows.append(Row("C6", "Cori", f"IOR 4 KiB transfers, {op}", "IOPS", pub, p["iops"], "calibration",
                        binding=p["binding"], note=f"{full.iops[op]:.0f} IOPS per server"))
    return rows


def cray_rows() -> list:
    m = load_machine("cray-264")
    rows = []
    k1 = dict(nodes=5280, ppn=2, servers=264, transfer_size=512 * KiB, block_size=16 * GiB,
              server_selection="packed")
    for op, pub in (("write", 1540.0), ("read", 1660.0)):
        p = _gbps(m, op=op, **k1)
        rows.append(Row("K1", "Cray 264-server", f"IOR POSIX FPP 5280 n x 2, 512 KiB, {op}", "GB/s", pub,
                        p["gbps"], "validation", binding=p["binding"]))
    # S1/S2: one compute node against one DataWarp server, at the best transfer size. The
    # client sits in another chassis and slot than the server (79% of positions), so minimal
    # routing gives it two paths; a same-chassis client is held to one 5.25 GB/s green link.
    single = dict(nodes=1, servers=1, transfer_size=512 * KiB, server_selection="packed",
                  nids=(_two_path_client(m),))
    for op, streams in (("write", 16), ("read", 8)):
        p = _gbps(m, op=op, ppn=streams, **single)
        rows.append(Row("S1", "one DataWarp node", f"1 client node, {streams} streams, {op}", "GB/s", 6.5,
                        p["gbps"], "validation", binding=p["binding"]))
    for op, pub in (("read", 8.0), ("write", 16.0)):
        one = _gbps(m, op=op, ppn=1, **single)["gbps"]
        # saturation point: where the one-stream slope meets the best bandwidth reached
        plateau = max(_gbps(m, op=op, ppn=n, **single)["gbps"] for n in range(1, 33))
        rows.append(Row("S2", "one DataWarp node", f"streams to saturate one server, {op}", "streams", pub,
                        plateau / one, "validation",
                        note=f"plateau {plateau:.2f} GB/s / one stream {one:.2f} GB/s"))
    sizes = [4 * KiB * 2**i for i in range(13)]          # 4 KiB .. 16 MiB
    curve = [_gbps(m, op="write", nodes=5280, ppn=2, servers=264, transfer_size=x,
                   server_selection="packed")["gbps"] for x in sizes]
    best = sizes[int(np.argmax(curve))]
    peak_i = int(np.argmax(curve))
    rising = all(b >= a for a, b in zip(curve[:peak_i], curve[1:peak_i + 1]))
    fall = 1 - curve[-1] / curve[peak_i]
    row = Row("S3", "Cray 264-server", "transfer-size sweep 4 KiB-16 MiB, write", "KiB at peak", 512.0,
              best / KiB, "shape", tolerance=0.0,
              note=f"monotone rise below the peak: {rising}; drop from peak to 16 MiB {fall:.1%} (shallow < 15%)")
    row.passed = row.passed and rising and 0 <= fall < 0.15
    rows.append(row)
    return rows


def _two_path_client(machine) -> int:
    """First compute nid in neither the chassis nor the slot column of the first server."""
    C = machine.shape.cols
    server = int(machine.router_of(machine.bb_nids[0])) % machine.shape.routers_per_group
    for nid in machine.compute_nids:
        router = int(machine.router_of(nid))
        local = router % machine.shape.routers_per_group
        same_group = router // machine.shape.routers_per_group == 0
        if same_group and local // C != server // C and local % C != server % C:
            return int(nid)
    raise RuntimeError("no two-path client position")


def interference_rows() -> list:
    """I1: per-stream fairness on shared servers; disjoint servers do not interfere."""
    m = load_machine("cori")
    servers = select_servers(m, 128)
    a_nids = select_nodes(m, 2048)
    b_nids = select_nodes(m, 512, offset=2048)
    spec = IorSpec(nodes=0, op="write", ppn=4, job="A")

    def rates(groups):
        solution = build_problem(m, groups).solve()
        return solution.job_rates()

    def groups(a_srv, b_srv):
        return (flow_groups_for(m, replace(spec, nodes=2048, job="A"), a_nids, a_srv) +
                flow_groups_for(m, replace(spec, nodes=512, job="B"), b_nids, b_srv))

    alone_b = rates(flow_groups_for(m, replace(spec, nodes=512, job="B"), b_nids, servers[:64]))["B"]
    shared = rates(groups(servers[:64], servers[:64]))
    disjoint = rates(groups(servers[64:], servers[:64]))
    expected = (2048 + 512) / 512
    rows = [Row("I1", "Cori", "jobs A 2048 n + B 512 n on the same 64 servers: B's slowdown", "x",
                expected, alone_b / shared["B"], "behaviour",
                note="expected = total streams / B's streams (per-stream fairness, server-bound)"),
            Row("I1", "Cori", "same jobs on disjoint servers: B's slowdown", "x", 1.0,
                alone_b / disjoint["B"], "behaviour", tolerance=0.01)]
    return rows


SECTIONS = ((("T1", "T2", "T3"), trinity_rows), (("C1", "C2", "C3", "C4", "C5", "C6"), cori_rows),
            (("K1", "S1", "S2", "S3"), cray_rows), (("I1",), interference_rows))


def validation_table(ids=None) -> list:
    """Every row, or the rows whose id is in `ids` (computing only the sections needed)."""
    rows = []
    for section_ids, compute in SECTIONS:
        if ids is None or set(section_ids) & set(ids):
            rows += [r for r in compute() if ids is None or r.id in ids]
    return rows
