"""Event-driven replay of several jobs' I/O phases on one machine.

Each phase (one node, one op, one window) is a class of `streams` identical flows that
starts at its logged start (plus the job's offset), or when the node's previous phase ends
if that is later, and lasts until its bytes are moved at the max-min rates of the moment.
Rates are re-solved at every start and completion; completions closer than a relative 1e-9
are batched. Jobs alone and in pairs give the slowdown matrix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError
from .ior import select_nodes, select_servers
from .machine import Machine
from .model import FlowGroup, ServerTable, build_problem
from .units import GB


@dataclass
class ReplayJob:
    name: str
    phases: list                 # darshan_ingest.Phase
    nids: np.ndarray             # compute nid of each of the job's nodes
    servers: np.ndarray          # server indices of its instance
    offset: float = 0.0          # seconds added to every logged time
    weight: float = 1.0          # max-min weight per flow (fairness policy)


@dataclass
class ReplayResult:
    jobs: list                   # per job: name, start, end, bytes, gbps
    timeline: list               # (t0, t1, {job: GB/s})
    events: int
    solves: int
    wall_s: float
    per_server: dict = field(default_factory=dict)

    def job(self, name) -> dict:
        return next(j for j in self.jobs if j["name"] == name)


def place_jobs(machine: Machine, jobs_nodes: list, servers: int | None, layout: str = "shared",
               selection: str = "spread") -> tuple:
    """Contiguous node blocks, one per job, and each job's servers (shared or disjoint)."""
    nids, start = [], 0
    for count in jobs_nodes:
        nids.append(select_nodes(machine, count, "contiguous", start))
        start += count
    total = servers if servers is not None else len(machine.bb_nids)
    if layout == "shared":
        pick = select_servers(machine, total, selection)
        return nids, [pick] * len(jobs_nodes)
    pick = select_servers(machine, total, selection)
    if len(pick) < len(jobs_nodes):
        raise InputError("--servers", str(total), "fewer servers than jobs for a disjoint layout",
                         "give at least one server per job")
    return nids, [chunk for chunk in np.array_split(pick, len(jobs_nodes))]


