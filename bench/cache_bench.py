#!/usr/bin/env python3
"""Cache instances against a scratch instance of the same size and against the PFS used
directly (issue 20's benchmark).

Prints the figures and writes them into BENCHMARKS.md between <!-- cache:begin --> and
<!-- cache:end -->. The cluster is real, each host a network namespace on one bridge (as
bench/warpfs_bench.py and bench/striped_bench.py build it): a controller, storage nodes
s1-s3, compute node c1, and a PFS host p1. The PFS stand-in is GlusterFS (Debian's, one brick
on p1; the kernel NFS server needs nfsd in the kernel, which the reference VM's has not, and
is often unusable in network namespaces), with p1's link capped both ways with tc tbf at --pfs-mbit, so that the PFS is
slower than the burst buffer, as on a real machine. It is mounted at the same path on every
storage node (the storage agents' PFS doors reach it there), on c1 (the PFS used directly)
and on p1 itself (where the data sets are laid out without crossing the capped link). The
site config allows that path ([cache] allowed_pfs). The storage nodes' links are uncapped
unless --bb-mbit caps them too.

Every instance is #DW jobdw access_mode=striped capacity=--capacity-mib, one grain on each of
the 3 storage nodes (the pool's granularity is a third of it). fio (Debian's) runs as an
ordinary user, 1 MiB blocks, --streams jobs with a file each, no preallocation; writes end
with an fsync (end_fsync), every read follows a drop of the page cache. Measured:

  * the PFS's link: a raw TCP transfer (python3 sockets), s1-s3 to p1 at once (the drain's
    direction) and p1 to s1-s3 (the reads'): the ceiling the PFS figures are held against;
  * the PFS used directly from c1: a --size-mib write, then its read;
  * a scratch instance: the same write (the checkpoint), then two reads: the second (a
    re-read, as the cache's warm one) is the one the cache's warm re-read is held against;
  * checkpoint through a cache instance (pfs= an empty PFS directory): the job-visible
    write (fsync without sync_to_pfs returns once the data is on the SSDs); then the job
    ends (post_run, teardown) and the drain is what was not yet on the PFS at the job's end
    (the blocks of its files on p1's brick then) over the time from the job's end to the end
    of the teardown; each storage server's own teardown flush is shown too (its agent's
    log: the bytes dirty when it started, and when it ended); the checkpoint is then
    checked on the PFS (its files' sizes, and fio verify_only of the crc32c headers the
    job wrote);
  * reads through a cache instance (pfs= the directory the PFS write above made): a cold
    read (nothing cached), a warm re-read (from the SSDs; then checked with fio
    verify_only), and a working set --ws-factor times the instance's capacity (laid out
    on the PFS beforehand) read through.

The rounds (--runs, the working set only in the last) each make instances of their own, so
that every cold read is cold; the figures are the medians, each round's beside them.

Targets (issue 20): checkpoint write >= 0.8x scratch's and >= 3x the PFS's; warm re-read
>= 0.9x scratch's; cold read >= 0.8x the PFS's own read; the drain >= 0.8x the PFS link's
measured capacity (3 servers flushing in parallel).

Usage: sudo python3 bench/cache_bench.py [--binary bin/spillway] [--size-mib 1024]
                                         [--capacity-mib 3072] [--ws-factor 2] [--runs 3]
                                         [--pfs-mbit 400] [--bb-mbit 0] [--streams 4]
                                         [--cache-options "modified_threshold=1GiB ..."]
                                         [--dir DIR] [--no-write]
Needs root, iproute2 (ip, tc), util-linux (nsenter, setpriv), fio, glusterfs-server and
glusterfs-client (scripts/install-deps --bench), python3, and a built binary. Takes
/tmp/spillway-netns.lock as the e2e tests do. A full run (the defaults) moves about 18 GiB
through the PFS's link and lasts about 10 minutes on 2 cores; a quick check of the script:
--size-mib 256 --capacity-mib 768 --runs 1 --no-write (2 minutes).
"""
import argparse
import datetime
import fcntl
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks_md import write_section
from striped_bench import Bench, Gluster, end_job, job_instance
from warpfs_bench import NOBODY, ROOT, Cluster, drop_caches, sh

STORAGE = ("s1", "s2", "s3")
COMPUTE = ("c1",)
PFS_HOST = "p1"
PORT = 5299

