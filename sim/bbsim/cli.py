"""The bbsim command: a thin layer over the library (parse options, call, print, write files)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from . import __version__
from .errors import InputError
from .units import format_size, parse_size

DEFAULT_NODES = "1,2,4,8,16,32,64,128,256,384,512,1024,2048,4096,8192"

MAIN_HELP = """\
bbsim predicts the bandwidth a burst buffer (Cray DataWarp, or Spillway) delivers on a
dragonfly machine, and names what limits it: a client cap, a link (which class, which link) or
a server. It is a flow-level model: weighted max-min fair sharing of every link and server
among all client streams, with routes split over the dragonfly's paths.

commands:
  ior        bandwidth-vs-nodes sweep of an IOR-like job (CSV, JSON, PNG, bottleneck report)
  replay     replay Darshan logs of one or more jobs together: timelines and slowdown matrix
  validate   the validation table: published figure, model value, error
  predict    what a job will get from its instance in a running Spillway (layout snapshot)
  machine    check and summarise a machine description (YAML)

Each command has its own --help. Results go to standard output as text, or as JSON with
--json. Machines are shipped YAML names (trinity, cori-p1, cori, cray-264) or paths.
Exit status: 0 success, 1 a validation row failed, 2 bad input (the message names the file,
the field and the fix).

The user guide is docs/bbsim.md in the Spillway repository.
"""

IOR_HELP = """\
Sweep an IOR-like job over node counts on a machine and report, for each point, the aggregate
bandwidth and the binding constraint of its flows (client cap, link class and link, server).
Each node runs --ppn processes; each process is one client stream writing or reading its own
file (N-N) or one shared file (N-1), striped over the instance's servers.
"""

IOR_EPILOG = """\
examples:
  bbsim ior --machine trinity --servers 230
      the paper's Trinity sweep, write and read, 1 to 8192 nodes
  bbsim ior --machine trinity --servers 230 --nodes 256,512,1024 --op write \\
        --variant 'round-robin ports:topology.global_port_assignment=round_robin' \\
        --variant 'adaptive 30%:routing.valiant_fraction=0.3' --out results/
      compare wirings and routing on one plot (results/ior.png)
  bbsim ior --machine my-machine.yaml --nodes 64 --transfer 4KiB --json
      one point of a new machine, as JSON

variants: --variant 'LABEL:KEY=VALUE;KEY=VALUE' adds a curve with machine settings changed
(any dotted key of the machine YAML) or job settings changed (servers, server_selection,
node_selection, ppn, pattern, transfer_size, access_mode). --set changes the base machine.

output files with --out DIR: ior.csv (one row per point), ior.json (every point with its full
bottleneck report and solver statistics), ior.png (bandwidth vs nodes; marker colour = binding
constraint).
"""

REPLAY_HELP = """\
Replay the I/O of one or more Darshan logs on a machine, all jobs together, at max-min fair
rates re-solved at every phase start and end. Each log is one job; its ranks map to nodes as
rank // ranks-per-node; its nodes are placed as contiguous blocks, one job after the other.
Prints each job's start, end, bytes and bandwidth, the slowdown matrix (each job alone vs with
each other job) and the busiest servers.
"""

REPLAY_EPILOG = """\
examples:
  bbsim replay a.darshan b.darshan --machine trinity --ranks-per-node 24 --servers 32
  bbsim replay a.darshan b.darshan --align --layout disjoint --out replay/ --json

A log is read with PyDarshan: POSIX counters per rank and file (bytes, ops, access sizes,
timestamps), DXT segments when present. Use LOG:N to give one log its own ranks per node.
output files with --out DIR: replay.json, timeline.csv (per-job GB/s per interval),
timeline.png.
"""

VALIDATE_HELP = """\
Compute the model value of every row of the validation table (simulator spec, section 6) with
the shipped machines and the single DataWarp server profile, and compare it with the published
figure. A row passes within its tolerance (15% unless stated); behaviour rows state their
condition in the note. Exits 1 if any row fails.
"""

PREDICT_HELP = """\
Predict the bandwidth a Spillway session's job gets from its instance, using a layout snapshot
of a running Spillway placed on a machine description. The snapshot is what `spillway layout`
writes (format: docs/bbsim.md, 'Spillway layout snapshot'; schemas
bbsim/schemas/spillway-layout-v1.json and -v2.json). The job is the session's client nodes
running an IOR-like phase (--op, --pattern, --transfer, --ppn) on the instance's fragments
(1/K of every file on each; offline nodes left out). --concurrent adds other sessions' jobs
running at the same time (what-if); --nodes models sessions that list no client nodes yet.