def replay(machine: Machine, jobs: list, server_table: ServerTable | None = None) -> ReplayResult:
    started = time.perf_counter()
    groups, owner, node_of, bytes_left, ready = [], [], [], [], []
    for j, job in enumerate(jobs):
        for p in job.phases:
            if p.bytes <= 0:
                continue
            if p.node >= len(job.nids):
                raise InputError(job.name, f"node {p.node}", "phase on a node the job does not have",
                                 "raise the node count or lower --ranks-per-node")
            nid = job.nids[p.node]
            groups.append(FlowGroup(job=job.name, op=p.op, routers=[int(machine.router_of(nid))],
                                    nodes=[1], streams=[p.streams], servers=job.servers,
                                    shares=np.full(len(job.servers), 1.0 / len(job.servers)),
                                    transfer_size=max(p.transfer_size, 1.0), size_mix=p.sizes or None,
                                    shared_file=p.shared,
                                    fairness_weight=job.weight))
            owner.append(j), node_of.append((j, p.node)), bytes_left.append(p.bytes)
            ready.append(p.start + job.offset)
    n = len(groups)
    result_jobs = [{"name": job.name, "start": None, "end": None, "bytes": 0.0, "gbps": 0.0}
                   for job in jobs]
    if n == 0:
        return ReplayResult(result_jobs, [], 0, 0, time.perf_counter() - started)
    problem = build_problem(machine, groups, server_table)
    owner = np.array(owner)
    left = np.array(bytes_left, float)
    total = left.copy()
    ready = np.array(ready, float)
    # per node, phases run one after another in logged order
    prev = np.full(n, -1)
    last: dict = {}
    for i in np.lexsort((np.arange(n), ready)):
        key = node_of[i]
        prev[i] = last.get(key, -1)
        last[key] = i
    state = np.zeros(n, np.int8)           # 0 waiting, 1 active, 2 done
    begin = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    t = float(ready.min())
    timeline, events, solves = [], 0, 0
    server_series = []
    while (state < 2).any():
        can = (state == 0) & ((prev < 0) | (state[np.maximum(prev, 0)] == 2))
        start_now = can & (ready <= t * (1 + 1e-12) + 1e-12)
        if start_now.any():
            state[start_now] = 1
            begin[start_now] = t
            events += 1
        active = state == 1
        if not active.any():
            t = float(ready[can].min())
            continue
        solution = problem.solve(active)
        solves += 1
        rate = solution.class_rate * GB            # bytes/s per phase
        moving = active & (rate > 0)
        to_finish = np.full(n, np.inf)
        to_finish[moving] = left[moving] / rate[moving]
        pending = can & ~start_now
        next_start = float(ready[pending].min()) if pending.any() else np.inf
        dt = min(float(to_finish.min()), next_start - t)
        if not np.isfinite(dt):
            raise RuntimeError("replay stalled: active phases get no bandwidth")
        dt = max(dt, 0.0)
        per_job = np.bincount(owner[active], weights=rate[active] / GB, minlength=len(jobs))
        timeline.append((t, t + dt, {jobs[j].name: float(per_job[j]) for j in range(len(jobs))}))
        server_series.append((t, t + dt, solution.utilization()[problem.offsets["server_bw"]:
                                                                 problem.offsets["server_iops"]]))
        left = np.where(active, left - rate * dt, left)
        done = active & ((left <= total * 1e-9) | (to_finish <= dt * (1 + 1e-9)))
        t += dt
        if done.any():
            state[done] = 2
            left[done] = 0.0
            finish[done] = t
            events += 1
    for j, job in enumerate(jobs):
        mine = owner == j
        if mine.any():
            start, end = float(np.nanmin(begin[mine])), float(np.nanmax(finish[mine]))
            moved = float(total[mine].sum())
            result_jobs[j].update(start=start, end=end, bytes=moved,
                                  gbps=moved / GB / (end - start) if end > start else 0.0)
    busiest = _server_summary(server_series, problem)
    return ReplayResult(result_jobs, timeline, events, solves, time.perf_counter() - started, busiest)


def _server_summary(series, problem) -> dict:
    """Time-averaged and peak busy fraction of each server that did any work."""
    if not series:
        return {}
    span = sum(t1 - t0 for t0, t1, _ in series)
    avg = sum((t1 - t0) * u for t0, t1, u in series) / max(span, 1e-300)
    peak = np.max([u for _, _, u in series], axis=0)
    names = problem.servers.names
    return {names[i]: {"mean_busy": float(avg[i]), "peak_busy": float(peak[i])}
            for i in np.flatnonzero(peak > 0)}


def slowdown_matrix(machine: Machine, jobs: list, server_table=None) -> dict:
    """Duration of each job alone, with each other job, and with all of them."""
    def duration(result, name):
        j = result.job(name)
        return (j["end"] - j["start"]) if j["end"] is not None else 0.0

    alone = {job.name: duration(replay(machine, [job], server_table), job.name) for job in jobs}
    pairs = {}
    for a in range(len(jobs)):
        for b in range(a + 1, len(jobs)):
            res = replay(machine, [jobs[a], jobs[b]], server_table)
            pairs[(a, b)] = res
    names = [job.name for job in jobs]
    matrix = []
    for a in range(len(jobs)):
        row = []
        for b in range(len(jobs)):
            if a == b:
                row.append(1.0)
                continue
            res = pairs[(min(a, b), max(a, b))]
            base = alone[names[a]]
            row.append(duration(res, names[a]) / base if base > 0 else 1.0)
        matrix.append(row)
    return {"jobs": names, "alone_s": alone, "slowdown": matrix,
            "note": "slowdown[i][j] = duration of job i running with job j / duration of job i alone"}