# A raw TCP transfer for the PFS link's capacity: "sink N" accepts N connections and counts
# what they send until they close; "source HOST SECONDS" sends zeros for that long. Each
# prints the bytes it moved and the seconds from its first to its last byte.
LINK_SCRIPT = r"""
import socket, sys, threading, time
mode = sys.argv[1]
if mode == "sink":
    n = int(sys.argv[2])
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", %d))
    s.listen(n)
    print("ready", flush=True)
    total, first, last, lock = [0], [None], [0.0], threading.Lock()
    def one(c):
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            now = time.perf_counter()
            with lock:
                if first[0] is None:
                    first[0] = now
                total[0] += len(b)
                last[0] = now
        c.close()
    ts = []
    for _ in range(n):
        c, _ = s.accept()
        ts.append(threading.Thread(target=one, args=(c,)))
        ts[-1].start()
    for t in ts:
        t.join()
    print(total[0], last[0] - first[0])
else:
    host, secs = sys.argv[2], float(sys.argv[3])
    c = socket.create_connection((host, %d))
    buf = bytes(1 << 20)
    total, start = 0, time.perf_counter()
    while time.perf_counter() - start < secs:
        c.sendall(buf)
        total += len(buf)
    c.close()
    print(total, time.perf_counter() - start)
""" % (PORT, PORT)


class CacheBench(Bench):
    """Bench's fio runs, on the cluster's hosts and on the PFS host (inside glusterd's
    namespaces, where the PFS is mounted locally)."""

    def __init__(self, c, a, work, g):
        super().__init__(c, a, work)
        self.g = g

    def p1(self, script, user=True, background=False):
        cmd = ["nsenter", "-t", str(self.g.procs[PFS_HOST].pid), "-m", "-n", "--"]
        if user:
            cmd += ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
        cmd += ["/bin/sh", "-c", script]
        if background:
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        return subprocess.run(cmd, capture_output=True, text=True, cwd="/")

    def host(self, name, script, user=True, background=False):
        if name == PFS_HOST:
            return self.p1(script, user, background)
        if background:
            cmd = ["nsenter", "-t", str(self.c.procs[name].pid), "-m", "-n", "--"]
            if user:
                cmd += ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
            return subprocess.Popen(cmd + ["/bin/sh", "-c", script], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd="/")
        return self.c.on(name, script, user=user)

    def run(self, host, script):
        return self.host(host, script)

    def job(self, host, directory, name, rw, size_mib, extra=""):
        """One fio run of --streams jobs (a file each, 1 MiB blocks) over size_mib in all:
        returns (bytes/s, bytes moved, seconds)."""
        j = self.fio(host, directory, name, rw, "1M", size_mib, self.a.streams, extra)
        op = "read" if rw == "read" else "write"
        r = j["jobs"][0][op]
        return r["bw_bytes"], r["io_bytes"], r["runtime"] / 1000

    def write(self, host, directory, name, size_mib):
        """A checkpoint: sequential writes with crc32c headers (checked later with
        verify_only), fsynced at the end."""
        drop_caches()
        return self.job(host, directory, name, "write", size_mib, "--end_fsync=1 --verify=crc32c --do_verify=0 --verify_state_save=0")

    def read(self, host, directory, name, size_mib):
        drop_caches()
        return self.job(host, directory, name, "read", size_mib)

    def verify(self, host, directory, name, size_mib):
        """fio verify_only of files a write above made: exits on a mismatch (wrong data)."""
        each = max(1, size_mib // self.a.streams)
        cmd = (f"fio --name={name} --directory={directory} --rw=write --bs=1M --size={each}M "
               f"--numjobs={self.a.streams} --verify=crc32c --verify_only --output-format=json")
        r = self.host(host, cmd)
        if r.returncode != 0 or "verify:" in r.stderr:
            sys.exit(f"WRONG DATA: fio verify_only of {directory}/{name}.* on {host} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")

    def link(self, into_pfs, seconds):
        """The PFS link's capacity, bytes/s: s1-s3 sending to p1 at once (into_pfs), or p1
        sending to each of them."""
        script = os.path.join(self.work, "link.py")
        with open(script, "w") as f:
            f.write(LINK_SCRIPT)
        p1 = self.c.addr[PFS_HOST]
        if into_pfs:
            sinks = [self.host(PFS_HOST, f"/usr/bin/python3 {script} sink {len(STORAGE)}", background=True)]
            sources = lambda: [self.host(s, f"/usr/bin/python3 {script} source {p1} {seconds}", background=True) for s in STORAGE]
        else:
            sinks = [self.host(s, f"/usr/bin/python3 {script} sink 1", background=True) for s in STORAGE]
            sources = lambda: [self.host(PFS_HOST, f"/usr/bin/python3 {script} source {self.c.addr[s]} {seconds}",
                                         background=True) for s in STORAGE]
        for p in sinks:
            if p.stdout.readline().strip() != "ready":
                sys.exit(f"link sink: {p.stderr.read()}")
        srcs = sources()
        for p in srcs:
            out, err = p.communicate(timeout=seconds + 60)
            if p.returncode != 0:
                sys.exit(f"link source: {out}{err}")
        total, longest = 0, 0.0
        for p in sinks:
            out, err = p.communicate(timeout=60)
            if p.returncode != 0:
                sys.exit(f"link sink: {out}{err}")
            n, secs = out.split()
            total, longest = total + int(n), max(longest, float(secs))
        return total / longest


def cap(c, name, mbit, on):
    """Caps (or uncaps) a host's link both ways with a token bucket."""
    for ns, dev in ((f"{c.tag}-{name}", "eth0"), (f"{c.tag}-sw", "v" + name)):
        if on:
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
               "rate", f"{mbit}mbit", "burst", "1mb", "latency", "100ms")
        else:
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)