A cache instance (type cache) also gets its PFS figures: for writes, the burst of --block
bytes per process written at the burst buffer's speed, then throttled to the drain rate once
the cache is full of dirty data, and the drain time after the job; for reads, warm (cached)
and cold (from the PFS) rates. The machine must describe its PFS (a 'pfs' section, or --set
pfs.bandwidth.write=GBPS --set pfs.bandwidth.read=GBPS).
"""

PREDICT_EPILOG = """\
examples:
  spillway layout -o snap.json && bbsim predict snap.json --machine trinity --session 4242
  bbsim predict sim/examples/spillway-layout-trinity.json --machine trinity --session 4242
  bbsim predict snap.json --machine trinity --session 4242 --concurrent 4243 --json
  bbsim predict snap.json --machine trinity --session project --nodes 128
      a persistent instance used by a 128-node job
  bbsim predict sim/examples/spillway-layout-trinity-cache.json --machine trinity --session 5151 \
      --set pfs.bandwidth.write=10 --set pfs.bandwidth.read=12 --block 1GiB
      a cache instance draining to a 10 GB/s PFS

hostnames: the machine's 'hostnames' section places each hostname: its map first, then its
rule ('nid': hostname = prefix + nid; 'ordered': storage nodes take burst-buffer positions and
client nodes compute positions, in natural name order). --mapping overrides the rule.
"""

MACHINE_HELP = """\
Check a machine description and print what it builds: node counts by kind, link counts by
class, capacities, server profile and the source of every number. Use it while writing a new
machine file: errors name the line, the field and the fix.
"""


def _add_machine_args(p, default="trinity"):
    p.add_argument("--machine", "-m", default=default, metavar="NAME|FILE",
                   help=f"shipped machine name or machine YAML path (default: {default})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a machine setting by dotted key, e.g. routing.valiant_fraction=0.2 "
                        "(repeatable)")


def _add_job_args(p, ppn_default=32, op_help="write, read, or write,read (default: write,read)"):
    p.add_argument("--op", default=None, metavar="OPS", help=op_help)
    p.add_argument("--pattern", choices=("nn", "n1"), default="nn",
                   help="nn: a file per process (IOR -F); n1: one shared file (default: nn)")
    p.add_argument("--transfer", default="1MiB", metavar="SIZE",
                   help="bytes per I/O call, IOR -t (default: 1MiB)")
    p.add_argument("--block", default="8GiB", metavar="SIZE",
                   help="bytes per process, IOR -b; sets the reported run time (default: 8GiB)")
    p.add_argument("--ppn", type=int, default=ppn_default, metavar="N",
                   help=f"processes (client streams) per node (default: {ppn_default})")


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="bbsim", description=MAIN_HELP, formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"bbsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("ior", help="bandwidth-vs-nodes sweep of an IOR-like job", description=IOR_HELP,
                       epilog=IOR_EPILOG, formatter_class=fmt)
    _add_machine_args(p)
    p.add_argument("--nodes", default=DEFAULT_NODES, metavar="LIST",
                   help=f"node counts, comma separated (default: {DEFAULT_NODES}; counts above the "
                        "machine's compute nodes are dropped)")
    _add_job_args(p)
    p.add_argument("--servers", default="all", metavar="N|all",
                   help="servers in the job's instance (default: all of the machine's)")
    p.add_argument("--server-selection", choices=("spread", "packed"), default="spread",
                   help="spread: round robin over groups; packed: first servers in nid order (default: spread)")
    p.add_argument("--node-selection", choices=("contiguous", "spread", "random"), default="contiguous",
                   help="contiguous: nid order (default); spread: round robin over groups; random")
    p.add_argument("--access-mode", choices=("striped", "private", "loadbalance"), default="striped",
                   help="striped/private: files striped over all servers; loadbalance: each node "
                        "reads one replica (default: striped)")
    p.add_argument("--variant", action="append", default=[], metavar="'LABEL:KEY=VALUE;...'",
                   help="add a curve with changed settings (repeatable, see below)")
    p.add_argument("--out", metavar="DIR", help="write ior.csv, ior.json and ior.png into DIR")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--detail", action="store_true", help="print the full bottleneck report of each point")
    p.add_argument("--classes", action="store_true",
                   help="also name the binding constraint of every flow class (one per compute router of "
                        "the job): a table per point, and 'classes' in the JSON")

    p = sub.add_parser("replay", help="replay Darshan logs together", description=REPLAY_HELP,
                       epilog=REPLAY_EPILOG, formatter_class=fmt)
    p.add_argument("logs", nargs="+", metavar="LOG[:RANKS_PER_NODE]", help="Darshan log files")
    _add_machine_args(p)
    p.add_argument("--ranks-per-node", type=int, default=32, metavar="N",
                   help="ranks per node for logs without :N (default: 32)")
    p.add_argument("--servers", default="32", metavar="N|all", help="servers in the instance(s) (default: 32)")
    p.add_argument("--layout", choices=("shared", "disjoint"), default="shared",
                   help="shared: every job on the same servers; disjoint: the servers split between jobs")
    p.add_argument("--offset", default="", metavar="S,S,...",
                   help="seconds added to each job's logged times (default: 0 for all)")
    p.add_argument("--align", action="store_true", help="shift each job so its first I/O starts at t=0")
    p.add_argument("--fairness", choices=("stream", "job"), default="stream",
                   help="max-min weights: per client stream (default) or equal per job")
    p.add_argument("--no-dxt", action="store_true", help="ignore DXT segments; use the counters' windows")
    p.add_argument("--dxt-window", type=float, default=0.1, metavar="S", help="DXT binning window (default 0.1 s)")
    p.add_argument("--path-prefix", metavar="PATH", help="replay only files under this path")
    p.add_argument("--no-matrix", action="store_true", help="skip the slowdown matrix (one replay only)")
    p.add_argument("--out", metavar="DIR", help="write replay.json, timeline.csv and timeline.png into DIR")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")

    p = sub.add_parser("validate", help="print the validation table", description=VALIDATE_HELP,
                       formatter_class=fmt)
    p.add_argument("--only", metavar="IDS", help="comma-separated row ids, e.g. T1,T2 (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")

    p = sub.add_parser("predict", help="expected bandwidth of a job in a live Spillway layout",
                       description=PREDICT_HELP, epilog=PREDICT_EPILOG, formatter_class=fmt)
    p.add_argument("snapshot", metavar="SNAPSHOT.json", help="Spillway layout snapshot, format version 1 or 2")
    _add_machine_args(p)
    p.add_argument("--session", required=True, metavar="TOKEN", help="the session (job id) to predict")
    p.add_argument("--instance", type=int, metavar="ID", help="instance id, if the session has several")
    p.add_argument("--concurrent", action="append", default=[], metavar="TOKEN",
                   help="another session whose job runs at the same time (repeatable)")
    p.add_argument("--mapping", choices=("nid", "ordered"), help="hostname rule, overriding the machine's")
    p.add_argument("--nodes", type=int, metavar="N",
                   help="compute nodes to model for a session that lists no client nodes (a persistent "
                        "instance, or a job not started yet): the first free ones in nid order")
    p.add_argument("--classes", action="store_true",
                   help="also name the binding constraint of every flow class of the job (one per compute router)")
    _add_job_args(p, op_help="write, read, or write,read (default: write,read; read only for a "
                             "loadbalance instance, which jobs cannot write)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")

    p = sub.add_parser("machine", help="check and summarise a machine description", description=MACHINE_HELP,
                       formatter_class=fmt)
    p.add_argument("name", nargs="?", default=None, metavar="NAME|FILE", help="machine to check")
    p.add_argument("--list", action="store_true", help="list the shipped machines")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


# -- helpers ----------------------------------------------------------------------------------

def _machine(args, extra=()):
    from .machine import load_machine, parse_override
    overrides = tuple(parse_override(s) for s in args.set) + tuple(extra)
    return load_machine(args.machine, overrides)


def _ops(text: str | None) -> list:
    if text is None:
        return ["write", "read"]
    ops = [o.strip() for o in text.split(",") if o.strip()]
    bad = [o for o in ops if o not in ("write", "read")]
    if not ops or bad:
        raise InputError("--op", text, f"'{bad[0] if bad else text}' is not write or read", "use write, read or write,read")
    return ops


def _size(option, text):
    try:
        return parse_size(text)
    except ValueError as exc:
        raise InputError(option, text, str(exc), "write a size such as 1MiB or 4096") from None


def _servers(text):
    if text in ("all", None):
        return None
    try:
        value = int(text)
    except ValueError:
        raise InputError("--servers", text, "not a number", "give a server count or 'all'") from None
    if value < 1:
        raise InputError("--servers", text, "must be at least 1", "give a server count or 'all'")
    return value


def _int_list(option, text):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(option, text, "not a comma-separated list of integers", "write e.g. 1,16,256") from None
    if not values or min(values) < 1:
        raise InputError(option, text, "counts must be positive", "write e.g. 1,16,256")
    return values


def _choice(*options):
    def check(value):
        if str(value) not in options:
            raise ValueError(f"'{value}' is not one of: {', '.join(options)}")
        return str(value)
    return check


def _positive_int(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 1:
        raise ValueError(f"'{value}' is not a whole number >= 1")
    return int(value)


JOB_KEYS = {"servers": _positive_int, "server_selection": _choice("spread", "packed"),
            "node_selection": _choice("contiguous", "spread", "random"), "ppn": _positive_int,
            "pattern": _choice("nn", "n1"), "transfer_size": parse_size,
            "access_mode": _choice("striped", "private", "loadbalance")}


def _variant(text):
    from .machine import parse_override
    if ":" not in text:
        raise InputError("--variant", text, "expected LABEL:KEY=VALUE[;KEY=VALUE]",
                         "write e.g. --variant 'k=2:topology.global_links_per_pair=2'")
    label, body = text.split(":", 1)
    machine_over, job_over = [], {}
    for item in filter(None, (s.strip() for s in body.split(";"))):
        key, value = parse_override(item)
        if key in JOB_KEYS:
            try:
                job_over[key] = JOB_KEYS[key](value)
            except (TypeError, ValueError) as exc:
                raise InputError("--variant", item, str(exc), f"give a valid value for the job setting '{key}'") from None
        else:
            machine_over.append((key, value))
    return label.strip(), tuple(machine_over), job_over


def _print(text=""):
    sys.stdout.write(text + "\n")


_ARGV: list = []


def _sha256(path) -> str | None:
    import hashlib
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _run_record(machines, inputs=()) -> dict:
    """What produced a result: bbsim's version, the command, and the hashes of its input files."""
    seen, files = set(), []
    for m in machines:
        for kind, path in (("machine", m.source), ("server profile", m.profile.source)):
            if path not in seen:
                seen.add(path)
                files.append({"kind": kind, "file": str(path), "sha256": _sha256(path)})
    files += [{"kind": kind, "file": str(path), "sha256": _sha256(path)} for kind, path in inputs]
    return {"bbsim": __version__, "command": ["bbsim", *_ARGV], "inputs": files}


