"""Machine descriptions: a dragonfly, its node placement, client limits and a server profile.

A machine is a YAML file (format `bbsim_machine: 1`); the shipped ones live in
`bbsim/machines/` and are named without the extension (`trinity`, `cori-p1`, `cori`,
`cray-264`). The server profile is a separate file (`bbsim_server_profile: 1`) in
`bbsim/machines/profiles/`, shared by every machine that names it, so one fit serves all
systems. docs/bbsim.md describes every key.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from . import yamlio
from .errors import InputError
from .topology import Dragonfly, Shape

OPS = ("write", "read")
KINDS = ("empty", "compute", "burst_buffer", "lnet")
EMPTY, COMPUTE, BURST_BUFFER, LNET = range(4)


def shipped_dir() -> Path:
    return Path(str(resources.files("bbsim") / "machines"))


def shipped_machines() -> list[str]:
    return sorted(p.stem for p in shipped_dir().glob("*.yaml"))


@dataclass(frozen=True)
class ServerProfile:
    """Bandwidth of one burst-buffer server: peak x f(transfer size) x f(concurrent streams)."""

    name: str
    peak: dict                      # op -> GB/s, one server, few streams, best transfer size
    size_points: np.ndarray         # transfer sizes (bytes), increasing
    size_efficiency: np.ndarray     # fraction of peak at those sizes
    stream_points: np.ndarray       # concurrent client streams per server, increasing
    stream_efficiency: np.ndarray   # fraction of peak at those stream counts
    client_stream_cap: dict         # op -> GB/s per client stream
    source: str = ""

    def size_factor(self, transfer_size: float) -> float:
        """eff(x): piecewise linear in log2(size), flat outside the table."""
        return float(np.interp(np.log2(transfer_size), np.log2(self.size_points), self.size_efficiency))

    def stream_factor(self, streams):
        """Fraction of peak a server keeps with `streams` concurrent client streams."""
        s = np.maximum(np.asarray(streams, dtype=float), 1.0)
        return np.interp(np.log2(s), np.log2(self.stream_points), self.stream_efficiency)

    def bandwidth(self, op: str, transfer_size: float, streams: float = 1.0) -> float:
        return self.peak[op] * self.size_factor(transfer_size) * float(self.stream_factor(streams))


@dataclass(frozen=True)
class PFS:
    """The parallel file system behind cache instances (the machine's optional `pfs` section).

    `bandwidth` is the PFS's aggregate per op (GB/s), `share` the fraction of it the cache
    instances of a prediction may use (the rest is other users' load), split evenly between
    them. `reach` says how a burst-buffer server gets there: `lnet`, over its node link and
    the machine's LNET router nodes (`lnet_node_bandwidth` each, all of them shared); or
    `direct`, over a link of its own to the PFS (`server_link` each: a Spillway storage node
    mounting the PFS on its own network).
    """

    bandwidth: dict                 # op -> GB/s, aggregate
    share: float = 1.0
    reach: str = "lnet"             # "lnet" | "direct"
    lnet_node_bandwidth: float = 0.0
    server_link: float = 0.0


@dataclass(frozen=True)
class Placement:
    default: str
    rules: tuple                    # (kind, groups, chassis, slots, ports) tuples of index lists


@dataclass(frozen=True)
class Machine:
    name: str
    description: str
    source: str                     # file it came from
    shape: Shape
    bandwidth: dict                 # green, black, global, compute_node_link, bb_node_link
    valiant_fraction: float
    placement: Placement
    node_cap: float                 # GB/s per compute node (client side)
    stream_cap: dict                # op -> GB/s per client stream
    profile: ServerProfile
    iops: dict                      # op -> ops/s per server
    shared_file_efficiency: dict    # op -> fraction of server bandwidth for N-1 files
    hostname_rule: str              # "nid" | "ordered"
    hostname_prefix: str
    hostname_width: int
    hostname_map: dict = field(default_factory=dict)   # hostname -> nid
    sources: dict = field(default_factory=dict)
    pfs: PFS | None = None          # the PFS behind cache instances; None: not described

    @functools.cached_property
    def topology(self) -> Dragonfly:
        return Dragonfly(self.shape)

    @functools.cached_property
    def node_kind(self) -> np.ndarray:
        """Kind code (EMPTY, COMPUTE, BURST_BUFFER, LNET) of every nid.

        Rules are tried in order and the first one that matches a port decides its kind; a
        rule with a limit takes only the first `limit` still-unassigned matching ports (nid
        order). Ports no rule takes get the default kind.
        """
        s = self.shape
        shape4 = (s.groups, s.rows, s.cols, s.nodes_per_router)
        kinds = np.full(shape4, -1, dtype=np.int8)
        for kind, groups, chassis, slots, ports, limit in self.placement.rules:
            match = np.zeros(shape4, dtype=bool)
            match[np.ix_(groups, chassis, slots, ports)] = True
            free = np.flatnonzero(match.ravel() & (kinds.ravel() < 0))
            if limit is not None:
                free = free[:limit]
            kinds.ravel()[free] = KINDS.index(kind)
        flat = kinds.ravel()
        flat[flat < 0] = KINDS.index(self.placement.default)
        return flat

    def nids_of(self, kind: int) -> np.ndarray:
        return np.flatnonzero(self.node_kind == kind)

    @functools.cached_property
    def compute_nids(self) -> np.ndarray:
        return self.nids_of(COMPUTE)

    @functools.cached_property
    def bb_nids(self) -> np.ndarray:
        return self.nids_of(BURST_BUFFER)

    @functools.cached_property
    def lnet_nids(self) -> np.ndarray:
        return self.nids_of(LNET)

    def router_of(self, nid):
        return np.asarray(nid) // self.shape.nodes_per_router

    def group_of(self, nid):
        return self.router_of(nid) // self.shape.routers_per_group

    def hostname(self, nid: int) -> str:
        return f"{self.hostname_prefix}{int(nid):0{self.hostname_width}d}"

    def position(self, nid: int) -> dict:
        s = self.shape
        router, port = divmod(int(nid), s.nodes_per_router)
        group, local = divmod(router, s.routers_per_group)
        return {"group": group, "chassis": local // s.cols, "slot": local % s.cols, "port": port}

    def nid_at(self, group, chassis, slot, port) -> int:
        s = self.shape
        return ((group * s.rows + chassis) * s.cols + slot) * s.nodes_per_router + port

    def counts(self) -> dict:
        kinds = np.bincount(self.node_kind, minlength=len(KINDS))
        return {**{KINDS[i]: int(kinds[i]) for i in range(len(KINDS))}, **self.topology.link_counts(),
                "routers": self.shape.routers}

    def server_bandwidth(self, op, transfer_size, streams=1.0, shared_file=False) -> float:
        bw = self.profile.bandwidth(op, transfer_size, streams)
        return bw * (self.shared_file_efficiency[op] if shared_file else 1.0)


# -- loading -----------------------------------------------------------------------------------

def resolve_machine_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    candidate = shipped_dir() / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    raise InputError(name_or_path, None, "no such machine file and no shipped machine of that name",
                     f"give a path to a machine YAML, or one of: {', '.join(shipped_machines())}")


@functools.lru_cache(maxsize=32)
def _load_cached(path: str, overrides: tuple) -> Machine:
    doc = yamlio.load(path)
    if overrides:
        _apply_overrides(doc, overrides)
    return parse_machine(doc)


def load_machine(name_or_path: str, overrides: tuple = ()) -> Machine:
    """Load a machine by shipped name or path; overrides are ("dotted.key", value) pairs."""
    path = resolve_machine_path(name_or_path)
    overrides = tuple(overrides)
    try:
        hash(overrides)
    except TypeError:              # list or mapping values: parse without the cache
        doc = yamlio.load(str(path))
        _apply_overrides(doc, overrides)
        return parse_machine(doc)
    return _load_cached(str(path), overrides)


def parse_override(text: str) -> tuple:
    """'topology.global_links_per_pair=2' -> ('topology.global_links_per_pair', 2)."""
    import yaml
    if "=" not in text:
        raise InputError("--set", text, "expected KEY=VALUE", "write e.g. --set routing.valiant_fraction=0.2")
    key, value = text.split("=", 1)
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


def _apply_overrides(doc: yamlio.Document, overrides: tuple) -> None:
    for key, value in overrides:
        node = doc.data
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node, dict):
                raise InputError("--set", key, f"'{part}' is not a section", "name a key inside a section")
            node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise InputError("--set", key, "the parent is not a section", "name a key inside a section")
        node[parts[-1]] = value
        doc.lines.pop(tuple(parts), None)
        doc.overrides[tuple(parts)] = f"--set {key}={value}"
        # an overridden value no longer comes from the file's cited source
        sources = doc.data.get("sources") if isinstance(doc.data, dict) else None
        if isinstance(sources, dict):
            for cited in [k for k in sources if str(k) == key or str(k).startswith(key + ".")]:
                del sources[cited]


def parse_machine(doc: yamlio.Document) -> Machine:
    top = yamlio.Section(doc)
    version = top.number("bbsim_machine", integer=True, hint="the format version, 1")
    if version != 1:
        raise top.error("bbsim_machine", f"unsupported format version {version}", "this bbsim reads version 1")
    name = top.string("name")
    description = top.string("description", "")

    t = top.section("topology")
    shape = Shape(
        groups=t.number("groups", integer=True, minimum=1),
        rows=t.number("chassis_per_group", integer=True, minimum=1),
        cols=t.number("slots_per_chassis", integer=True, minimum=1),
        nodes_per_router=t.number("nodes_per_router", integer=True, minimum=1),
        links_per_pair=t.number("global_links_per_pair", 1, integer=True, minimum=1),
        ports_per_router=t.number("global_ports_per_router", integer=True, minimum=1),
        assignment=t.choice("global_port_assignment", ("consecutive", "round_robin"), "consecutive"),
        routing="minimal",
    )
    t.done()
    if not shape.fits():
        need = (shape.groups - 1) * shape.links_per_pair
        have = shape.routers_per_group * shape.ports_per_router
        raise t.error("global_ports_per_router", f"a group needs {need} global ports "
                      f"({shape.groups - 1} other groups x {shape.links_per_pair} links) but has {have}",
                      "raise global_ports_per_router or lower global_links_per_pair")

    b = top.section("bandwidth")
    unit = "GB/s"
    bandwidth = {
        "green": b.number("green", positive=True, unit=unit, hint="GB/s per direction"),
        "black": b.number("black", positive=True, unit=unit, hint="GB/s per direction"),
        "global": b.number("global", positive=True, unit=unit, hint="GB/s per direction, per link"),
        "compute_node_link": b.number("compute_node_link", positive=True, unit=unit),
        "bb_node_link": b.number("bb_node_link", positive=True, unit=unit),
    }
    b.done()

    r = top.section("routing", required=False)
    routing = r.choice("mode", ("minimal", "minimal-single"), "minimal")
    valiant = r.fraction("valiant_fraction", 0.0)
    r.done()
    shape = Shape(**{**shape.__dict__, "routing": routing})

    placement = _parse_placement(top.section("placement"), shape)
    client = top.section("client", required=False)
    server = top.section("server")
    profile = _parse_profile_ref(server, doc)
    node_cap = client.number("node_cap", bandwidth["compute_node_link"], positive=True, unit=unit)
    stream_cap = _per_op(client, "stream_cap", profile.client_stream_cap, positive=True)
    client.done()
    iops = _per_op(server, "iops", None, positive=True)
    shared = _per_op(server, "shared_file_efficiency", {"write": 1.0, "read": 1.0}, fraction=True)
    server.done()

    pfs = _parse_pfs(top, bandwidth) if top.has("pfs") else None

    h = top.section("hostnames", required=False)
    rule = h.choice("rule", ("nid", "ordered"), "nid")
    prefix = h.string("prefix", "nid")
    width = h.number("width", 5, integer=True, minimum=0)
    hostmap = _parse_hostmap(h, shape)
    h.done()

    sources = top.raw("sources", {})
    if not isinstance(sources, dict):
        raise top.error("sources", "expected a mapping 'dotted.key: citation'", "write one citation per key")
    for key in sources:
        if not _path_exists(doc.data, str(key)):
            raise top.error("sources", f"source given for '{key}', which is not a key of this file",
                            "correct the dotted key or remove the entry")
    top.done()

    machine = Machine(name=name, description=description, source=doc.source, shape=shape,
                      bandwidth=bandwidth, valiant_fraction=valiant if shape.groups > 2 else 0.0,
                      placement=placement, node_cap=node_cap, stream_cap=stream_cap, profile=profile,
                      iops=iops, shared_file_efficiency=shared, hostname_rule=rule,
                      hostname_prefix=prefix, hostname_width=width, hostname_map=hostmap,
                      sources=dict(sources), pfs=pfs)
    counts = machine.counts()
    if counts["compute"] == 0:
        raise top.error("placement", "the placement leaves no compute nodes", "make some ports compute")
    if counts["burst_buffer"] == 0:
        raise top.error("placement", "the placement has no burst_buffer nodes",
                        "add a rule with kind: burst_buffer")
    if pfs is not None and pfs.reach == "lnet" and counts["lnet"] == 0:
        raise top.error("pfs", "pfs.reach is lnet: the servers reach the PFS through LNET routers, but the placement has none",
                        "add a placement rule with kind: lnet, or set pfs.reach: direct")
    return machine


def _parse_pfs(top: yamlio.Section, bandwidth: dict) -> PFS:
    p = top.section("pfs")
    bw = _per_op(p, "bandwidth", None, positive=True)
    share = p.fraction("share", 1.0, positive=True)
    reach = p.choice("reach", ("lnet", "direct"), "lnet")
    lnet = p.number("lnet_node_bandwidth", bandwidth["bb_node_link"], positive=True, unit="GB/s")
    link = p.number("server_link", bandwidth["bb_node_link"], positive=True, unit="GB/s")
    p.done()
    return PFS(bandwidth=bw, share=share, reach=reach, lnet_node_bandwidth=lnet, server_link=link)


def _path_exists(data, dotted: str) -> bool:
    node = data
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def _per_op(section, key, default, *, positive=False, fraction=False) -> dict:
    if default is not None and not section.has(key):
        section.raw(key, None)
        return dict(default)
    sub = section.section(key)
    out = {}
    for op in OPS:
        if fraction:
            out[op] = sub.fraction(op, positive=True)
        else:
            out[op] = sub.number(op, positive=positive)
    sub.done()
    return out


def _parse_placement(p: yamlio.Section, shape: Shape) -> Placement:
    default = p.choice("default", KINDS, "compute")
    rules = []
    for index, _ in enumerate(p.sequence("rules", [])):
        rule = p.item_section("rules", index)
        kind = rule.choice("kind", KINDS)
        groups = rule.int_list("groups", upper=shape.groups, default=list(range(shape.groups)))
        chassis = rule.int_list("chassis", upper=shape.rows, default=list(range(shape.rows)))
        slots = rule.int_list("slots", upper=shape.cols, default=list(range(shape.cols)))
        ports = rule.int_list("ports", upper=shape.nodes_per_router,
                              default=list(range(shape.nodes_per_router)))
        limit = rule.number("limit", None, integer=True, minimum=0)
        rule.done()
        rules.append((kind, groups, chassis, slots, ports, limit))
    p.done()
    return Placement(default=default, rules=tuple(rules))


def _parse_hostmap(h: yamlio.Section, shape: Shape) -> dict:
    raw = h.raw("map", {})
    if not isinstance(raw, dict):
        raise h.error("map", "expected a mapping 'hostname: nid' or 'hostname: {group, chassis, slot, port}'",
                      "write one hostname per line")
    out = {}
    for host, where in raw.items():
        if isinstance(where, int) and not isinstance(where, bool):
            nid = where
        elif isinstance(where, dict):
            sub = yamlio.Section(h.doc, h.path + ("map", host), where)
            g = sub.number("group", integer=True, minimum=0)
            c = sub.number("chassis", integer=True, minimum=0)
            s = sub.number("slot", integer=True, minimum=0)
            port = sub.number("port", integer=True, minimum=0)
            sub.done()
            if g >= shape.groups or c >= shape.rows or s >= shape.cols or port >= shape.nodes_per_router:
                raise sub.error(None, "position outside the machine", "check group/chassis/slot/port ranges")
            nid = ((g * shape.rows + c) * shape.cols + s) * shape.nodes_per_router + port
        else:
            raise h.error("map", f"'{host}': expected a nid or a position", "write 'host: 42' or 'host: {group: 0, chassis: 0, slot: 1, port: 0}'")
        if not 0 <= nid < shape.nodes:
            raise h.error("map", f"'{host}': nid {nid} is outside the machine (0 to {shape.nodes - 1})",
                          "use a nid inside the machine")
        out[str(host)] = int(nid)
    return out


def _parse_profile_ref(server: yamlio.Section, doc: yamlio.Document) -> ServerProfile:
    ref = server.raw("profile", hint="the name of a server profile, e.g. datawarp-2xP3608")
    if isinstance(ref, dict):
        return parse_profile(yamlio.Section(doc, ("server", "profile"), ref), name_default="inline")
    ref = str(ref)
    path = Path(ref)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        local = Path(doc.source).parent / "profiles" / f"{ref}.yaml"
        path = local if local.exists() else shipped_dir() / "profiles" / f"{ref}.yaml"
    if not path.exists():
        names = sorted(p.stem for p in (shipped_dir() / "profiles").glob("*.yaml"))
        raise server.error("profile", f"no server profile named '{ref}'",
                           f"use one of: {', '.join(names)}, or a path to a profile YAML")
    return load_profile(str(path))


@functools.lru_cache(maxsize=16)
def load_profile(path: str) -> ServerProfile:
    doc = yamlio.load(path)
    top = yamlio.Section(doc)
    version = top.number("bbsim_server_profile", integer=True)
    if version != 1:
        raise top.error("bbsim_server_profile", f"unsupported version {version}", "this bbsim reads version 1")
    profile = parse_profile(top, name_default=Path(path).stem)
    return profile


def parse_profile(top: yamlio.Section, name_default: str) -> ServerProfile:
    name = top.string("name", name_default)
    top.string("description", "")
    peak = _per_op(top, "peak_bandwidth", None, positive=True)
    sizes, size_eff = _table(top, "transfer_size_efficiency", size_keys=True)
    streams, stream_eff = _table(top, "stream_efficiency", size_keys=False)
    stream_cap = _per_op(top, "client_stream_cap", None, positive=True)
    sources = top.raw("sources", {})
    if not isinstance(sources, dict):
        raise top.error("sources", "expected a mapping 'dotted.key: citation'", "write one citation per key")
    top.done()
    return ServerProfile(name=name, peak=peak, size_points=sizes, size_efficiency=size_eff,
                         stream_points=streams, stream_efficiency=stream_eff,
                         client_stream_cap=stream_cap, source=top.doc.source)


def _table(top: yamlio.Section, key: str, size_keys: bool):
    from .units import parse_size
    items = top.sequence(key)
    xs, ys = [], []
    for index, item in enumerate(items):
        if not isinstance(item, list) or len(item) != 2:
            raise top.error_at((key, index), f"expected a [{'size' if size_keys else 'streams'}, efficiency] pair, found {item}",
                              "write pairs such as [512KiB, 1.0]" if size_keys else "write pairs such as [16, 1.0]")
        try:
            x = parse_size(item[0]) if size_keys else float(item[0])
            if x <= 0:
                raise ValueError("must be positive")
        except (ValueError, TypeError) as exc:
            raise top.error_at((key, index), f"bad first value {item[0]!r}: {exc}", "write a positive size or count") from None
        y = item[1]
        if isinstance(y, bool) or not isinstance(y, (int, float)) or not 0 < y <= 1:
            raise top.error_at((key, index), f"efficiency {y!r} is not in (0, 1]", "write a fraction such as 0.93")
        xs.append(x), ys.append(float(y))
    if not xs:
        raise top.error(key, "the table is empty", "give at least one pair")
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise top.error(key, "the first column must increase strictly", "sort the pairs by their first value")
    return np.array(xs), np.array(ys)
