"""IOR-like workloads: N-N or N-1, write or read, on a chosen set of nodes and servers."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from .errors import InputError
from .machine import Machine
from .model import FlowGroup, ServerTable, build_problem
from .units import GB, format_size

MiB = 1024**2
GiB = 1024**3
PATTERNS = ("nn", "n1")
ACCESS_MODES = ("striped", "private", "loadbalance")
NODE_SELECTIONS = ("contiguous", "spread", "random")
SERVER_SELECTIONS = ("spread", "packed")


@dataclass(frozen=True)
class IorSpec:
    nodes: int
    op: str = "write"
    pattern: str = "nn"                 # nn: file per process; n1: one shared file
    transfer_size: float = 1 * MiB      # IOR -t
    block_size: float = 8 * GiB         # IOR -b, bytes per process
    ppn: int = 32                       # processes (client streams) per node
    servers: int | None = None          # instance width; None = every server
    server_selection: str = "spread"    # spread: round robin over groups; packed: nid order
    node_selection: str = "contiguous"  # contiguous: nid order from node_offset
    node_offset: int = 0
    access_mode: str = "striped"
    seed: int = 0
    job: str = "ior"
    nids: tuple | None = None           # explicit compute nids (overrides the selection)


def select_nodes(machine: Machine, count: int, selection: str = "contiguous", offset: int = 0,
                 seed: int = 0, exclude=None) -> np.ndarray:
    """Compute nids for a job of `count` nodes."""
    pool = machine.compute_nids
    if exclude is not None and len(exclude):
        pool = np.setdiff1d(pool, exclude)
    if count < 1 or count + offset > len(pool):
        raise InputError("--nodes", str(count), f"asks for {count} nodes (offset {offset}) but "
                         f"{machine.name} has {len(pool)} free compute nodes",
                         f"use at most {len(pool) - offset} nodes")
    if selection == "contiguous":
        return pool[offset:offset + count]
    if selection == "spread":
        groups = machine.group_of(pool)
        # k-th node of every group first, so jobs touch as many groups as possible
        rank = np.empty(len(pool), np.int64)
        for g in np.unique(groups):
            idx = np.flatnonzero(groups == g)
            rank[idx] = np.arange(len(idx))
        order = np.lexsort((groups, rank))
        return np.sort(pool[order[offset:offset + count]])
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(pool, size=count, replace=False))


def select_servers(machine: Machine, count: int | None, selection: str = "spread") -> np.ndarray:
    """Indices into ServerTable.of_machine(machine) for an instance of `count` servers."""
    total = len(machine.bb_nids)
    if count is None:
        return np.arange(total)
    if not 1 <= count <= total:
        raise InputError("--servers", str(count), f"{machine.name} has {total} burst-buffer servers",
                         f"use 1 to {total} servers")
    if selection == "packed":
        return np.arange(count)
    groups = machine.group_of(machine.bb_nids)
    rank = np.empty(total, np.int64)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        rank[idx] = np.arange(len(idx))
    return np.sort(np.lexsort((groups, rank))[:count])


def flow_groups_for(machine: Machine, spec: IorSpec, nids: np.ndarray, servers: np.ndarray,
                    server_shares: np.ndarray | None = None) -> list:
    """Flow groups of one IOR phase of nodes `nids` against server indices `servers`."""
    if spec.access_mode == "loadbalance" and spec.op == "write":
        raise InputError("--access-mode", "loadbalance", "a loadbalance instance is read-only for jobs "
                         "(its data is staged in to every replica)", "model reads (--op read), or use striped")
    shares = np.full(len(servers), 1.0 / len(servers)) if server_shares is None else server_shares
    common = dict(job=spec.job, op=spec.op, transfer_size=spec.transfer_size,
                  shared_file=spec.pattern == "n1")
    if spec.access_mode != "loadbalance":
        routers, nodes = np.unique(machine.router_of(nids), return_counts=True)
        return [FlowGroup(routers=routers, nodes=nodes, streams=nodes * spec.ppn, servers=servers,
                          shares=shares, **common)]
    # loadbalance: each client reads its own replica, chosen by its position in the job
    out = []
    pick = np.arange(len(nids)) % len(servers)
    for s in np.unique(pick):
        routers, nodes = np.unique(machine.router_of(nids[pick == s]), return_counts=True)
        out.append(FlowGroup(routers=routers, nodes=nodes, streams=nodes * spec.ppn,
                             servers=servers[[s]], shares=np.ones(1), **common))
    return out


def run_point(machine: Machine, spec: IorSpec, server_table: ServerTable | None = None,
              classes: bool = False) -> dict:
    """Steady-state bandwidth of one IOR run and what limits it; with `classes`, also the
    binding constraint of every flow class (one per compute router of the job)."""
    started = time.perf_counter()
    nids = np.asarray(spec.nids) if spec.nids is not None else \
        select_nodes(machine, spec.nodes, spec.node_selection, spec.node_offset, spec.seed)
    servers = select_servers(machine, spec.servers, spec.server_selection)
    groups = flow_groups_for(machine, spec, nids, servers)
    problem = build_problem(machine, groups, server_table)
    built = time.perf_counter()
    solution = problem.solve()
    solved = time.perf_counter()
    rate = sum(solution.group_rate(i) for i in range(len(groups)))
    bottlenecks = _merge_bottlenecks([solution.bottlenecks(i) for i in range(len(groups))])
    volume = spec.nodes * spec.ppn * spec.block_size
    return {
        "machine": machine.name, "op": spec.op, "pattern": spec.pattern,
        "nodes": spec.nodes, "ppn": spec.ppn, "transfer_size": spec.transfer_size,
        "transfer": format_size(spec.transfer_size), "block_size": spec.block_size,
        "servers": len(servers), "server_selection": spec.server_selection,
        "node_selection": spec.node_selection, "access_mode": spec.access_mode,
        "gbps": rate, "gbps_per_node": rate / spec.nodes,
        "iops": rate * GB / spec.transfer_size,
        "seconds": volume / (rate * GB) if rate > 0 else float("inf"),
        "binding": bottlenecks[0]["constraint"] if bottlenecks else "none",
        "bottlenecks": bottlenecks,
        "top_resources": solution.top_resources(5),
        "stats": {"classes": problem.n_classes, "units": problem.usage.right.shape[0],
                  "resources": problem.usage.right.shape[1], "nnz": int(problem.usage.right.nnz),
                  "iterations": solution.allocation.iterations,
                  "build_s": built - started, "solve_s": solved - built},
        "spec": {k: v for k, v in asdict(spec).items()},
        **({"classes": [row for i in range(len(groups)) for row in solution.class_bindings(i)]} if classes else {}),
    }


def _merge_bottlenecks(lists: list) -> list:
    merged: dict = {}
    for entries in lists:
        for e in entries:
            m = merged.setdefault(e["constraint"], {**e, "nodes": 0, "streams": 0, "gbps": 0.0,
                                                    "saturated_resources": 0, "examples": []})
            m["nodes"] += e["nodes"]
            m["streams"] += e["streams"]
            m["gbps"] += e["gbps"]
            m["saturated_resources"] = max(m["saturated_resources"], e["saturated_resources"])
            m["examples"] = (m["examples"] + e["examples"])[:3]
    return sorted(merged.values(), key=lambda e: -e["gbps"])


def sweep(machine: Machine, spec: IorSpec, node_counts, ops=("write", "read")) -> list:
    return [run_point(machine, replace(spec, nodes=n, op=op)) for op in ops for n in node_counts]