# -- commands ---------------------------------------------------------------------------------

def cmd_ior(args) -> int:
    from . import output
    from .ior import IorSpec, run_point
    spec_base = IorSpec(nodes=1, pattern=args.pattern, transfer_size=_size("--transfer", args.transfer),
                        block_size=_size("--block", args.block), ppn=args.ppn, servers=_servers(args.servers),
                        server_selection=args.server_selection, node_selection=args.node_selection,
                        access_mode=args.access_mode)
    if args.ppn < 1:
        raise InputError("--ppn", str(args.ppn), "must be at least 1", "give processes per node")
    ops = _ops(args.op)
    counts = _int_list("--nodes", args.nodes)
    variants = [("base", (), {})] + [_variant(v) for v in args.variant]
    points, machines = [], []
    for label, machine_over, job_over in variants:
        machine = _machine(args, machine_over)
        machines.append(machine)
        spec = replace(spec_base, **job_over)
        usable = [n for n in counts if n <= len(machine.compute_nids)]
        if not usable:
            raise InputError("--nodes", args.nodes, f"{machine.name} has only {len(machine.compute_nids)} compute nodes",
                             "use smaller node counts")
        # jobs cannot write a loadbalance instance: with the default ops, model its reads only
        variant_ops = [o for o in ops if not (args.op is None and spec.access_mode == "loadbalance" and o == "write")]
        for op in variant_ops:
            for n in usable:
                point = run_point(machine, replace(spec, nodes=n, op=op), classes=args.classes)
                point["variant"] = label
                points.append(point)
    title = f"{points[0]['machine']}: IOR {args.pattern.upper()} {format_size(spec_base.transfer_size)}, " \
            f"ppn {args.ppn}, {points[0]['servers']} servers"
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        output.write_ior_csv(out / "ior.csv", points)
        output.write_json(out / "ior.json", {"title": title, "run": _run_record(machines), "points": points})
        output.plot_ior(out / "ior.png", points, title)
    if args.json:
        _print(output.dumps({"title": title, "run": _run_record(machines), "points": points}))
        return 0
    _print(title)
    rows = []
    for p in points:
        rows.append([p["variant"], p["op"], p["nodes"], f"{p['gbps']:.1f}", f"{p['gbps_per_node']:.3f}",
                     p["binding"], output.example_of(p)])
    _print(output.table(rows, ["variant", "op", "nodes", "GB/s", "GB/s/node", "bound by", "e.g."], "llrrrll"))
    if args.detail or args.classes:
        for p in points:
            _print(f"\n{p['variant']} {p['op']} {p['nodes']} nodes: {p['gbps']:.1f} GB/s")
            _print(_report_lines(p["bottlenecks"]))
            if args.classes:
                _print(_class_table(p["classes"]))
    if args.out:
        _print(f"\nwrote {args.out}/ior.csv, ior.json, ior.png")
    return 0


