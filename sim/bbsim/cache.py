"""Cache instances: write-behind to the PFS and read-through from it (docs/bbsim.md, "Cache
instances"; Spillway's cache: docs/cache.md).

A cache instance's job writes to the burst buffer, and each server drains its own stripes'
dirty data to the PFS in the background; reads of data not cached come from the PFS through
the servers. On top of the flow model's steady-state rate of the job through the burst buffer
(B), this module adds, per instance:

* the PFS path: the machine's `pfs` bandwidth times its `share`, split evenly between the
  cache instances of the prediction, through the LNET routers (all of them, shared) or each
  server's own link (`pfs.reach`);
* three drain rates, each the slowest server's times K (the stripes are even, so the
  instance's drain ends with its slowest server): *after the job* (the servers do nothing
  else), *while the job writes* (the SSD time and server-link bandwidth the job leaves: the
  job's writes come first), and *throttled* (the cache is full of dirty data: every byte the
  job writes waits for one flushed, so the job and the drain share the servers' time at one
  rate);
* a fluid model of a burst of W bytes: BB speed until write-back starts (the high watermark,
  or at once when files pass `modified_threshold` on a server), BB speed with the drain
  running until the instance is full of dirty data, then the throttled rate; what is dirty at
  the job's end drains after it;
* reads: warm (cached) at B, cold at the throttled rate's mirror image (each byte fetched
  from the PFS is written to the SSD and read from it).

Everything here is arithmetic on the flow solution; no second solve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .units import GB

MiB = 1024**2
FLUSH_SIZE = 8 * MiB     # adjacent dirty extents go to the PFS in one write of up to 8 MiB
FETCH_SIZE = 1 * MiB     # a fetch is one extent
FLUSHES_PER_SERVER = 4   # each server runs at most 4 flushes at once
DEFAULTS = {"high_watermark": 45, "low_watermark": 20, "modified_threshold": 1024 * MiB, "read_ahead": 4 * MiB}


@dataclass(frozen=True)
class ServerState:
    """The instance's K servers in the flow solution, one entry per server.

    cap: server time available (the stream-efficiency fraction); job_time: server time the
    job takes per GB/s of its aggregate rate; other_time: server time other jobs take;
    link_free: GB/s left on the server's path to the PFS in the direction the PFS traffic
    takes (its node link out for a drain, in for a fetch, under `reach: lnet`; its own PFS
    link under `reach: direct`); idle_cap: server time available with only the flushes and
    other jobs' streams running.
    """

    cap: np.ndarray
    job_time: np.ndarray
    other_time: np.ndarray
    link_free: np.ndarray
    idle_cap: np.ndarray

    @property
    def k(self) -> int:
        return len(self.cap)


def pfs_path(machine, op: str, servers: int, instances: int) -> tuple[float, str]:
    """GB/s the PFS path offers one cache instance for `op` (write = drain, read = fetch), and
    what sets it."""
    pfs = machine.pfs
    options = {"PFS bandwidth": pfs.bandwidth[op] * pfs.share / instances}
    if pfs.reach == "lnet":
        options["LNET routers"] = len(machine.lnet_nids) * pfs.lnet_node_bandwidth / instances
    else:
        options["servers' PFS links"] = servers * pfs.server_link
    name = min(options, key=options.get)
    return options[name], name


def background_rates(st: ServerState, b: float, pfs_gbps: float, ssd_gbps: float) -> dict:
    """Aggregate rates of the instance's background PFS traffic (a drain or a fetch).

    b: the job's rate through the burst buffer (GB/s); pfs_gbps: the PFS path for this
    instance; ssd_gbps: one server's bandwidth for the background transfer (peak x size
    efficiency of the SSD op it needs: a read for a drain, a write for a fetch).
    Returns `alone` (the servers do nothing else for the job), `during` (beside the job at rate
    b, in the SSD time it leaves) and `coupled` (the job's rate equals the background rate:
    a full cache's throttled writes, or cold reads), each with what limits it.
    """
    k = st.k
    per_pfs = pfs_gbps / k
    ssd_alone = np.maximum(st.idle_cap - st.other_time, 0.0) * ssd_gbps
    alone = _limit({"PFS path": np.full(k, per_pfs), "server link": st.link_free,
                    "server bandwidth": ssd_alone}, k)
    spare = np.maximum(st.cap - st.other_time - st.job_time * b, 0.0)
    during = _limit({"PFS path": np.full(k, per_pfs), "server link": st.link_free,
                     "server bandwidth": spare * ssd_gbps}, k)
    # job rate x on every server: x * job_time + x / (k * ssd) + other <= cap
    shared = np.maximum(st.cap - st.other_time, 0.0) / (st.job_time + 1.0 / (k * ssd_gbps))
    coupled = {"burst buffer": b, "PFS path": pfs_gbps, "server link": k * float(st.link_free.min()),
               "server bandwidth": float(shared.min())}
    name = min(coupled, key=coupled.get)
    return {"alone": alone, "during": during, "coupled": (coupled[name], name)}


def _limit(per_server: dict, k: int) -> tuple[float, str]:
    rates = {name: k * float(np.min(v)) for name, v in per_server.items()}
    name = min(rates, key=rates.get)
    return max(rates[name], 0.0), name


def write_back_start(capacity: float, high_watermark: float, modified_threshold: float,
                     files: int, file_bytes: float, servers: int) -> float:
    """Dirty bytes at which write-back begins: the high watermark of the capacity, or sooner
    when files pass `modified_threshold` on a server (each server then keeps at most that
    much of each file dirty)."""
    held = files * min(file_bytes, servers * modified_threshold)
    return min(capacity * high_watermark / 100.0, held)


def write_burst(volume: float, b: float, during: float, throttled: float, alone: float,
                capacity: float, start: float) -> dict:
    """Fluid model of a job writing `volume` bytes through a cache instance of `capacity`
    bytes. b: the burst buffer's rate; during: the drain beside it; throttled: the rate once
    the cache is full of dirty data; alone: the drain after the job (GB/s); start: dirty bytes
    at which write-back begins. Times in seconds, sizes in bytes."""
    gb = GB
    t = written = dirty = 0.0
    # 1: write at the burst buffer's speed, nothing flushed, until write-back starts
    first = min(volume, start, capacity)
    t += first / gb / b
    written = dirty = first
    # 2: write at b while the drain runs beside it, until the cache is full of dirty data
    if written < volume:
        drain = min(during, b)
        net = b - drain
        left = (volume - written) / gb
        step = left / b if net <= 0 else min(left / b, (capacity - dirty) / gb / net)
        t += step
        written += step * b * gb
        dirty += step * net * gb
    bb_bytes = written
    # 3: the cache is full: every byte written waits for one flushed
    if written < volume - 1e-6 * volume:
        if throttled <= 0:
            t = float("inf")
        else:
            t += (volume - written) / gb / throttled
        dirty = capacity
    dirty = min(dirty, volume)
    return {"bytes_written": volume, "bb_speed_bytes": min(bb_bytes, volume),
            "throttled_bytes": max(volume - bb_bytes, 0.0), "job_seconds": t,
            "job_gbps": volume / gb / t if t > 0 else b, "flushed_during_job": max(volume - dirty, 0.0),
            "dirty_at_job_end": dirty,
            "drain_seconds_after_job": dirty / gb / alone if alone > 0 else float("inf")}
