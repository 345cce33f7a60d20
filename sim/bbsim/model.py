"""From flows on a machine to a max-min problem, and from its solution to a report.

A `FlowGroup` is one job's flows of one kind (op, transfer size, file pattern) towards one
set of servers with fixed shares (a striped instance: 1/K each). Its classes are the job's
compute routers: every node on a router, every stream of those nodes, behaves the same.

Route loads are factored to keep full machines small (20k nodes x 570 servers would be
~10^8 (class, server, link) terms):
  * a per-class "source unit": the compute-side local links, from the class's router to the
    group's gateways and to local servers (depends on the router);
  * a per-(flow group, compute group) "far unit": global links, the far side's local links,
    server node links and server resources (identical for every class of that group).
usage = U @ B with U = [identity | class -> far unit] and B = [source units; far units].

Resources, in index order: local links of every group, global links, server node links in
(towards the server) and out, server bandwidth (capacity = fraction of peak kept at the
server's stream count), server IOPS (capacity 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .machine import OPS, Machine
from .solver import BOUND_BY_CAP, NOT_RUN, Factored, max_min_fair
from .units import GB

CAP_REASONS = ("client stream cap", "client node cap", "compute node link")


@dataclass
class ServerTable:
    """The servers a problem can use: nids on the machine and their names."""

    nids: np.ndarray
    names: list

    @classmethod
    def of_machine(cls, machine: Machine) -> "ServerTable":
        nids = machine.bb_nids
        return cls(nids=nids, names=[machine.hostname(n) for n in nids])


@dataclass
class FlowGroup:
    job: str
    op: str                          # "write" | "read"
    routers: np.ndarray              # global router id of each class
    nodes: np.ndarray                # compute nodes in each class
    streams: np.ndarray              # flows (client streams) in each class
    servers: np.ndarray              # indices into the ServerTable
    shares: np.ndarray               # share of every flow's bytes going to each server (sum 1)
    transfer_size: float             # bytes per I/O call (the mean: sets the IOPS load)
    shared_file: bool = False        # N-1: one file for all ranks
    fairness_weight: float = 1.0     # max-min weight of each flow
    label: str = ""
    size_mix: tuple | None = None    # ((access size, bytes), ...) when calls differ in size:
                                     # the server's size efficiency is their byte-weighted
                                     # harmonic mean; None = every call is transfer_size

    def __post_init__(self):
        self.routers = np.asarray(self.routers, dtype=np.int64)
        self.nodes = np.asarray(self.nodes, dtype=float)
        self.streams = np.asarray(self.streams, dtype=float)
        self.servers = np.asarray(self.servers, dtype=np.int64)
        self.shares = np.asarray(self.shares, dtype=float)
        if self.op not in OPS:
            raise ValueError(f"op must be one of {OPS}")


@dataclass
class Problem:
    machine: Machine
    servers: ServerTable
    groups: list
    usage: Factored
    capacity: np.ndarray             # network capacities; server entries filled per solve
    offsets: dict                    # resource kind -> first index
    class_group: np.ndarray
    class_streams: np.ndarray
    class_cap: np.ndarray
    class_cap_reason: np.ndarray
    class_weight: np.ndarray
    group_shares: sp.csr_matrix      # flow groups x servers

    @property
    def n_classes(self) -> int:
        return len(self.class_group)

    def server_streams(self, active) -> np.ndarray:
        """Time-averaged concurrent client streams at each server."""
        per_group = np.bincount(self.class_group, weights=self.class_streams * active,
                                minlength=len(self.groups))
        return self.group_shares.T @ per_group

    def capacities(self, active) -> np.ndarray:
        cap = self.capacity.copy()
        o = self.offsets
        cap[o["server_bw"]:o["server_iops"]] = self.machine.profile.stream_factor(self.server_streams(active))
        return cap

    def solve(self, active=None) -> "Solution":
        active = np.ones(self.n_classes, bool) if active is None else np.asarray(active, bool)
        capacity = self.capacities(active)
        allocation = max_min_fair(capacity, self.usage, self.class_cap,
                                  np.where(active, self.class_streams, 0.0), self.class_weight)
        return Solution(self, active, capacity, allocation)

    # -- naming -------------------------------------------------------------------------------
    def describe(self, resource: int) -> dict:
        o, topo = self.offsets, self.machine.topology
        r = int(resource)
        if r < o["bb_in"]:
            return topo.describe_link(r)
        for kind, label in (("bb_in", "server link in"), ("bb_out", "server link out"),
                            ("server_bw", "server bandwidth"), ("server_iops", "server IOPS")):
            lo, hi = o[kind], o[kind] + len(self.servers.nids)
            if lo <= r < hi:
                name = self.servers.names[r - lo]
                cls = {"bb_in": "server link", "bb_out": "server link"}.get(kind, label)
                return {"class": cls, "server": name, "name": f"{label} {name}",
                        "router": int(self.machine.router_of(self.servers.nids[r - lo]))}
        raise IndexError(resource)


@dataclass
class Solution:
    problem: Problem
    active: np.ndarray
    capacity: np.ndarray
    allocation: object
    _groups: dict = field(default_factory=dict)

    @property
    def class_rate(self) -> np.ndarray:
        """GB/s of each class (all its flows)."""
        return self.allocation.rate * self.problem.class_streams * self.active

    def group_rate(self, index: int) -> float:
        mask = self.problem.class_group == index
        return float(self.class_rate[mask].sum())

    def job_rates(self) -> dict:
        out = {}
        for i, fg in enumerate(self.problem.groups):
            out[fg.job] = out.get(fg.job, 0.0) + self.group_rate(i)
        return out

    def utilization(self) -> np.ndarray:
        cap = self.capacity
        return np.divide(self.allocation.load, cap, out=np.zeros_like(cap), where=cap > 0)

    def saturated(self, threshold: float = 1 - 1e-6) -> np.ndarray:
        """Resources filled to capacity."""
        return np.flatnonzero(self.utilization() >= threshold)

    def binding_of(self, c: int) -> dict:
        """The constraint that froze class c: its own client limit, or a resource."""
        b = int(self.allocation.binding[c])
        if b == NOT_RUN:
            return {"class": "inactive", "name": "not running"}
        if b == BOUND_BY_CAP:
            reason = CAP_REASONS[int(self.problem.class_cap_reason[c])]
            return {"class": reason, "name": f"{reason} ({self.problem.class_cap[c]:.3g} GB/s per stream)"}
        info = self.problem.describe(b)
        info["resource"] = b
        info["utilization"] = float(self.utilization()[b])
        return info

    def bottlenecks(self, index: int, examples: int = 3) -> list:
        """Binding constraints of flow group `index`, grouped by constraint class."""
        p = self.problem
        rows = np.flatnonzero((p.class_group == index) & self.active)
        groups: dict = {}
        rates = self.class_rate
        binding = self.allocation.binding
        for c in rows:
            b = int(binding[c])
            key = ("cap", int(p.class_cap_reason[c])) if b == BOUND_BY_CAP else \
                  ("res", p.describe(b)["class"]) if b >= 0 else ("none", 0)
            entry = groups.setdefault(key, {"classes": 0, "nodes": 0.0, "streams": 0.0, "gbps": 0.0,
                                            "resources": {}})
            entry["classes"] += 1
            entry["nodes"] += float(p.groups[index].nodes[c - self._first(index)])
            entry["streams"] += float(p.class_streams[c])
            entry["gbps"] += float(rates[c])
            if b >= 0:
                entry["resources"][b] = entry["resources"].get(b, 0) + 1
        out = []
        util = self.utilization()
        saturated = self.saturated()
        touched = {}
        if len(saturated):
            mask = np.zeros(len(util), bool)
            mask[saturated] = True
            rows_of_group = rows[p.usage.select(rows).touches(mask)] if len(rows) else rows
            if len(rows_of_group):
                block = p.usage.block(rows_of_group, saturated)
                for col in np.flatnonzero(block.max(axis=0) > 0):
                    r = int(saturated[col])
                    touched.setdefault(p.describe(r)["class"], []).append(r)
        for key, entry in sorted(groups.items(), key=lambda kv: -kv[1]["gbps"]):
            kind = CAP_REASONS[key[1]] if key[0] == "cap" else key[1] if key[0] == "res" else "none"
            res = touched.get(kind, []) if key[0] == "res" else []
            res = sorted(res, key=lambda r: -entry["resources"].get(r, 0)) or \
                sorted(entry["resources"], key=lambda r: -entry["resources"][r])
            out.append({
                "constraint": kind,
                "kind": "client" if key[0] == "cap" else "resource",
                "nodes": int(round(entry["nodes"])), "streams": int(round(entry["streams"])),
                "gbps": entry["gbps"],
                "saturated_resources": len(res),
                "examples": [{**p.describe(r), "utilization": float(util[r])} for r in res[:examples]],
            })
        return out

    def class_bindings(self, index: int) -> list:
        """Every running class of flow group `index`: where its flows start, their rate, and the
        constraint that froze them, named (a client cap; a link with its class and endpoints; a
        server resource with its server)."""
        p = self.problem
        fg = p.groups[index]
        topo = p.machine.topology
        util = self.utilization()
        binding = self.allocation.binding
        named: dict = {}
        out = []
        for k, c in enumerate(np.flatnonzero(p.class_group == index)):
            if not self.active[c]:
                continue
            b = int(binding[c])
            if b == BOUND_BY_CAP:
                reason = CAP_REASONS[int(p.class_cap_reason[c])]
                info = {"constraint": reason, "bound_by": f"{reason} ({p.class_cap[c]:.3g} GB/s per stream)"}
            elif b >= 0:
                if b not in named:
                    d = p.describe(b)
                    named[b] = {"constraint": d["class"], "bound_by": d["name"], "utilization": float(util[b])}
                info = named[b]
            else:
                info = {"constraint": "none", "bound_by": "not running"}
            out.append({"job": fg.job, "op": fg.op, "router": topo.router_name(fg.routers[k]),
                        "nodes": int(fg.nodes[k]), "streams": int(fg.streams[k]),
                        "gbps_per_stream": float(self.allocation.rate[c]), "gbps": float(self.class_rate[c]),
                        **info})
        return out

    def _first(self, index: int) -> int:
        if index not in self._groups:
            self._groups[index] = int(np.flatnonzero(self.problem.class_group == index)[0])
        return self._groups[index]

    def top_resources(self, count: int = 5) -> list:
        util = self.utilization()
        order = np.argsort(-util)[:count]
        return [{**self.problem.describe(r), "utilization": float(util[r])} for r in order if util[r] > 0]


# -- building ----------------------------------------------------------------------------------

def flow_caps(machine: Machine, op: str, nodes, streams):
    """Per-stream cap and which client limit sets it (index into CAP_REASONS)."""
    per_node = np.asarray(streams, float) / np.maximum(np.asarray(nodes, float), 1e-300)
    options = np.stack([np.full(per_node.shape, machine.stream_cap[op]),
                        machine.node_cap / per_node,
                        machine.bandwidth["compute_node_link"] / per_node])
    reason = np.argmin(options, axis=0)
    return options.min(axis=0), reason


def size_efficiency(machine: Machine, fg: FlowGroup) -> float:
    """Fraction of a server's peak the flow group's calls get: eff(transfer size), or for a
    mix of sizes the byte-weighted harmonic mean (each byte takes 1/eff(its call's size) of
    the server's time per byte at peak)."""
    if not fg.size_mix:
        return machine.profile.size_factor(fg.transfer_size)
    sizes = np.array([s for s, _ in fg.size_mix], float)
    nbytes = np.array([b for _, b in fg.size_mix], float)
    if (sizes <= 0).any() or (nbytes < 0).any() or nbytes.sum() <= 0:
        raise ValueError("size_mix needs positive sizes and a positive byte total")
    eff = np.array([machine.profile.size_factor(x) for x in sizes])
    return float(nbytes.sum() / (nbytes / eff).sum())


def build_problem(machine: Machine, groups: list, servers: ServerTable | None = None) -> Problem:
    servers = servers or ServerTable.of_machine(machine)
    topo = machine.topology
    G, RC = topo.G, topo.RC
    n_srv = len(servers.nids)
    srv_router = machine.router_of(servers.nids)
    srv_group, srv_local = srv_router // RC, srv_router % RC
    offsets = {"bb_in": topo.n_links}
    offsets["bb_out"] = offsets["bb_in"] + n_srv
    offsets["server_bw"] = offsets["bb_out"] + n_srv
    offsets["server_iops"] = offsets["server_bw"] + n_srv
    n_res = offsets["server_iops"] + n_srv

    capacity = np.empty(n_res)
    capacity[:topo.global_offset] = np.where(topo.local_class == 0, machine.bandwidth["green"],
                                             machine.bandwidth["black"])[np.arange(topo.global_offset) % topo.n_local]
    capacity[topo.global_offset:topo.n_links] = machine.bandwidth["global"]
    capacity[offsets["bb_in"]:offsets["server_bw"]] = machine.bandwidth["bb_node_link"]
    capacity[offsets["server_bw"]:] = 1.0

    n_classes = sum(len(fg.routers) for fg in groups)
    coo_r, coo_c, coo_v = [], [], []          # B entries
    u_rows, u_cols = [], []                   # class -> far unit
    unit = n_classes                          # next far-unit row
    class_group, class_streams, class_cap, class_reason, class_weight = [], [], [], [], []
    share_rows, share_cols, share_vals = [], [], []
    base = 0
    v = machine.valiant_fraction if G > 2 else 0.0

    for gi, fg in enumerate(groups):
        n = len(fg.routers)
        if len(fg.nodes) != n or len(fg.streams) != n:
            raise ValueError("routers, nodes and streams must have one entry per class")
        if len(fg.servers) == 0 or not np.isclose(fg.shares.sum(), 1.0) or (fg.shares < 0).any():
            raise ValueError("a flow group needs servers whose shares are >= 0 and sum to 1")
        cap, reason = flow_caps(machine, fg.op, fg.nodes, fg.streams)
        class_group.append(np.full(n, gi)), class_streams.append(fg.streams)
        class_cap.append(cap), class_reason.append(reason)
        class_weight.append(np.full(n, fg.fairness_weight))
        share_rows.append(np.full(len(fg.servers), gi)), share_cols.append(fg.servers)
        share_vals.append(fg.shares)

        write = fg.op == "write"
        w = np.bincount(fg.servers, weights=fg.shares, minlength=n_srv)   # merge duplicates
        s_idx = np.flatnonzero(w)
        w_s, h_s, q_s = w[s_idx], srv_group[s_idx], srv_local[s_idx]
        W = np.bincount(h_s, weights=w_s, minlength=G)
        coef_bw = 1.0 / (machine.profile.peak[fg.op] * size_efficiency(machine, fg) *
                         (machine.shared_file_efficiency[fg.op] if fg.shared_file else 1.0))
        coef_iops = GB / (fg.transfer_size * machine.iops[fg.op])
        server_cols = np.concatenate([offsets["bb_in" if write else "bb_out"] + s_idx,
                                      offsets["server_bw"] + s_idx, offsets["server_iops"] + s_idx])
        server_vals = np.concatenate([w_s, w_s * coef_bw, w_s * coef_iops])

        src_group, src_local = fg.routers // RC, fg.routers % RC
        for g in np.unique(src_group):
            rows = base + np.flatnonzero(src_group == g)
            local = src_local[src_group == g]
            # compute-side unit of each class: from its router to the gateways / local servers
            tau = _compute_side_targets(topo, g, W, w_s, h_s, q_s, v)
            q = np.flatnonzero(tau)
            rr = np.repeat(rows, len(q))
            a = np.repeat(local, len(q))
            b = np.tile(q, len(rows))
            wt = np.tile(tau[q], len(rows))
            src, dst = (a, b) if write else (b, a)
            r_, c_, v_ = topo.expand_local(rr, np.full(len(rr), g), src, dst, wt)
            coo_r.append(r_), coo_c.append(c_), coo_v.append(v_)
            # far unit shared by every class of this group
            cols, vals = _far_side(topo, g, W, w_s, h_s, q_s, v, write)
            coo_r.append(np.full(len(cols) + len(server_cols), unit))
            coo_c.append(np.concatenate([cols, server_cols]))
            coo_v.append(np.concatenate([vals, server_vals]))
            u_rows.append(rows), u_cols.append(np.full(len(rows), unit))
            unit += 1
        base += n

    n_units = unit
    B = sp.csr_matrix((np.concatenate(coo_v), (np.concatenate(coo_r), np.concatenate(coo_c))),
                      shape=(n_units, n_res))
    B.sum_duplicates()
    B.eliminate_zeros()
    ur = np.concatenate([np.arange(n_classes)] + u_rows)
    uc = np.concatenate([np.arange(n_classes)] + u_cols)
    U = sp.csr_matrix((np.ones(len(ur)), (ur, uc)), shape=(n_classes, n_units))
    shares = sp.csr_matrix((np.concatenate(share_vals), (np.concatenate(share_rows), np.concatenate(share_cols))),
                           shape=(len(groups), n_srv))
    return Problem(machine=machine, servers=servers, groups=groups, usage=Factored(U, B),
                   capacity=capacity, offsets=offsets,
                   class_group=np.concatenate(class_group).astype(np.int64),
                   class_streams=np.concatenate(class_streams), class_cap=np.concatenate(class_cap),
                   class_cap_reason=np.concatenate(class_reason), class_weight=np.concatenate(class_weight),
                   group_shares=shares)


def _compute_side_targets(topo, g, W, w_s, h_s, q_s, v) -> np.ndarray:
    """Weight of traffic between a compute router of group g and each router of g where it
    leaves (or enters) the group, or meets a local server."""
    G, k, RC = topo.G, topo.k, topo.RC
    tau = np.bincount(q_s[h_s == g], weights=w_s[h_s == g], minlength=RC).astype(float)
    others = np.arange(G) != g
    remote = W * others
    gw = topo.gateway[g]                                   # (G, k)
    np.add.at(tau, gw[others].ravel(), np.repeat((1 - v) * remote[others] / k, k))
    if v > 0:
        via = v * (remote.sum() - remote) / ((G - 2) * k)  # g -> i, for every i != g
        np.add.at(tau, gw[others].ravel(), np.repeat(via[others], k))
    return tau


def _far_side(topo, g, W, w_s, h_s, q_s, v, write):
    """Global links, far-group local links (and Valiant transit) of traffic from group g."""
    G, k, RC = topo.G, topo.k, topo.RC
    gw = topo.gateway
    cols, vals = [], []

    def add_global(a, b, j, value):
        a, b = (a, b) if write else (b, a)
        cols.append(topo.global_index(a, b, j)), vals.append(np.asarray(value, float))

    def add_local(group, src, dst, value):
        src, dst = (src, dst) if write else (dst, src)
        _, c, val = topo.expand_local(np.zeros(len(src), np.int64), group, src, dst, value)
        cols.append(c), vals.append(val)

    js = np.arange(k)
    remote_h = np.flatnonzero((W > 0) & (np.arange(G) != g))
    if len(remote_h) and v < 1:
        hh = np.repeat(remote_h, k)
        jj = np.tile(js, len(remote_h))
        add_global(np.full(len(hh), g), hh, jj, (1 - v) * W[hh] / k)
        far = h_s != g
        sh, sq, sw = np.repeat(h_s[far], k), np.repeat(q_s[far], k), np.repeat(w_s[far], k)
        sj = np.tile(js, int(far.sum()))
        add_local(sh, gw[sh, g, sj], sq, (1 - v) * sw / k)
    if v > 0 and len(remote_h):
        scale = v / (G - 2)
        remote = W * (np.arange(G) != g)
        # first hop g -> i (i != g), weight of every h not in {g, i}
        ii = np.repeat(np.flatnonzero(np.arange(G) != g), k)
        jj = np.tile(js, G - 1)
        first = scale * (remote.sum() - remote[ii]) / k
        keep = first > 0
        add_global(np.full(keep.sum(), g), ii[keep], jj[keep], first[keep])
        # second hop i -> h for h remote, i not in {g, h}
        i2, h2, j2 = np.meshgrid(np.arange(G), remote_h, js, indexing="ij")
        ok = (i2 != g) & (i2 != h2)
        i2, h2, j2 = i2[ok], h2[ok], j2[ok]
        add_global(i2, h2, j2, scale * W[h2] / k)
        # transit inside i: from g's gateway to the gateway towards h
        i3, j3, h3, jp = np.meshgrid(np.flatnonzero(np.arange(G) != g), js, remote_h, js, indexing="ij")
        ok = i3 != h3
        i3, j3, h3, jp = i3[ok], j3[ok], h3[ok], jp[ok]
        add_local(i3, gw[i3, g, j3], gw[i3, h3, jp], scale * W[h3] / (k * k))
        # arrival in h from every i not in {g, h}: entry routers weighted by port count
        far = np.flatnonzero(h_s != g)
        for s in far:
            h = h_s[s]
            entry = topo.ports_used[h] - np.bincount(gw[h, g], minlength=RC)
            qq = np.flatnonzero(entry > 0)
            add_local(np.full(len(qq), h), qq, np.full(len(qq), q_s[s]), scale * w_s[s] * entry[qq] / k)
    if not cols:
        return np.zeros(0, np.int64), np.zeros(0)
    return np.concatenate(cols).astype(np.int64), np.concatenate(vals)