def _report_lines(bottlenecks) -> str:
    lines = []
    for b in bottlenecks:
        what = b["constraint"]
        if b["kind"] == "resource":
            what += f": {b['saturated_resources']} saturated"
            if b["examples"]:
                what += ", e.g. " + "; ".join(e["name"] for e in b["examples"])
        lines.append(f"  {b['nodes']} nodes, {b['streams']} streams, {b['gbps']:.1f} GB/s bound by {what}")
    return "\n".join(lines)


def _class_table(classes) -> str:
    from . import output
    rows = [[c["router"], c["nodes"], c["streams"], f"{c['gbps_per_stream']:.4f}", f"{c['gbps']:.2f}", c["bound_by"]]
            for c in classes]
    return "  " + output.table(rows, ["class (router)", "nodes", "streams", "GB/s/stream", "GB/s", "bound by"],
                               "lrrrrl").replace("\n", "\n  ")


def cmd_replay(args) -> int:
    from . import output
    from .darshan_ingest import read_darshan
    from .replay import ReplayJob, place_jobs, replay, slowdown_matrix
    machine = _machine(args)
    jobs_in = []
    for item in args.logs:
        path, rpn = item, args.ranks_per_node
        if ":" in item and item.rsplit(":", 1)[1].isdigit():
            path, rpn = item.rsplit(":", 1)[0], int(item.rsplit(":", 1)[1])
        jobs_in.append(read_darshan(path, rpn, use_dxt=not args.no_dxt, dxt_window=args.dxt_window,
                                    path_prefix=args.path_prefix))
    for j in jobs_in:
        if not j.phases:
            sys.stderr.write(f"bbsim replay: warning: {j.path}: no POSIX reads or writes to replay"
                             + (f" under {args.path_prefix}" if args.path_prefix else "") + "\n")
    names = []
    for j in jobs_in:                       # two logs of the same name get distinct job names
        name, k = j.name, 2
        while name in names:
            name, k = f"{j.name}#{k}", k + 1
        names.append(name)
    offsets = [0.0] * len(jobs_in)
    if args.offset:
        try:
            given = [float(x) for x in args.offset.split(",")]
        except ValueError:
            raise InputError("--offset", args.offset, "not a list of seconds", "write e.g. 0,2.5") from None
        if len(given) != len(jobs_in):
            raise InputError("--offset", args.offset, f"{len(given)} offsets for {len(jobs_in)} logs",
                             "give one offset per log")
        offsets = given
    if args.align:
        offsets = [o - min((p.start for p in j.phases), default=0.0) for o, j in zip(offsets, jobs_in)]
    nids, servers = place_jobs(machine, [j.nodes for j in jobs_in], _servers(args.servers), args.layout)
    total_streams = {n: sum(p.streams for p in j.phases) or 1 for n, j in zip(names, jobs_in)}
    jobs = [ReplayJob(name=n, phases=j.phases, nids=nids[i], servers=servers[i], offset=offsets[i],
                      weight=1.0 if args.fairness == "stream" else 1.0 / total_streams[n])
            for i, (n, j) in enumerate(zip(names, jobs_in))]
    result = replay(machine, jobs)
    matrix = None if args.no_matrix or len(jobs) < 2 else slowdown_matrix(machine, jobs)
    busiest = sorted(result.per_server.items(), key=lambda kv: -kv[1]["mean_busy"])[:5]
    record = {"machine": machine.name, "layout": args.layout, "fairness": args.fairness,
              "run": _run_record([machine], [("darshan log", j.path) for j in jobs_in]),
              "inputs": [{"log": j.path, "job": n, "nprocs": j.nprocs, "ranks_per_node": j.ranks_per_node,
                          "nodes": j.nodes, "phases": len(j.phases), "used_dxt": j.used_dxt,
                          "posix_bytes": j.posix_bytes, "access_sizes": j.access_sizes(), "offset_s": o}
                         for n, j, o in zip(names, jobs_in, offsets)],
              "jobs": result.jobs, "events": result.events, "solves": result.solves,
              "wall_s": result.wall_s, "slowdown": matrix,
              "busiest_servers": dict(busiest), "timeline": result.timeline}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        output.write_json(out / "replay.json", record)
        output.write_timeline_csv(out / "timeline.csv", result.timeline)
        output.plot_timeline(out / "timeline.png", result.timeline,
                             f"{machine.name}: {', '.join(names)} ({args.layout} servers)")
    if args.json:
        _print(output.dumps(record))
        return 0
    _print(f"{machine.name}: {len(jobs)} job(s), {args.layout} servers, {args.fairness} fairness, "
           f"{result.events} events, {result.solves} solves, {result.wall_s:.2f} s")
    rows = [[j["name"], jn.nodes, f"{j['start']:.2f}" if j["start"] is not None else "-",
             f"{j['end']:.2f}" if j["end"] is not None else "-", output.human_size(j["bytes"]),
             f"{j['gbps']:.1f}"] for j, jn in zip(result.jobs, jobs_in)]
    _print(output.table(rows, ["job", "nodes", "start s", "end s", "bytes", "GB/s"], "lrrrrr"))
    if matrix:
        _print("\nslowdown (row job with column job / row job alone):")
        _print(output.table([[a] + [f"{x:.2f}" for x in row] for a, row in zip(matrix["jobs"], matrix["slowdown"])],
                            ["job"] + matrix["jobs"], "l" + "r" * len(jobs)))
    if busiest:
        _print("\nbusiest servers (mean / peak busy fraction while jobs ran):")
        _print(", ".join(f"{k} {v['mean_busy']:.2f}/{v['peak_busy']:.2f}" for k, v in busiest))
    if args.out:
        _print(f"\nwrote {args.out}/replay.json, timeline.csv, timeline.png")
    return 0


