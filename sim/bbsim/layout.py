"""Spillway layout snapshots (format versions 1 and 2) and `predict`: what a job will get from
the instances a running Spillway gave it.

The snapshot lists the controller's pools, storage nodes, instances with their fragments,
configurations and sessions (docs/bbsim.md, "Spillway layout snapshot"; JSON Schemas in
bbsim/schemas/spillway-layout-v1.json and -v2.json: version 2 adds a cache configuration's
settings, `configurations[].cache`). Hostnames are placed on the machine
by its `hostnames` section: an explicit map first, then the rule (`nid`: hostname
<prefix><number> sits at that nid; `ordered`: storage nodes take the machine's burst-buffer
positions and client nodes its compute positions, both in natural hostname order).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from . import cache as cachemodel
from .errors import InputError
from .ior import IorSpec, flow_groups_for, select_nodes
from .machine import Machine
from .model import ServerTable, build_problem, size_efficiency
from .units import GB

ACCESS_MODES = ("striped", "private", "loadbalance")


class ReadOnlyInstance(InputError):
    """A write predicted on a loadbalance instance (read-only for jobs)."""


VERSIONS = (1, 2)


def schema(version: int = 1) -> dict:
    return json.loads((resources.files("bbsim") / "schemas" / f"spillway-layout-v{version}.json").read_text())


@dataclass
class Snapshot:
    source: str
    data: dict
    nodes: dict = field(default_factory=dict)          # hostname -> node object
    instances: dict = field(default_factory=dict)      # id -> instance
    sessions: dict = field(default_factory=dict)       # token -> session
    configurations: dict = field(default_factory=dict)  # instance id -> [configuration]


def load_snapshot(path) -> Snapshot:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(source, None, "no such snapshot file", "check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(source, None, f"cannot read ({exc})", "pass a readable UTF-8 JSON file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(source, f"line {exc.lineno}, column {exc.colno}", f"malformed JSON: {exc.msg}",
                         "fix the JSON syntax there") from None
    return parse_snapshot(data, source)


def _field(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_snapshot(data, source: str = "snapshot") -> Snapshot:
    import jsonschema
    version = data.get("version") if isinstance(data, dict) else None
    if isinstance(data, dict) and "version" in data and version not in VERSIONS:
        raise InputError(source, "field version", f"unsupported format version {version!r}",
                         "this bbsim reads versions 1 and 2 (docs/bbsim.md, 'Spillway layout snapshot')")
    validator = jsonschema.Draft202012Validator(schema(version if version in VERSIONS else 1))
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        where = f"field {_field(err.absolute_path)}"
        if err.validator == "required":
            missing = re.findall(r"'([^']+)' is a required property", err.message)
            fix = f"add the field '{missing[0]}'" if missing else "add the missing field"
        elif err.validator == "additionalProperties":
            fix = "remove the unknown field, or prefix an extension field with 'x_'"
            if version == 1 and "'cache'" in err.message:
                fix = "a configuration's 'cache' settings need \"version\": 2"
        elif err.validator in ("const", "enum"):
            fix = f"use {err.validator_value!r}" if err.validator == "const" else \
                f"use one of {', '.join(map(str, err.validator_value))}"
        elif err.validator == "minimum":
            fix = f"use a value >= {err.validator_value}"
        elif err.validator == "maximum":
            fix = f"use a value <= {err.validator_value}"
        elif err.validator == "type":
            fix = f"write {_TYPE_WORDS.get(err.validator_value, err.validator_value)}" + \
                  (" (sizes are plain byte counts, not strings with units)" if err.validator_value == "integer" else "")
        elif err.validator == "minItems":
            fix = "list at least one item (an instance without fragments cannot be placed; leave it out)"
        elif err.validator == "minLength":
            fix = "write a non-empty name"
        else:
            fix = "see docs/bbsim.md, 'Spillway layout snapshot, format version 1'"
        raise InputError(source, where, err.message, fix)

    snap = Snapshot(source=source, data=data)
    for table, key in (("pools", "id"), ("sessions", "id"), ("configurations", "id")):
        _unique(data[table], table, key, source)
    _unique([f for inst in data["instances"] for f in inst["fragments"]], "fragments", "id", source,
            where=lambda i: _fragment_field(data, i))
    pools = {p["id"] for p in data["pools"]}
    for i, node in enumerate(data["nodes"]):
        if node["id"] in snap.nodes:
            raise InputError(source, f"field nodes[{i}].id", f"duplicate node '{node['id']}'", "list each node once")
        if node["pool"] not in pools:
            raise InputError(source, f"field nodes[{i}].pool", f"unknown pool '{node['pool']}'",
                             f"use one of the pools listed: {', '.join(sorted(pools))}")
        snap.nodes[node["id"]] = node
    for i, sess in enumerate(data["sessions"]):
        if sess["token"] in snap.sessions:
            raise InputError(source, f"field sessions[{i}].token", f"duplicate session token '{sess['token']}'",
                             "tokens are unique")
        snap.sessions[sess["token"]] = sess
    for i, inst in enumerate(data["instances"]):
        if inst["id"] in snap.instances:
            raise InputError(source, f"field instances[{i}].id", f"duplicate instance id {inst['id']}", "ids are unique")
        if inst["session"] not in snap.sessions:
            raise InputError(source, f"field instances[{i}].session", f"no session with token '{inst['session']}'",
                             "add the session to 'sessions' or correct the token")
        for f, frag in enumerate(inst["fragments"]):
            if frag["node"] not in snap.nodes:
                raise InputError(source, f"field instances[{i}].fragments[{f}].node",
                                 f"fragment on unknown storage node '{frag['node']}'",
                                 "list the node under 'nodes' or correct the hostname")
        snap.instances[inst["id"]] = inst
    for i, conf in enumerate(data["configurations"]):
        if conf["instance"] not in snap.instances:
            raise InputError(source, f"field configurations[{i}].instance", f"no instance with id {conf['instance']}",
                             "correct the instance id")
        snap.configurations.setdefault(conf["instance"], []).append(conf)
    return snap


_TYPE_WORDS = {"integer": "a whole number", "boolean": "true or false", "string": "a JSON string",
               "array": "a JSON list [...]", "object": "a JSON object {...}"}


def _unique(items, table, key, source, where=None) -> None:
    seen = {}
    for i, item in enumerate(items):
        value = item[key]
        if value in seen:
            place = where(i) if where else f"field {table}[{i}].{key}"
            first = where(seen[value]).removeprefix("field ") if where else f"{table}[{seen[value]}]"
            raise InputError(source, place, f"duplicate {table[:-1]} {key} {value!r} (also at {first})",
                             f"give every {table[:-1]} its own {key}")
        seen[value] = i


def _fragment_field(data, index) -> str:
    for i, inst in enumerate(data["instances"]):
        if index < len(inst["fragments"]):
            return f"field instances[{i}].fragments[{index}].id"
        index -= len(inst["fragments"])
    return "field instances"


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def map_hostnames(machine: Machine, storage: list, clients: list, rule: str | None = None,
                  source: str = "snapshot") -> dict:
    """hostname -> nid for every storage and client hostname (see module docstring)."""
    rule = rule or machine.hostname_rule
    out = {h: machine.hostname_map[h] for h in storage + clients if h in machine.hostname_map}
    if rule == "nid":
        pattern = re.compile(rf"^{re.escape(machine.hostname_prefix)}0*(\d+)$")
        for host in storage + clients:
            if host in out:
                continue
            match = pattern.match(host)
            if not match:
                raise InputError(source, f"hostname '{host}'",
                                 f"does not follow the machine's nid rule ('{machine.hostname_prefix}' + number)",
                                 f"add '{host}' to hostnames.map in {machine.source}, or use --mapping ordered")
            nid = int(match.group(1))
            if nid >= machine.shape.nodes:
                raise InputError(source, f"hostname '{host}'", f"nid {nid} is outside {machine.name} "
                                 f"(0 to {machine.shape.nodes - 1})", "check the machine file")
            out[host] = nid
    else:
        for hosts, positions, what in ((storage, machine.bb_nids, "burst-buffer"),
                                       (clients, machine.compute_nids, "compute")):
            todo = sorted((h for h in dict.fromkeys(hosts) if h not in out), key=_natural)
            taken = set(out.values())
            free = [n for n in positions if n not in taken]
            if len(todo) > len(free):
                raise InputError(source, None, f"{len(todo)} {what} hostnames but {machine.name} has "
                                 f"{len(free)} free {what} positions", "use a larger machine description")
            out.update(zip(todo, (int(n) for n in free)))
    seen: dict = {}
    for host, nid in out.items():
        if nid in seen:
            raise InputError(source, f"hostname '{host}'", f"maps to nid {nid}, as '{seen[nid]}' does",
                             "give each hostname its own position (hostnames.map)")
        seen[nid] = host
    return out


def instance_of(snap: Snapshot, token: str, instance_id: int | None = None) -> dict:
    if token not in snap.sessions:
        raise InputError("--session", token, "no session with that token in the snapshot",
                         f"use one of: {', '.join(sorted(snap.sessions)) or '(none)'}")
    mine = [i for i in snap.instances.values() if i["session"] == token]
    if instance_id is not None:
        mine = [i for i in mine if i["id"] == instance_id]
    if not mine:
        raise InputError("--session", token, "the session has no instance" +
                         (f" with id {instance_id}" if instance_id is not None else ""),
                         "pick a session that owns an instance (see 'instances' in the snapshot)")
    if len(mine) > 1:
        raise InputError("--session", token, f"the session has {len(mine)} instances",
                         f"choose one with --instance ({', '.join(str(i['id']) for i in mine)})")
    return mine[0]


def predict(machine: Machine, snap: Snapshot, token: str, spec: IorSpec, *, instance_id=None,
            concurrent: list | None = None, rule: str | None = None, nodes: int | None = None,
            classes: bool = False) -> dict:
    """Expected bandwidth of session `token`'s job on its instance, and what limits it.

    `concurrent` lists other session tokens whose jobs run the same kind of I/O at the same
    time on their own instances (a what-if: "what will X get if Y starts too?"). A session
    that lists no client nodes (a persistent instance, or a job whose nodes are not known
    yet) is modelled on `nodes` compute nodes: the first ones, in nid order, that no other
    job of the prediction uses.
    """
    if spec.ppn < 1:
        raise InputError("--ppn", str(spec.ppn), "must be at least 1", "give the processes (client streams) per node")
    if nodes is not None and nodes < 1:
        raise InputError("--nodes", str(nodes), "must be at least 1", "give a compute node count")
    storage = sorted(snap.nodes, key=_natural)
    tokens = [token] + [t for t in (concurrent or []) if t != token]
    clients = []
    for t in tokens:
        instance_of(snap, t)
        clients += snap.sessions[t]["client_nodes"]
    position = map_hostnames(machine, storage, clients, rule, snap.source)
    taken = np.array(sorted({position[h] for h in clients}), dtype=np.int64)
    table = ServerTable(nids=np.array([position[h] for h in storage], dtype=np.int64), names=storage)
    index = {h: i for i, h in enumerate(storage)}
    groups, warnings, described = [], [], []
    caches: dict = {}                        # token -> (cache configuration, online fragments)
    for t in tokens:
        inst = instance_of(snap, t, instance_id if t == token else None)
        session = snap.sessions[t]
        if session["client_nodes"]:
            nids = np.array([position[h] for h in session["client_nodes"]], dtype=np.int64)
        elif nodes is not None:
            nids = select_nodes(machine, nodes, "contiguous", exclude=taken)
            taken = np.union1d(taken, nids)
        else:
            raise InputError("--session" if t == token else "--concurrent", t,
                             "the session lists no client nodes (a persistent instance, or a job whose "
                             "workload manager has not named its nodes yet)",
                             "give --nodes N to model the job on N compute nodes")
        frags = [f for f in inst["fragments"] if snap.nodes[f["node"]]["online"]]
        offline = sorted({f["node"] for f in inst["fragments"]} - {f["node"] for f in frags})
        if offline:
            warnings.append(f"instance {inst['id']}: offline storage nodes {', '.join(offline)} are left out")
        if not frags:
            raise InputError(snap.source, f"instance {inst['id']}", "every storage node of the instance is offline",
                             "bring a node online, or predict another session")
        servers = np.array([index[f["node"]] for f in frags])
        # Spillway's stripe map lays stripe i on fragment i mod K (docs/mounts.md, Striping):
        # every fragment holds 1/K of each file, whatever its capacity.
        shares = np.full(len(frags), 1.0 / len(frags))
        merged = np.bincount(servers, weights=shares, minlength=len(storage))
        servers = np.flatnonzero(merged)
        shares = merged[servers]
        confs = snap.configurations.get(inst["id"], [])
        mode = confs[0]["access_mode"] if confs else "striped"
        caches[t] = (confs[0], frags) if confs and confs[0]["type"] == "cache" else None
        if len(confs) > 1:
            warnings.append(f"instance {inst['id']}: {len(confs)} configurations, using the first ({mode})")
        if mode == "loadbalance" and spec.op == "write":
            raise ReadOnlyInstance("--op", "write", f"session {t}'s instance {inst['id']} is loadbalance: "
                                   "read-only for jobs (its data is staged in to every replica)",
                                   "predict reads (--op read)")
        job_spec = IorSpec(nodes=len(nids), op=spec.op, pattern=spec.pattern, transfer_size=spec.transfer_size,
                           block_size=spec.block_size, ppn=spec.ppn, access_mode=mode, job=t)
        groups += flow_groups_for(machine, job_spec, nids, servers, shares)
        described.append({"session": t, "instance": inst["id"], "access_mode": mode,
                          "client_nodes": len(nids), "client_nodes_from": "snapshot" if session["client_nodes"] else "--nodes",
                          **({} if session["client_nodes"] else {"modelled_nodes": [machine.hostname(n) for n in nids]}),
                          "servers": [storage[s] for s in servers],
                          "instance_capacity": inst["capacity"]})
    problem = build_problem(machine, groups, table)
    solution = problem.solve()
    mine = [i for i, fg in enumerate(groups) if fg.job == token]
    rate = sum(solution.group_rate(i) for i in mine)
    from .ior import _merge_bottlenecks
    bottlenecks = _merge_bottlenecks([solution.bottlenecks(i) for i in mine])
    others = {fg.job: 0.0 for fg in groups if fg.job != token}
    for i, fg in enumerate(groups):
        if fg.job != token:
            others[fg.job] += solution.group_rate(i)
    nodes = described[0]["client_nodes"]
    cache = None
    if caches[token] is not None:
        cache = cache_figures(machine, problem, solution, mine, spec, nodes, *caches[token],
                              sharing=sum(c is not None for c in caches.values()))
    return {"machine": machine.name, "snapshot": snap.source, "session": token, "op": spec.op,
            "pattern": spec.pattern, "transfer_size": spec.transfer_size, "ppn": spec.ppn,
            "gbps": rate, "gbps_per_node": rate / nodes,
            "binding": bottlenecks[0]["constraint"] if bottlenecks else "none",
            "bottlenecks": bottlenecks, "concurrent": others, "jobs": described,
            "placement": {h: machine.position(n) for h, n in position.items()
                          if h in described[0]["servers"]},
            "warnings": warnings, "seconds_per_GiB_per_node": (1024**3 / GB) / (rate / nodes) if rate else None,
            **({"cache": cache} if cache is not None else {}),
            **({"classes": [row for i in mine for row in solution.class_bindings(i)]} if classes else {})}


def cache_settings(conf: dict) -> dict:
    """A cache configuration's settings, Spillway's defaults for what the snapshot leaves out."""
    given = conf.get("cache") or {}
    out = {k: given.get(k, v) for k, v in cachemodel.DEFAULTS.items()}
    if "pfs" in given:
        out["pfs_directory"] = given["pfs"]
    return out


def cache_figures(machine: Machine, problem, solution, mine: list, spec: IorSpec, nodes: int,
                  conf: dict, frags: list, sharing: int = 1) -> dict:
    """The cache block of a prediction (bbsim/cache.py): the PFS path, the drain or fetch rates
    beside the job's burst-buffer rate, and for writes the burst's phases."""
    if machine.pfs is None:
        raise InputError(machine.source, "pfs", f"the session's instance is a cache, and {machine.name} "
                         "describes no PFS to drain it to", "add a 'pfs' section to the machine file "
                         "(docs/bbsim.md), or give it on the command line: --set pfs.bandwidth.write=GBPS "
                         "--set pfs.bandwidth.read=GBPS")
    settings = cache_settings(conf)
    capacity = float(sum(f["capacity"] for f in frags))
    op = spec.op
    b = sum(solution.group_rate(i) for i in mine)
    o = problem.offsets
    n_srv = len(problem.servers.nids)
    job_time = np.zeros(n_srv)
    job_streams = np.zeros(n_srv)
    for i in mine:
        fg = problem.groups[i]
        coef = 1.0 / (machine.profile.peak[fg.op] * size_efficiency(machine, fg) *
                      (machine.shared_file_efficiency[fg.op] if fg.shared_file else 1.0))
        share = np.bincount(fg.servers, weights=fg.shares, minlength=n_srv)
        job_time += solution.group_rate(i) * share * coef
        job_streams += float(np.sum(fg.streams)) * share
    servers = np.flatnonzero(np.bincount(problem.groups[mine[0]].servers, minlength=n_srv))
    load = solution.allocation.load
    cap = solution.capacity[o["server_bw"] + servers]
    other = np.maximum(load[o["server_bw"] + servers] - job_time[servers], 0.0)
    other_streams = np.maximum(problem.server_streams(solution.active)[servers] - job_streams[servers], 0.0)
    idle_cap = machine.profile.stream_factor(other_streams + cachemodel.FLUSHES_PER_SERVER)
    pfs_op = "write" if op == "write" else "read"           # a drain writes the PFS, a fetch reads it
    if machine.pfs.reach == "lnet":
        link = o["bb_out"] if op == "write" else o["bb_in"]
        link_free = np.maximum(solution.capacity[link + servers] - load[link + servers], 0.0)
    else:
        link_free = np.full(len(servers), machine.pfs.server_link)
    st = cachemodel.ServerState(cap=cap, job_time=job_time[servers] / b if b > 0 else job_time[servers],
                                other_time=other, link_free=link_free, idle_cap=idle_cap)
    pfs_gbps, pfs_limit = cachemodel.pfs_path(machine, pfs_op, len(servers), sharing)
    if op == "write":
        ssd = machine.profile.peak["read"] * machine.profile.size_factor(cachemodel.FLUSH_SIZE)
    else:
        ssd = machine.profile.peak["write"] * machine.profile.size_factor(cachemodel.FETCH_SIZE)
    rates = cachemodel.background_rates(st, b, pfs_gbps, ssd)
    out = {"capacity": capacity, **settings,
           "pfs": {"reach": machine.pfs.reach, "op": pfs_op, "gbps": pfs_gbps, "limited_by": pfs_limit,
                   "cache_instances_sharing": sharing}}
    if op == "write":
        volume = float(nodes * spec.ppn * spec.block_size)
        files, file_bytes = (nodes * spec.ppn, spec.block_size) if spec.pattern == "nn" else (1, volume)
        start = cachemodel.write_back_start(capacity, settings["high_watermark"], settings["modified_threshold"],
                                            files, file_bytes, len(servers))
        alone, during, (throttled, throttled_by) = rates["alone"], rates["during"], rates["coupled"]
        burst = cachemodel.write_burst(volume, b, during[0], throttled, alone[0], capacity, start)
        out.update({"bb_gbps": b, "write_back_starts_at": start,
                    "drain_gbps": alone[0], "drain_limited_by": alone[1],
                    "drain_gbps_during_job": during[0], "drain_during_job_limited_by": during[1],
                    "throttled_gbps": throttled, "throttled_limited_by": throttled_by, **burst})
    else:
        cold, cold_by = rates["coupled"]
        out.update({"warm_gbps": b, "cold_gbps": cold, "cold_limited_by": cold_by})
    return out
