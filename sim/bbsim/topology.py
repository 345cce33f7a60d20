"""Dragonfly topology of a Cray XC-style machine, as flow-level resources and route fractions.

Layout (the CODES "dragonfly-custom" / Cray XC shape):
  * G groups; each group is a matrix of routers, `rows` chassis x `cols` slots;
  * green links join every ordered pair of routers in the same chassis (row);
  * black links join every ordered pair in the same slot column (one bundled link each);
  * k global links join every ordered pair of groups; each sits on a router of each group,
    the "gateway" of that pair (placement rule: `consecutive` = absolute arrangement, ports
    filled router by router; `round_robin` = spread over routers);
  * P node ports per router; node id (nid) = router * P + port, routers numbered
    group-major, then chassis, then slot.

Every link is directed: one resource per direction. Routes are fixed split fractions:
  * inside a group, minimal: one hop when routers share a row or column, otherwise two
    two-hop paths (green then black, black then green) at 1/2 each, the surrogate for Aries
    adaptive routing; `minimal-single` keeps only green-then-black;
  * between groups: 1/k over the pair's global links, each reached through its gateway;
  * a Valiant fraction v of every inter-group flow goes through the other groups evenly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GREEN, BLACK, GLOBAL = 0, 1, 2
LINK_CLASS_NAMES = ("green", "black", "global")


@dataclass(frozen=True)
class Shape:
    groups: int
    rows: int                 # chassis per group
    cols: int                 # router slots per chassis
    nodes_per_router: int
    links_per_pair: int       # k: global links per ordered pair of groups
    ports_per_router: int     # global link ports on one router
    assignment: str           # "consecutive" | "round_robin"
    routing: str = "minimal"  # "minimal" | "minimal-single"

    @property
    def routers_per_group(self) -> int:
        return self.rows * self.cols

    @property
    def routers(self) -> int:
        return self.groups * self.routers_per_group

    @property
    def nodes(self) -> int:
        return self.routers * self.nodes_per_router

    def ports_needed(self) -> int:
        """Global ports the busiest router needs under the assignment rule."""
        per_group = (self.groups - 1) * self.links_per_pair
        if self.assignment == "consecutive":
            return min(self.ports_per_router, per_group)
        return -(-per_group // self.routers_per_group)

    def fits(self) -> bool:
        per_group = (self.groups - 1) * self.links_per_pair
        return per_group <= self.routers_per_group * self.ports_per_router


class Dragonfly:
    """Link indexing, route templates and gateways for one Shape."""

    def __init__(self, shape: Shape):
        if not shape.fits():
            raise ValueError("not enough global ports for the global links")
        self.shape = shape
        G, R, C = shape.groups, shape.rows, shape.cols
        RC = R * C
        self.G, self.R, self.C, self.RC, self.k = G, R, C, RC, shape.links_per_pair

        # Local link template of one group; group g's copy is offset by g * n_local.
        src, dst, cls = [], [], []
        for row in range(R):
            for a in range(C):
                for b in range(C):
                    if a != b:
                        src.append(row * C + a), dst.append(row * C + b), cls.append(GREEN)
        for col in range(C):
            for a in range(R):
                for b in range(R):
                    if a != b:
                        src.append(a * C + col), dst.append(b * C + col), cls.append(BLACK)
        self.local_src = np.array(src, dtype=np.int64)
        self.local_dst = np.array(dst, dtype=np.int64)
        self.local_class = np.array(cls, dtype=np.int8)
        self.n_local = len(src)
        self.link_between = np.full((RC, RC), -1, dtype=np.int64)
        self.link_between[self.local_src, self.local_dst] = np.arange(self.n_local)

        self._build_route_template(shape.routing)
        self._build_gateways()
        self.n_global = G * (G - 1) * self.k
        self.global_offset = G * self.n_local
        self.n_links = self.global_offset + self.n_global

    # -- routes inside a group ----------------------------------------------------------------
    def _build_route_template(self, routing: str) -> None:
        """CSR over router pairs p = a * RC + b: the local links of a -> b and their fractions."""
        C, RC = self.C, self.RC
        a = np.repeat(np.arange(RC), RC)
        b = np.tile(np.arange(RC), RC)
        ra, ca, rb, cb = a // C, a % C, b // C, b % C
        direct = (a != b) & ((ra == rb) | (ca == cb))
        twohop = (ra != rb) & (ca != cb)
        rows, links, fracs = [], [], []
        pair = np.arange(RC * RC)
        rows.append(pair[direct]), links.append(self.link_between[a[direct], b[direct]])
        fracs.append(np.ones(direct.sum()))
        # green then black, through the router in a's row and b's column
        via = ra * C + cb
        share = 1.0 if routing == "minimal-single" else 0.5
        rows += [pair[twohop], pair[twohop]]
        links += [self.link_between[a[twohop], via[twohop]], self.link_between[via[twohop], b[twohop]]]
        fracs += [np.full(twohop.sum(), share)] * 2
        if routing != "minimal-single":
            # black then green, through the router in b's row and a's column
            via2 = rb * C + ca
            rows += [pair[twohop], pair[twohop]]
            links += [self.link_between[a[twohop], via2[twohop]], self.link_between[via2[twohop], b[twohop]]]
            fracs += [np.full(twohop.sum(), 0.5)] * 2
        rows = np.concatenate(rows)
        order = np.argsort(rows, kind="stable")
        self.route_link = np.concatenate(links)[order]
        self.route_frac = np.concatenate(fracs)[order]
        counts = np.bincount(rows, minlength=RC * RC)
        self.route_ptr = np.concatenate([[0], np.cumsum(counts)])

    def local_route(self, a: int, b: int) -> list[tuple[int, float]]:
        """(template link, fraction) of the route a -> b inside one group (for tests/reports)."""
        p = a * self.RC + b
        lo, hi = self.route_ptr[p], self.route_ptr[p + 1]
        return list(zip(self.route_link[lo:hi].tolist(), self.route_frac[lo:hi].tolist()))

    def expand_local(self, rows, groups, src, dst, weights):
        """COO entries (row, link, value) of `weights` routed src -> dst inside `groups`.

        All arguments are equal-length arrays (src and dst are router indices inside the
        group); pairs with src == dst add nothing.
        """
        pair = np.asarray(src, dtype=np.int64) * self.RC + np.asarray(dst, dtype=np.int64)
        start = self.route_ptr[pair]
        count = self.route_ptr[pair + 1] - start
        rep = np.repeat(np.arange(len(pair)), count)
        first = np.repeat(np.cumsum(count) - count, count)
        pos = start[rep] + (np.arange(len(rep)) - first)
        link = self.route_link[pos] + np.asarray(groups, dtype=np.int64)[rep] * self.n_local
        value = self.route_frac[pos] * np.asarray(weights, dtype=float)[rep]
        return np.asarray(rows, dtype=np.int64)[rep], link, value

    # -- global links -------------------------------------------------------------------------
    def _build_gateways(self) -> None:
        """gateway[g, h, j]: router (inside g) holding g's end of global link j of pair g-h."""
        G, k, RC = self.G, self.k, self.RC
        ports = self.shape.ports_per_router
        self.gateway = np.full((G, G, k), -1, dtype=np.int64)
        for g in range(G):
            others = [h for h in range(G) if h != g]
            for idx, h in enumerate(others):
                for j in range(k):
                    n = idx * k + j
                    router = n // ports if self.shape.assignment == "consecutive" else n % RC
                    self.gateway[g, h, j] = router
        # links of group g on each of its routers (for Valiant entry weights)
        self.ports_used = np.zeros((G, RC))
        for g in range(G):
            gw = self.gateway[g][np.arange(G) != g].ravel()
            self.ports_used[g] = np.bincount(gw, minlength=RC)

    def global_index(self, g, h, j):
        """Resource index of the directed global link j from group g to group h (arrays ok)."""
        g, h, j = np.asarray(g), np.asarray(h), np.asarray(j)
        hh = np.where(h < g, h, h - 1)
        return self.global_offset + (g * (self.G - 1) + hh) * self.k + j

    # -- naming -------------------------------------------------------------------------------
    def router_name(self, router: int) -> str:
        g, local = divmod(int(router), self.RC)
        return f"g{g}:c{local // self.C}s{local % self.C}"

    def describe_link(self, index: int) -> dict:
        """Class, endpoints and a readable name of a network link resource."""
        index = int(index)
        if index < self.global_offset:
            g, t = divmod(index, self.n_local)
            cls = LINK_CLASS_NAMES[self.local_class[t]]
            a = g * self.RC + int(self.local_src[t])
            b = g * self.RC + int(self.local_dst[t])
            return {"class": cls, "group": g, "from": self.router_name(a), "to": self.router_name(b),
                    "from_router": a, "to_router": b,
                    "name": f"{cls} {self.router_name(a)} -> {self.router_name(b)}"}
        rest = index - self.global_offset
        pair, j = divmod(rest, self.k)
        g, hh = divmod(pair, self.G - 1)
        h = hh if hh < g else hh + 1
        a = g * self.RC + int(self.gateway[g, h, j])
        b = h * self.RC + int(self.gateway[h, g, j])
        return {"class": "global", "group": g, "to_group": h, "from": self.router_name(a),
                "to": self.router_name(b), "from_router": a, "to_router": b,
                "name": f"global g{g} -> g{h} #{j} ({self.router_name(a)} -> {self.router_name(b)})"}

    def link_counts(self) -> dict:
        green = int((self.local_class == GREEN).sum()) * self.G
        black = int((self.local_class == BLACK).sum()) * self.G
        return {"green": green, "black": black, "global": self.n_global}