def cmd_validate(args) -> int:
    from . import output
    from .validation import validation_table
    wanted = {x.strip() for x in args.only.split(",")} if args.only else None
    rows = validation_table(wanted)
    if wanted and not rows:
        raise InputError("--only", args.only, "no such row id", "use ids such as T1,T2,C1,K1,S1")
    failed = [r for r in rows if not r.passed]
    if args.json:
        _print(output.dumps({"rows": [r.as_dict() for r in rows], "passed": not failed}))
        return 1 if failed else 0

    def num(v, metric):
        if isinstance(v, str):
            return v
        if metric == "IOPS":
            return f"{v / 1e6:.2f}M"
        if metric in ("ratio", "x", "streams"):
            return f"{v:.3g}"
        return f"{v:.2f}" if v < 100 else f"{v:.1f}" if v < 1e4 else f"{v:.0f}"
    table = [[r.id, r.system, r.case, r.metric, num(r.published, r.metric), num(r.model, r.metric),
              "" if r.error is None else f"{r.error:+.1%}",
              "" if r.tolerance is None else f"±{r.tolerance:.0%}", "ok" if r.passed else "FAIL", r.kind,
              r.binding] for r in rows]
    _print(output.table(table, ["id", "system", "case", "unit", "published", "model", "error", "tol", "", "kind",
                                "bound by"], "llllrrrrlll"))
    notes = [f"{r.id}: {r.note}" for r in rows if r.note]
    if notes:
        _print("\nnotes:\n  " + "\n  ".join(notes))
    _print(f"\n{len(rows) - len(failed)} of {len(rows)} rows within tolerance" +
           ("" if not failed else f"; FAILED: {', '.join(sorted({r.id for r in failed}))}"))
    return 1 if failed else 0