def mount_pfs(b, g, host, path):
    """Mounts the PFS (the GlusterFS volume on p1) at path on host."""
    r = b.host(host, f"mkdir -p {path} && mount -t glusterfs {b.c.addr[PFS_HOST]}:/bench {path}", user=False)
    if r.returncode != 0:
        sys.exit(f"mounting the PFS on {host}: {r.stdout}{r.stderr}")


LOG_LINE = re.compile(r'^time=(\S+) .*msg="cache flush: (draining to the PFS|drained)".* fragment=(\d+)(?:.* dirty=(\d+))?')


def drains(c, since):
    """Each storage server's teardown drains after offset `since` of its log (the offsets
    taken before the job's end): [(host, fragment, dirty bytes at its start, seconds)]."""
    out = []
    for name in STORAGE:
        with open(os.path.join(c.work, name + ".log")) as f:
            f.seek(since[name])
            text = f.read()
        start = {}
        for line in text.splitlines():
            m = LOG_LINE.match(line)
            if not m:
                continue
            t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
            if m.group(2) == "drained":
                if m.group(3) in start:
                    t0, dirty = start.pop(m.group(3))
                    out.append((name, int(m.group(3)), dirty, t - t0, t0, t))
            else:
                start[m.group(3)] = (t, int(m.group(4) or 0))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"))
    ap.add_argument("--size-mib", type=int, default=1024, help="the checkpoint, and the cold and warm reads (MiB, in all)")
    ap.add_argument("--capacity-mib", type=int, default=3072,
                    help="each instance's capacity (MiB), a third on each storage node")
    ap.add_argument("--ws-factor", type=float, default=2, help="the working set read through, times the capacity")
    ap.add_argument("--pfs-mbit", type=int, default=400, help="the PFS host's link, each way (Mbit/s)")
    ap.add_argument("--bb-mbit", type=int, default=0, help="each storage node's link, each way (0: uncapped)")
    ap.add_argument("--streams", type=int, default=4, help="fio jobs (a file each) in every run")
    ap.add_argument("--cache-options", default="",
                    help="more #DW jobdw options of the cache instances (e.g. modified_threshold=1GiB); default: "
                         "the site's [cache] defaults")
    ap.add_argument("--runs", type=int, default=3,
                    help="rounds of every measurement but the working set's (medians reported)")
    ap.add_argument("--link-seconds", type=float, default=5, help="length of each raw transfer over the PFS's link")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one under /var/tmp)")
    ap.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark creates network namespaces, caps links and drops the page cache")
    for tool in ("ip", "tc", "nsenter", "setpriv", "fio", "glusterd", "mount.glusterfs"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found (scripts/install-deps --bench installs what the benchmarks need)")
    binary = os.path.abspath(a.binary)
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary} not found: run scripts/install-deps first")
    if a.capacity_mib % len(STORAGE) or a.size_mib % a.streams:
        sys.exit(f"--capacity-mib must be a multiple of {len(STORAGE)}, --size-mib of --streams")
    grain = a.capacity_mib // len(STORAGE)
    ws_mib = int(a.capacity_mib * a.ws_factor) // a.streams * a.streams
    lock = open("/tmp/spillway-netns.lock", "w")
    print("waiting for /tmp/spillway-netns.lock …", flush=True)
    fcntl.flock(lock, fcntl.LOCK_EX)
    a.load = os.getloadavg()
    work = a.dir or tempfile.mkdtemp(prefix="spillway-cache-bench-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    os.chmod(work, 0o755)
    pfs = os.path.join(work, "pfs")  # the PFS's mount point on every host
    c = Cluster(binary, work, storage=STORAGE, compute=COMPUTE + (PFS_HOST,))
    g = Gluster(c, work)
    b = CacheBench(c, a, work, g)
    r = {}
    mounted = []
    started = time.time()
    try:
        c.netns()
        node_gib = max(2, -(-2 * grain // 1024) + 1)
        c.configs(capacity_gib=node_gib, granularity=f"{grain}MiB", extra=f'[cache]\nallowed_pfs = ["{pfs}"]\n')
        for name in ("ctl",) + STORAGE + COMPUTE:
            c.start(name)
        print("the PFS: GlusterFS, one brick on p1 …", flush=True)
        g.start([PFS_HOST])
        g.volume([PFS_HOST])
        for host in (PFS_HOST,) + STORAGE + COMPUTE:
            mount_pfs(b, g, host, pfs)
            mounted.append(host)
        b.p1(f"chown {NOBODY}:{NOBODY} {pfs}", user=False)
        for d in ("data", "data/cold", "data/ws"):
            if b.p1(f"mkdir -p {pfs}/{d}").returncode != 0:
                sys.exit(f"mkdir {pfs}/{d} on the PFS failed")
        print(f"laying out the working set ({ws_mib} MiB) on the PFS, on p1 …", flush=True)
        b.write(PFS_HOST, f"{pfs}/data/ws", "ws", ws_mib)

        cap(c, PFS_HOST, a.pfs_mbit, True)
        if a.bb_mbit:
            for s in STORAGE:
                cap(c, s, a.bb_mbit, True)
        print(f"the PFS's link, capped at {a.pfs_mbit} Mbit/s …", flush=True)
        r["link_in"] = b.link(True, a.link_seconds)
        r["link_out"] = b.link(False, a.link_seconds)
        print(f"  raw TCP into p1 {r['link_in'] / 1e6:.1f} MB/s, out of p1 {r['link_out'] / 1e6:.1f} MB/s", flush=True)

        for i in range(a.runs):
            one_round(a, b, c, work, pfs, i, r, ws_mib if i == a.runs - 1 else 0)
    finally:
        for host in reversed(mounted):
            b.host(host, f"umount -l {pfs}", user=False)
        try:
            stop_gluster(g, work)
        finally:
            c.close()
            if not a.dir:
                shutil.rmtree(work, ignore_errors=True)
    elapsed = time.time() - started
    report(a, r, ws_mib, elapsed)


def one_round(a, b, c, work, pfs, i, r, ws_mib):
    """One of --runs rounds: the PFS directly, scratch, the cache's checkpoint and drain, the
    cache's cold and warm reads (and, ws_mib, the working set); appends to r's lists."""
    add = lambda key, v: r.setdefault(key, []).append(v)
    mib = lambda v: f"{v[0] / 1e6:.1f} MB/s"
    tag = f"round {i + 1} of {a.runs}:"
    print(f"{tag} the PFS used directly from c1 …", flush=True)
    add("pfs_w", b.write("c1", f"{pfs}/data/cold", "cold", a.size_mib))
    add("pfs_r", b.read("c1", f"{pfs}/data/cold", "cold", a.size_mib))
    print(f"  write {mib(r['pfs_w'][-1])}, read {mib(r['pfs_r'][-1])}", flush=True)

    print(f"{tag} a scratch instance …", flush=True)
    token = str(310 + 3 * i)
    mount = job_instance(c, work, token, f"jobdw type=scratch access_mode=striped capacity={a.capacity_mib}MiB")
    r["scratch_nodes"] = placement(c)
    add("scratch_w", b.write("c1", mount, "ckpt", a.size_mib))
    # Read twice, as the cache's data is (cold, then warm): the second read is the one held
    # against the cache's warm re-read (the first, right after the write, is shown beside it).
    add("scratch_r1", b.read("c1", mount, "ckpt", a.size_mib))
    add("scratch_r", b.read("c1", mount, "ckpt", a.size_mib))
    end_job(c, work, token)
    print(f"  write {mib(r['scratch_w'][-1])}, read {mib(r['scratch_r1'][-1])}, re-read {mib(r['scratch_r'][-1])}",
          flush=True)

    print(f"{tag} a cache instance: the checkpoint, then the drain …", flush=True)
    token, d = str(311 + 3 * i), f"ckpt{i}"
    if b.p1(f"mkdir -p {pfs}/{d}").returncode != 0:
        sys.exit(f"mkdir {pfs}/{d} on the PFS failed")
    mount = job_instance(c, work, token, f"jobdw type=cache access_mode=striped capacity={a.capacity_mib}MiB "
                                         f"pfs={pfs}/{d} {a.cache_options}".strip())
    r["cache_nodes"] = placement(c)
    add("cache_w", b.write("c1", mount, "ckpt", a.size_mib))
    since = {s: os.path.getsize(os.path.join(work, s + ".log")) for s in STORAGE}
    t0 = time.time()  # the job's end
    early = on_brick(work, d, "ckpt.")
    end_job(c, work, token)
    wall = time.time() - t0
    add("drain", {"early": early, "wall": wall, "servers": drains(c, since)})
    print(f"  write {mib(r['cache_w'][-1])}; {early / 2**20:.0f} MiB on the PFS at the job's end, the rest "
          f"{wall:.1f} s later (teardown's end); servers' drains {r['drain'][-1]['servers']}", flush=True)
    out = b.p1(f"stat -c %s {pfs}/{d}/ckpt.*").stdout.split()
    if sorted(int(x) for x in out) != [a.size_mib // a.streams << 20] * a.streams:
        sys.exit(f"WRONG DATA: the checkpoint's files on the PFS after the teardown have sizes {out}")
    b.verify(PFS_HOST, f"{pfs}/{d}", "ckpt", a.size_mib)
    b.p1(f"rm -f {pfs}/{d}/ckpt.*")
    print("  the checkpoint is on the PFS, verified", flush=True)

    print(f"{tag} a cache instance: cold and warm reads{', the working set' if ws_mib else ''} …", flush=True)
    token = str(312 + 3 * i)
    mount = job_instance(c, work, token, f"jobdw type=cache access_mode=striped capacity={a.capacity_mib}MiB "
                                         f"pfs={pfs}/data {a.cache_options}".strip())
    add("cold", b.read("c1", f"{mount}/cold", "cold", a.size_mib))
    add("warm", b.read("c1", f"{mount}/cold", "cold", a.size_mib))
    b.verify("c1", f"{mount}/cold", "cold", a.size_mib)
    print(f"  cold {mib(r['cold'][-1])}, warm {mib(r['warm'][-1])}", flush=True)
    if ws_mib:
        add("ws", b.read("c1", f"{mount}/ws", "ws", ws_mib))
        print(f"  working set {mib(r['ws'][-1])}", flush=True)
    end_job(c, work, token)


def on_brick(work, d, prefix):
    """Bytes of the files d/prefix* that the PFS holds: the blocks allocated to them on p1's
    brick (sparse files: what the cache's flushes have written so far)."""
    top = os.path.join(work, "gluster", PFS_HOST, "brick", "b", d)
    n = 0
    for name in os.listdir(top):
        if name.startswith(prefix):
            n += os.stat(os.path.join(top, name)).st_blocks * 512
    return n


def stop_gluster(g, work):
    """Stops the volume, glusterd and its brick (found by the run's directory in its command line)."""
    if PFS_HOST in g.procs:
        g.cli(PFS_HOST, ["volume", "stop", "bench", "force"], check=False)
    for p in g.procs.values():
        subprocess.run(["pkill", "-TERM", "-P", str(p.pid)], capture_output=True)
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
    subprocess.run(["pkill", "-f", os.path.join(work, "gluster") + "/"], capture_output=True)


def placement(c):
    """The storage nodes of the session's instance (dwstat fragments): warns unless all 3."""
    p = sh(c.binary, "dwstat", "--config", c.config["ctl"], "--json", "fragments", check=False)
    try:
        nodes = sorted(f["node"] for f in json.loads(p.stdout).get("fragments", []))
    except (ValueError, KeyError, AttributeError):
        print(f"WARNING: dwstat --json fragments: {p.stdout}{p.stderr}", flush=True)
        return []
    if nodes != sorted(STORAGE):
        print(f"WARNING: the instance's fragments are on {nodes}, not one on each of {list(STORAGE)}", flush=True)
    return nodes


def report(a, r, ws_mib, elapsed):
    mb = lambda v: f"{v / 1e6:.0f}" if v >= 1e7 else f"{v / 1e6:.1f}"
    ckpt = a.size_mib << 20
    # The drain of a round: what was not yet on the PFS at the job's end, over the time from
    # the job's end to the end of its teardown (post_run's unmount, the teardown's flush and
    # the deletion).
    for x in r["drain"]:
        x["rate"] = (ckpt - min(x["early"], ckpt)) / x["wall"]
        sv = x["servers"]
        x["dirty"] = sum(y[2] for y in sv)
        x["span"] = (max(y[5] for y in sv) - min(y[4] for y in sv)) if sv else 0.0
    M = {k: statistics.median(v[0] for v in r[k]) for k in ("pfs_w", "pfs_r", "scratch_w", "scratch_r1",
                                                             "scratch_r", "cache_w", "cold", "warm", "ws")}
    ordered = sorted(r["drain"], key=lambda x: x["rate"])
    dm = ordered[(len(ordered) - 1) // 2]  # the median round's drain (the lower middle of an even count)
    M["drain"] = statistics.median(x["rate"] for x in r["drain"])
    link_in, link_out = r["link_in"], r["link_out"]
    checks = [
        ("checkpoint write, cache ÷ scratch", M["cache_w"] / M["scratch_w"], 0.8),
        ("checkpoint write, cache ÷ PFS", M["cache_w"] / M["pfs_w"], 3.0),
        ("warm re-read, cache ÷ scratch re-read", M["warm"] / M["scratch_r"], 0.9),
        ("cold read, cache ÷ PFS read", M["cold"] / M["pfs_r"], 0.8),
        ("drain (job's end → teardown's end) ÷ PFS link into p1", M["drain"] / link_in, 0.8),
    ]
    each = lambda k: " / ".join(mb(v[0]) for v in r[k])
    rows = [
        ("checkpoint write (fsync at the end)", "cache_w", "scratch_w", "pfs_w"),
        ("drain to the PFS after the job", "drain", None, None),
        ("first read (cache: cold, nothing cached; scratch: right after the write)", "cold", "scratch_r1", "pfs_r"),
        ("re-read (cache: warm)", "warm", "scratch_r", None),
        (f"working set {ws_mib} MiB = {a.ws_factor:g}× capacity, read", "ws", None, "pfs_r"),
    ]
    lines = ["| MB/s (median) | cache | scratch | PFS directly | every round: cache; scratch; PFS |",
             "|---|---:|---:|---:|---|"]
    for label, ck, sk, pk in rows:
        rounds = "; ".join(" / ".join(mb(x["rate"]) for x in r["drain"]) if k == "drain" else each(k)
                           for k in (ck, sk, pk) if k)
        lines.append(f"| {label} | {mb(M[ck])} | {mb(M[sk]) if sk else '-'} | {mb(M[pk]) if pk else '-'} | "
                     f"{rounds} |")
    table = "\n".join(lines)
    early = min(dm["early"], ckpt)
    sv = dm["servers"]
    drain = (f"Drain (the median round): at the job's end {early / 2**20:.0f} MiB of the {a.size_mib} MiB checkpoint "
             f"were already on the PFS (flushed during the burst: modified_threshold, the dirty watermark; counted "
             f"as the blocks of its files on p1's brick); the other {(ckpt - early) / 2**20:.0f} MiB reached it in "
             f"{dm['wall']:.1f} s, from the job's end to the end of its teardown (post_run's unmount, the "
             f"teardown's flush by {len(sv)} servers in parallel, the deletion): {mb(dm['rate'])} MB/s. The "
             f"servers' own flushes (their logs: dirty bytes when the teardown's flush started, some of them "
             f"already on their way) took {dm['span']:.1f} s for {dm['dirty'] / 2**20:.0f} MiB: " +
             ", ".join(f"{x[0]} {x[2] / 2**20:.0f} MiB in {x[3]:.1f} s" for x in sorted(sv)) + ".")
    ceil = (f"Ceilings measured in the run: the PFS's link (tc tbf {a.pfs_mbit} Mbit/s = {a.pfs_mbit / 8:.0f} MB/s "
            f"each way), raw TCP s1-s3 → p1 {mb(link_in)} MB/s, p1 → s1-s3 {mb(link_out)} MB/s; "
            f"GlusterFS on it from c1: write {mb(M['pfs_w'])} MB/s, read {mb(M['pfs_r'])} MB/s "
            f"({M['pfs_w'] / link_in:.2f} and {M['pfs_r'] / link_out:.2f} of the link).")
    tl = ["| target | measured | wanted | |", "|---|---:|---:|---|"]
    for label, v, want in checks:
        tl.append(f"| {label} | {v:.2f}× | ≥ {want:g}× | {'met' if v >= want else '**missed**'} |")
    targets = "\n".join(tl)
    print("\n" + table + "\n\n" + targets + "\n\n" + drain + "\n\n" + ceil + f"\n\n({elapsed:.0f} s in all)")
    if a.no_write:
        return
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    bb = f"capped at {a.bb_mbit} Mbit/s each way" if a.bb_mbit else "uncapped"
    write_section("cache", (
        "## Cache instances: against scratch and the PFS (issue 20)\n\n"
        f"Measured {when} on {os.cpu_count()} cores, Linux {platform.release()}, with "
        f"`{' '.join(['sudo python3 bench/cache_bench.py'] + sys.argv[1:])}` ({sh('fio', '--version').stdout.strip()}, "
        f"{sh('glusterfs', '--version').stdout.splitlines()[0]}; {elapsed / 60:.0f} minutes; load average "
        f"{a.load[0]:.1f} before the run, {os.getloadavg()[0]:.1f} after it). Each host a network "
        f"namespace: 3 storage nodes s1-s3 (links {bb}), compute node c1, and the PFS: GlusterFS, one brick on "
        f"host p1 whose link is capped at {a.pfs_mbit} Mbit/s each way (tc tbf), mounted on s1-s3 (the cache's "
        f"PFS doors) and on c1 (the PFS used directly). Instances of {a.capacity_mib} MiB, "
        f"`#DW jobdw type=cache|scratch access_mode=striped`, one grain on each storage node, the site's cache "
        f"defaults (write-behind, read-ahead 4 MiB, modified_threshold 64 MiB, no sync_to_pfs)"
        f"{', with ' + a.cache_options + ' on the cache instances' if a.cache_options else ''}. fio as an ordinary "
        f"user on c1, {a.streams} jobs with a file each, 1 MiB blocks, {a.size_mib} MiB in all (working set: "
        f"{ws_mib} MiB); writes fsynced at the end (on a cache, fsync returns once the data is on the burst "
        f"buffer's SSDs: the job-visible time), reads after dropping the page cache; {a.runs} round(s), each "
        f"with instances of its own (the working set in the last), medians reported.\n\n"
        f"{table}\n\n{targets}\n\n{drain}\n\n{ceil}\n\n"
        "The cold read fetches from the PFS through the storage servers (each its own stripes, reading ahead); "
        "the warm re-read is served from their SSDs; the working set, larger than the instance, is read through "
        "while the cache evicts what was read least recently. The checkpoint written through the cache was "
        "checked on the PFS after the teardown (fio verify_only, crc32c), and the warm re-read through the cache. "
        "All hosts share this VM's one disk and its cores: the burst buffer's own figures are bounded by CPU "
        "(FUSE, TCP, servers), the PFS's by its capped link. A file's dirty bytes on a server past "
        "modified_threshold are flushed while the job still writes: those flushes (the storage nodes' GlusterFS "
        "clients included) share the same cores with the burst; `--cache-options modified_threshold=4GiB` "
        "measures the write without them.\n"))


if __name__ == "__main__":
    main()
