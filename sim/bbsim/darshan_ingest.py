"""Darshan logs -> per-node I/O phases, through PyDarshan.

Follows the CODES darshan3 workload generator's reading of the counters, with two changes
the spec asks for: a file both read and written becomes a read phase and a write phase
(CODES skips it), and DXT segments, when present, give the timing.

  * ranks map to nodes as rank // ranks_per_node (Darshan does not record the node of a
    rank outside DXT, so ranks per node is an input);
  * a shared record (rank -1) is divided evenly over all ranks, as CODES does;
  * access sizes: a record that only writes (or only reads) has its four most common access
    sizes in POSIX_ACCESS1..4_ACCESS/COUNT, the rest of its bytes at the mean size of its
    other calls; with DXT, each segment's length; a record that both reads and writes (its
    access counters mix the two) counts at its mean size per op. A phase keeps the bytes
    per access size, which set the server's size efficiency; the op counts set its IOPS load;
  * without DXT, a node's phase for one op spans the logged first start to last end of that
    op over the node's ranks; with DXT, segments are binned into windows (default 0.1 s,
    widened so a node has at most `max_windows` windows) and the POSIX byte and op counters
    are spread over the windows in proportion to segment bytes, so totals are conserved even
    when DXT was truncated.
Only POSIX records are replayed (MPI-IO and HDF5 go through POSIX and would double count).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import InputError


@dataclass
class Phase:
    """I/O of one node of a job, one op, one time window (seconds from the job start)."""

    node: int
    op: str
    start: float
    end: float
    bytes: float
    ops: float
    streams: int
    shared: bool
    sizes: tuple = ()        # ((access size, bytes), ...), most bytes first; () = unknown

    @property
    def transfer_size(self) -> float:
        """Mean bytes per call (what the op count implies)."""
        return self.bytes / max(self.ops, 1.0)

    @property
    def access_size(self) -> float:
        """The access size that moved the most bytes (the mean when the sizes are unknown)."""
        return self.sizes[0][0] if self.sizes else self.transfer_size


@dataclass
class DarshanJob:
    path: str
    name: str
    nprocs: int
    ranks_per_node: int
    run_time: float
    phases: list
    posix_bytes: dict            # op -> bytes in the POSIX counters (after the path filter)
    used_dxt: bool
    exe: str = ""
    notes: list = field(default_factory=list)

    @property
    def nodes(self) -> int:
        return -(-self.nprocs // self.ranks_per_node)

    def access_sizes(self, top: int = 4) -> dict:
        """Per op, the access sizes that moved the most bytes: [(size, share of the op's bytes)]."""
        out = {}
        for op in ("write", "read"):
            mix = _merge_mix([p.sizes for p in self.phases if p.op == op])
            total = sum(b for _, b in mix)
            if total > 0:
                out[op] = [(size, b / total) for size, b in mix[:top]]
        return out

    def phase_bytes(self) -> dict:
        out = {"write": 0.0, "read": 0.0}
        for p in self.phases:
            out[p.op] += p.bytes
        return out


@contextlib.contextmanager
def _quiet_stderr():
    """libdarshan-util prints its own errors on fd 2; bbsim reports them itself."""
    try:
        fd = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)


def _open(path: str):
    p = Path(path)
    try:
        import darshan
    except ImportError as exc:   # pragma: no cover - darshan is a dependency
        raise InputError(path, None, f"PyDarshan is not installed ({exc})", "pip install darshan") from None
    try:
        with _quiet_stderr():
            return darshan.DarshanReport(str(p), read_all=False)
    except Exception as exc:     # PyDarshan raises RuntimeError/ValueError/OSError on bad logs
        raise InputError(path, "header", f"not a readable Darshan log ({type(exc).__name__}: {exc})",
                         "pass a log written by darshan-runtime 3.x (check it with darshan-parser)") from None


def read_darshan(path, ranks_per_node: int, *, use_dxt: bool = True, dxt_window: float = 0.1,
                 max_windows: int = 50, path_prefix: str | None = None) -> DarshanJob:
    """Phases of one Darshan log. `path_prefix` keeps only files under that path.

    libdarshan-util calls abort() on some truncated logs, so the log is read in a forked
    child process where the platform allows it; a child killed by a signal becomes an
    InputError naming the file.
    """
    path = str(path)
    if ranks_per_node < 1:
        raise InputError("--ranks-per-node", str(ranks_per_node), "must be at least 1", "give the ranks per node of the run")
    _open_checks(path)
    args = (path, ranks_per_node, use_dxt, dxt_window, max_windows, path_prefix)
    if not hasattr(os, "fork"):
        return _read(*args)
    import darshan  # noqa: F401  (loaded once in the parent, shared by every child)
    del darshan
    return _in_child(path, _read, *args)


def _in_child(path, fn, *args):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # child: read, send back, exit at once
        os.close(read_end)
        try:
            result = ("ok", fn(*args))
        except InputError as exc:
            result = ("error", exc)
        except BaseException as exc:               # pragma: no cover - unexpected
            result = ("error", InputError(path, None, f"cannot read ({type(exc).__name__}: {exc})",
                                          "check that this is an intact Darshan 3.x log"))
        with os.fdopen(write_end, "wb") as fh:
            fh.write(pickle.dumps(result))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        how = f"signal {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status) else \
            f"exit status {os.WEXITSTATUS(status)}"
        raise InputError(path, None, f"libdarshan-util crashed reading the log ({how}); it is truncated or corrupt",
                         "use an intact log (darshan-parser should read it to the end)")
    kind, value = pickle.loads(data)
    if kind == "error":
        raise value
    return value


def _open_checks(path: str) -> None:
    p = Path(path)
    if not p.exists():
        raise InputError(path, None, "no such Darshan log", "check the path")
    if not p.is_file() or not os.access(p, os.R_OK):
        raise InputError(path, None, "not a readable file", "pass a readable .darshan file")


def _read(path, ranks_per_node, use_dxt, dxt_window, max_windows, path_prefix) -> DarshanJob:
    report = _open(path)
    try:
        job = report.metadata["job"]
        nprocs = int(job["nprocs"])
        run_time = float(job.get("run_time", 0.0))
        exe = str(report.metadata.get("exe", ""))
        modules = list(report.modules.keys())
        if "POSIX" not in modules:
            raise InputError(path, "modules", f"no POSIX records (modules: {', '.join(modules) or 'none'})",
                             "bbsim replays POSIX I/O; use a log of a job that did POSIX (or MPI-IO/HDF5) I/O")
        with _quiet_stderr():
            report.mod_read_all_records("POSIX")
            frames = report.records["POSIX"].to_df()
        counters, fcounters = frames["counters"], frames["fcounters"]
        names = report.name_records
        dxt = _read_dxt(report) if use_dxt and "DXT_POSIX" in modules else {}
    except InputError:
        raise
    except Exception as exc:
        raise InputError(path, "POSIX module", f"cannot read the records ({type(exc).__name__}: {exc})",
                         "the log may be truncated or from an unsupported Darshan version") from None

    rank = counters["rank"].to_numpy(np.int64)
    ident = counters["id"].to_numpy()
    keep = np.ones(len(rank), bool)
    if path_prefix:
        keep = np.array([str(names.get(int(i), "")).startswith(path_prefix) for i in ident])
    rpn = int(ranks_per_node)
    n_nodes = -(-nprocs // rpn)
    ranks_on_node = np.bincount(np.minimum(np.arange(nprocs) // rpn, n_nodes - 1), minlength=n_nodes)
    pieces = []           # (node, op, start, end, bytes, ops, rank-or--1, shared)
    posix = {"write": 0.0, "read": 0.0}
    opmap = {"write": ("POSIX_BYTES_WRITTEN", "POSIX_WRITES", "WRITE"),
             "read": ("POSIX_BYTES_READ", "POSIX_READS", "READ")}
    used_dxt = False
    access = np.stack([counters[f"POSIX_ACCESS{k}_ACCESS"].to_numpy(float) for k in range(1, 5)], axis=1)
    access_n = np.stack([counters[f"POSIX_ACCESS{k}_COUNT"].to_numpy(float) for k in range(1, 5)], axis=1)
    for op, (bytes_col, ops_col, ts) in opmap.items():
        nbytes = counters[bytes_col].to_numpy(float)
        nops = counters[ops_col].to_numpy(float)
        other = counters[opmap["read" if op == "write" else "write"][1]].to_numpy(float)
        start = fcounters[f"POSIX_F_{ts}_START_TIMESTAMP"].to_numpy(float)
        end = fcounters[f"POSIX_F_{ts}_END_TIMESTAMP"].to_numpy(float)
        for i in np.flatnonzero(keep & (nbytes > 0)):
            posix[op] += nbytes[i]
            segs = dxt.get((int(ident[i]), op))
            if segs is not None and segs["length"].sum() > 0:
                used_dxt = True
                pieces += _dxt_pieces(segs, rank[i], op, nbytes[i], nops[i], rpn, n_nodes)
                continue
            mix = _access_mix(nbytes[i], nops[i], access[i], access_n[i] if other[i] == 0 else None)
            if rank[i] >= 0:
                pieces.append((min(rank[i] // rpn, n_nodes - 1), op, start[i], max(end[i], start[i]),
                               nbytes[i], nops[i], int(rank[i]), False, mix))
            else:   # shared file: every rank did nbytes / nprocs
                for node in range(n_nodes):
                    share = ranks_on_node[node] / nprocs
                    pieces.append((node, op, start[i], max(end[i], start[i]), nbytes[i] * share,
                                   nops[i] * share, -1 - node, True, tuple((x, float(b * share)) for x, b in mix)))
    phases = _merge(pieces, ranks_on_node, dxt_window if used_dxt else None, max_windows)
    name = Path(path).name.split(".darshan")[0]
    return DarshanJob(path=path, name=name, nprocs=nprocs, ranks_per_node=rpn, run_time=run_time,
                      phases=phases, posix_bytes={k: float(v) for k, v in posix.items()},
                      used_dxt=used_dxt, exe=exe)


def _access_mix(nbytes, nops, sizes, counts) -> tuple:
    """((access size, bytes), ...) of one record's op. `counts` is None when the record's
    access counters mix reads and writes: then every call counts at the mean size."""
    mean = nbytes / max(nops, 1.0)
    if counts is None:
        return ((float(mean), float(nbytes)),)
    ok = (sizes > 0) & (counts > 0)
    covered_bytes = float((sizes[ok] * counts[ok]).sum())
    covered_calls = float(counts[ok].sum())
    if not ok.any() or covered_bytes > nbytes * (1 + 1e-9) or covered_calls > nops:
        return ((float(mean), float(nbytes)),)       # counters inconsistent with the totals
    mix = {float(x): float(x * c) for x, c in zip(sizes[ok], counts[ok])}
    rest = float(nbytes) - covered_bytes
    if rest > 0:
        size = rest / (nops - covered_calls) if nops > covered_calls else mean
        mix[size] = mix.get(size, 0.0) + rest
    return tuple(mix.items())


def _read_dxt(report) -> dict:
    """(file id, op) -> DataFrame of segments with a 'rank' column."""
    import pandas as pd
    with _quiet_stderr():
        report.mod_read_all_dxt_records("DXT_POSIX")
        records = report.records["DXT_POSIX"].to_df()
    out: dict = {}
    for rec in records:
        for op, key in (("write", "write_segments"), ("read", "read_segments")):
            segs = rec[key]
            if len(segs):
                segs = segs.assign(rank=int(rec["rank"]))
                out.setdefault((int(rec["id"]), op), []).append(segs)
    return {k: pd.concat(v, ignore_index=True) for k, v in out.items()}


def _dxt_pieces(segs, record_rank, op, nbytes, nops, rpn, n_nodes) -> list:
    """Spread a record's POSIX totals over its DXT segments (by bytes)."""
    length = segs["length"].to_numpy(float)
    share = length / length.sum()
    ranks = segs["rank"].to_numpy(np.int64)
    if record_rank >= 0:
        ranks = np.full(len(ranks), record_rank)
    starts = segs["start_time"].to_numpy(float)
    ends = np.maximum(segs["end_time"].to_numpy(float), starts)
    return [(min(int(r) // rpn, n_nodes - 1), op, s, e, nbytes * f, nops * f, int(r), record_rank < 0,
             ((float(size), float(nbytes * f)),))
            for r, s, e, f, size in zip(ranks, starts, ends, share, length)]


def _merge_mix(mixes, keep: int = 16) -> tuple:
    """Bytes per access size over pieces, most bytes first; beyond `keep` sizes the rest is
    folded into one entry at its mean call size (its bytes over its calls)."""
    total: dict = {}
    for mix in mixes:
        for size, b in mix:
            total[size] = total.get(size, 0.0) + b
    items = sorted(((x, b) for x, b in total.items() if b > 0), key=lambda kv: (-kv[1], kv[0]))
    if len(items) > keep:
        head, tail = items[:keep - 1], items[keep - 1:]
        rest_bytes = sum(b for _, b in tail)
        rest_calls = sum(b / x for x, b in tail)
        items = sorted(head + [(rest_bytes / rest_calls, rest_bytes)], key=lambda kv: (-kv[1], kv[0]))
    return tuple(items)


def _merge(pieces, ranks_on_node, window, max_windows) -> list:
    """Merge pieces into one phase per (node, op, file pattern[, time window])."""
    if not pieces:
        return []
    node = np.array([p[0] for p in pieces])
    op = np.array([p[1] for p in pieces])
    start = np.array([p[2] for p in pieces])
    end = np.array([p[3] for p in pieces])
    nbytes = np.array([p[4] for p in pieces])
    nops = np.array([p[5] for p in pieces])
    who = np.array([p[6] for p in pieces])
    shared = np.array([p[7] for p in pieces])
    mixes = [p[8] for p in pieces]
    if window:
        span = max(end.max() - start.min(), window)
        window = max(window, span / max_windows)
        slot = np.floor((start - start.min()) / window).astype(np.int64)
    else:
        slot = np.zeros(len(pieces), np.int64)
    phases = []
    keys = np.rec.fromarrays([node, op, shared, slot])
    order = np.lexsort((slot, shared, op, node))
    bounds = np.flatnonzero(np.r_[True, keys[order][1:] != keys[order][:-1]])
    for lo, hi in zip(bounds, np.r_[bounds[1:], len(order)]):
        idx = order[lo:hi]
        n = int(node[idx[0]])
        is_shared = bool(shared[idx[0]])
        streams = int(ranks_on_node[n]) if is_shared else len(np.unique(who[idx]))
        phases.append(Phase(node=n, op=str(op[idx[0]]), start=float(start[idx].min()),
                            end=float(end[idx].max()), bytes=float(nbytes[idx].sum()),
                            ops=float(nops[idx].sum()), streams=max(streams, 1), shared=is_shared,
                            sizes=_merge_mix(mixes[k] for k in idx)))
    phases.sort(key=lambda p: (p.start, p.node, p.op))
    return phases