def cmd_predict(args) -> int:
    from . import output
    from .ior import IorSpec
    from .layout import ReadOnlyInstance, load_snapshot, predict
    machine = _machine(args)
    ops = _ops(args.op)
    snap = load_snapshot(args.snapshot)
    spec = IorSpec(nodes=1, pattern=args.pattern, transfer_size=_size("--transfer", args.transfer),
                   block_size=_size("--block", args.block), ppn=args.ppn)
    results = []
    for op in ops:
        try:
            results.append(predict(machine, snap, args.session, replace(spec, op=op), instance_id=args.instance,
                                   concurrent=args.concurrent, rule=args.mapping, nodes=args.nodes,
                                   classes=args.classes))
        except ReadOnlyInstance:
            if args.op is not None or op != "write":
                raise              # asked for explicitly: say why it cannot be
            # default ops: a loadbalance instance is only read
    run = _run_record([machine], [("layout snapshot", args.snapshot)])
    for r in results:
        r["run"] = run
    if args.json:
        _print(output.dumps(results if len(results) > 1 else results[0]))
        return 0
    for r in results:
        job = r["jobs"][0]
        _print(f"session {r['session']} ({job['client_nodes']} nodes x {r['ppn']} streams, {r['op']}, "
               f"{r['pattern'].upper()} {format_size(r['transfer_size'])}) on instance {job['instance']} "
               f"({len(job['servers'])} servers, {job['access_mode']}) of {r['machine']}:")
        _print(f"  expected {r['gbps']:.1f} GB/s ({r['gbps_per_node']:.3f} GB/s per node)")
        _print("  limited by:")
        _print(_report_lines(r["bottlenecks"]).replace("\n  ", "\n    ").replace("  ", "    ", 1))
        for other, gbps in r["concurrent"].items():
            _print(f"  concurrent session {other}: {gbps:.1f} GB/s")
        if "cache" in r:
            _print(_cache_lines(r["cache"]))
        for w in r["warnings"]:
            _print(f"  warning: {w}")
        if args.classes:
            _print(_class_table(r["classes"]))
    return 0


def _cache_lines(c: dict) -> str:
    from .output import human_size
    pfs = c["pfs"]
    path = "through the LNET routers" if pfs["reach"] == "lnet" else "over the servers' own links"
    shared = f", shared by {pfs['cache_instances_sharing']} cache instances" if pfs["cache_instances_sharing"] > 1 else ""
    head = (f"  cache instance of {human_size(c['capacity'])}, PFS {pfs['op']} path {pfs['gbps']:.1f} GB/s {path} "
            f"(bound by {pfs['limited_by']}{shared}):")
    if "warm_gbps" in c:
        return (f"{head}\n    warm reads (cached) {c['warm_gbps']:.1f} GB/s; cold reads (fetched from the PFS) "
                f"{c['cold_gbps']:.1f} GB/s, bound by {c['cold_limited_by']}")
    start = c["write_back_starts_at"]
    lines = [head]
    throttled = c["throttled_bytes"] > 0
    lines.append(f"    the job writes {human_size(c['bytes_written'])}: "
                 + (f"{human_size(c['bb_speed_bytes'])} at the burst buffer's {c['bb_gbps']:.1f} GB/s, then "
                    f"{human_size(c['throttled_bytes'])} throttled to {c['throttled_gbps']:.1f} GB/s (the cache is "
                    f"full of dirty data; bound by {c['throttled_limited_by']})" if throttled else
                    f"all at the burst buffer's {c['bb_gbps']:.1f} GB/s")
                 + f": {c['job_seconds']:.1f} s, {c['job_gbps']:.1f} GB/s on average")
    lines.append(f"    write-back starts at {human_size(start)} dirty "
                 f"({c['high_watermark']}% of the capacity, or sooner as files pass "
                 f"{human_size(c['modified_threshold'])} on a server); drain to the PFS "
                 f"{c['drain_gbps_during_job']:.1f} GB/s beside the job (bound by {c['drain_during_job_limited_by']}), "
                 f"{c['drain_gbps']:.1f} GB/s after it (bound by {c['drain_limited_by']})")
    lines.append(f"    at the job's end {human_size(c['dirty_at_job_end'])} not yet on the PFS: "
                 f"{c['drain_seconds_after_job']:.1f} s to drain after the job (the teardown waits for it)")
    return "\n".join(lines)


def cmd_machine(args) -> int:
    from . import output
    from .machine import load_machine, parse_override, shipped_machines
    if args.list or args.name is None:
        names = shipped_machines()
        if args.json:
            _print(output.dumps(names))
        else:
            for n in names:
                m = load_machine(n)
                _print(f"{n:10s} {m.description.strip().splitlines()[0] if m.description else ''}")
        return 0
    m = load_machine(args.name, tuple(parse_override(s) for s in args.set))
    counts = m.counts()
    info = {"name": m.name, "file": m.source, "counts": counts,
            "shape": m.shape.__dict__, "bandwidth_gbps": m.bandwidth, "valiant_fraction": m.valiant_fraction,
            "client": {"node_cap_gbps": m.node_cap, "stream_cap_gbps": m.stream_cap},
            "server": {"profile": m.profile.name, "peak_gbps": m.profile.peak, "iops": m.iops,
                       "shared_file_efficiency": m.shared_file_efficiency,
                       "at_1MiB_many_streams_gbps": {op: m.server_bandwidth(op, 1024**2, 1e6) for op in ("write", "read")}},
            "pfs": m.pfs.__dict__ if m.pfs else None,
            "sources": m.sources}
    if args.json:
        _print(output.dumps(info))
        return 0
    s = m.shape
    _print(f"{m.name} ({m.source})")
    _print(f"  {s.groups} groups x {s.rows} chassis x {s.cols} slots = {s.routers} routers, "
           f"{s.nodes_per_router} nodes each")
    _print(f"  nodes: {counts['compute']} compute, {counts['burst_buffer']} burst buffer, "
           f"{counts['lnet']} LNET, {counts['empty']} empty")
    _print(f"  links (directed): {counts['green']} green x {m.bandwidth['green']} GB/s, {counts['black']} black x "
           f"{m.bandwidth['black']} GB/s, {counts['global']} global x {m.bandwidth['global']} GB/s "
           f"({s.links_per_pair} per group pair, {s.assignment}, {s.ports_per_router} ports per router)")
    _print(f"  routing: {s.routing}, Valiant fraction {m.valiant_fraction}")
    _print(f"  client: node cap {m.node_cap} GB/s, stream cap {m.stream_cap['write']} W / {m.stream_cap['read']} R GB/s")
    bw = info["server"]["at_1MiB_many_streams_gbps"]
    _print(f"  server profile {m.profile.name}: peak {m.profile.peak['write']} W / {m.profile.peak['read']} R GB/s, "
           f"at scale with 1 MiB {bw['write']:.2f} W / {bw['read']:.2f} R GB/s; "
           f"IOPS {m.iops['write']:.0f} W / {m.iops['read']:.0f} R; N-1 x{m.shared_file_efficiency['write']} W / "
           f"x{m.shared_file_efficiency['read']} R")
    if m.pfs:
        p = m.pfs
        path = (f"through {counts['lnet']} LNET routers x {p.lnet_node_bandwidth} GB/s" if p.reach == "lnet"
                else f"over each server's own {p.server_link} GB/s link")
        _print(f"  PFS (cache instances): {p.bandwidth['write']} W / {p.bandwidth['read']} R GB/s, share {p.share}, {path}")
    if m.sources:
        _print("  sources:")
        for k, v in m.sources.items():
            _print(f"    {k}: {v}")
    return 0


COMMANDS = {"ior": cmd_ior, "replay": cmd_replay, "validate": cmd_validate, "predict": cmd_predict,
            "machine": cmd_machine}


def main(argv=None) -> int:
    parser = build_parser()
    _ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    try:
        return COMMANDS[args.command](args)
    except InputError as exc:
        sys.stderr.write(f"bbsim {args.command}: {exc}\n")
        return 2
    except BrokenPipeError:     # e.g. piped into head
        return 0


if __name__ == "__main__":
    sys.exit(main())
