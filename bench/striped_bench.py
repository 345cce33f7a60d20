#!/usr/bin/env python3
"""Striped instances: how bandwidth and small I/O scale with the number of storage nodes.

Prints the figures and writes them into BENCHMARKS.md between <!-- striped:begin --> and
<!-- striped:end -->. A real cluster in network namespaces (a controller, four storage nodes
s1-s4 and two compute nodes c1, c2, as bench/warpfs_bench.py builds it), and fio (Debian's)
run as an ordinary user on the compute nodes, against a job instance of 1, 2 and 4 GiB on
1 GiB grains: the bandwidth strategy places it on 1, 2 and 4 storage nodes, and striping
spreads every file over all of them.

Measured, for 1, 2 and 4 servers:
  * scaling: every storage node's link capped with tc (tbf, --cap-mbit each way), sequential
    1 MiB writes and reads by one client with 4 streams, and by both clients together
    (2 streams each); the ratio to the one-server figure is what striping buys;
  * uncapped: sequential 1 MiB (1 and 4 streams) and 64 KiB (4 streams), 4 KiB random reads
    and writes (libaio, O_DIRECT, iodepth 32), 4 KiB write+fdatasync latency (p50), and
    file create, stat and unlink rates (one process, --files files);
  * co-located: a one-server instance used on its own storage node (one stream);
  * the ceiling: the same fio jobs on the raw file system under the storage nodes.
Writes end with an fsync (fio end_fsync); reads follow a drop of the page cache. fio does
not preallocate (fallocate=none), as applications writing a checkpoint do not.

Usage: sudo python3 bench/striped_bench.py [--binary bin/spillway] [--size-mib 1024]
                                           [--cap-mbit 800] [--files 2000] [--no-write]
                                           [--fragment-fs directory|xfs-loop]
                                           [--write-window-multiplier N]
Needs root, iproute2 (ip, tc), util-linux, fio, python3, and a built binary.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks_md import write_section
from warpfs_bench import Cluster, NOBODY, ROOT, drop_caches, enter_cgroup, sh

STORAGE = ("s1", "s2", "s3", "s4")
COMPUTE = ("c1", "c2")

# The small-file loop, run as the user on a compute node: seconds for each phase.
FILES_SCRIPT = r"""
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
names = [os.path.join(d, "f%d" % i) for i in range(n)]
t = [time.perf_counter()]
for p in names:
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
t.append(time.perf_counter())
for p in names:
    os.stat(p)
t.append(time.perf_counter())
for p in names:
    os.unlink(p)
t.append(time.perf_counter())
print(" ".join("%.6f" % (t[i + 1] - t[i]) for i in range(3)))
"""


class Bench:
    def __init__(self, c, a, work):
        self.c, self.a, self.work = c, a, work
        self.cgroup = None  # the cgroup.procs file the workloads run in (bench/metadata_bench.py counts their CPU)

    def run(self, host, script):
        """Runs a shell script as the ordinary user on a host (None: the machine's own namespaces,
        where the raw file system is measured); returns the CompletedProcess."""
        if host is None:
            cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", "/bin/sh", "-c", script]
            return subprocess.run(cmd, capture_output=True, text=True, cwd="/", preexec_fn=enter_cgroup(self.cgroup))
        return self.c.on(host, script, cgroup=self.cgroup)

    def run_on(self, host, script):
        r = self.run(host, script)
        if r.returncode != 0:
            sys.exit(f"on {host or 'the raw file system'}: {script}\n{r.stdout}{r.stderr}")
        return r.stdout

    def fio(self, host, directory, name, rw, bs, size_mib, streams, extra=""):
        """One fio run; returns its JSON."""
        each = max(1, size_mib // streams)
        cmd = (f"fio --name={name} --directory={directory} --rw={rw} --bs={bs} --size={each}M "
               f"--numjobs={streams} --group_reporting --fallocate=none --output-format=json {extra}")
        out = self.run_on(host, cmd)
        return json.loads(out[out.index("{"):])

    def seq(self, host, directory, bs, streams, size_mib=None):
        """Sequential write (fsync at the end) then read after a cache drop: bytes/s each."""
        size = size_mib or self.a.size_mib
        name = f"seq{bs}x{streams}"
        drop_caches()
        w = self.fio(host, directory, name, "write", bs, size, streams, "--end_fsync=1")
        drop_caches()
        r = self.fio(host, directory, name, "read", bs, size, streams)
        self.run_on(host, f"rm -f {directory}/{name}.*")
        return w["jobs"][0]["write"]["bw_bytes"], r["jobs"][0]["read"]["bw_bytes"]

    def random(self, host, directory, measure=lambda name, run: run()):
        """4 KiB random reads and writes, O_DIRECT, iodepth 32: IOPS each. measure(name, run)
        calls run() (a fio run's JSON) for "randread" and "randwrite", and may time it."""
        size = min(256, self.a.size_mib)
        base = f"--bs=4k --ioengine=libaio --iodepth=32 --direct=1 --runtime={self.a.runtime} --time_based"
        self.fio(host, directory, "rand", "write", "1M", size, 1, "--end_fsync=1")  # lay the file out
        drop_caches()
        r = measure("randread", lambda: self.fio(host, directory, "rand", "randread", "4k", size, 1, base))
        w = measure("randwrite", lambda: self.fio(host, directory, "rand", "randwrite", "4k", size, 1, base))
        self.run_on(host, f"rm -f {directory}/rand.*")
        return r["jobs"][0]["read"]["iops"], w["jobs"][0]["write"]["iops"]

    def fdatasync_p50(self, host, directory, measure=lambda name, run: run()):
        """Median latency of a 4 KiB write followed by fdatasync, in microseconds (measure as in random)."""
        j = measure("sync", lambda: self.fio(host, directory, "sync", "write", "4k", 4, 1, "--fdatasync=1 --ioengine=psync"))
        job = j["jobs"][0]
        sync = job.get("sync", {}).get("lat_ns", {}).get("percentile", {}).get("50.000000")
        write = job["write"]["clat_ns"]["percentile"]["50.000000"]
        self.run_on(host, f"rm -f {directory}/sync.*")
        return ((sync or 0) + write) / 1000

    def files(self, host, directory):
        """Creates, stats and unlinks per second."""
        script = os.path.join(self.work, "files.py")
        with open(script, "w") as f:
            f.write(FILES_SCRIPT)
        out = self.run_on(host, f"python3 {script} {directory}/files {self.a.files}")
        return [self.a.files / float(x) for x in out.split()]

    def all_uncapped(self, host, directory):
        w1, r1 = self.seq(host, directory, "1M", 1)
        w4, r4 = self.seq(host, directory, "1M", 4)
        w64, r64 = self.seq(host, directory, "64k", 4, size_mib=max(64, self.a.size_mib // 4))
        rr, rw = self.random(host, directory)
        p50 = self.fdatasync_p50(host, directory)
        creates, stats, unlinks = self.files(host, directory)
        return {"w1": w1, "r1": r1, "w4": w4, "r4": r4, "w64": w64, "r64": r64, "rr": rr, "rw": rw,
                "sync": p50, "create": creates, "stat": stats, "unlink": unlinks}

    def two_clients(self, directory, op):
        """Both compute nodes at once, 2 streams each: total bytes/s."""
        size = self.a.size_mib // 2
        results, threads = {}, []

        def one(host):
            extra = "--end_fsync=1" if op == "write" else ""
            results[host] = self.fio(host, directory, f"two-{host}", op, "1M", size, 2, extra)
        start = time.time()
        for host in COMPUTE:
            threads.append(threading.Thread(target=one, args=(host,)))
            threads[-1].start()
        for t in threads:
            t.join()
        wall = time.time() - start
        moved = sum(r["jobs"][0][op]["io_bytes"] for r in results.values())
        return moved / wall

    def capped(self, directory):
        (w4, r4), busy1 = busy_while(lambda: self.seq("c1", directory, "1M", 4))
        drop_caches()
        def both_clients():
            w = self.two_clients(directory, "write")
            drop_caches()
            return w, self.two_clients(directory, "read")
        (w2, r2), busy2 = busy_while(both_clients)
        for host in COMPUTE:
            self.run_on(host, f"rm -f {directory}/two-{host}.*")
        return {"w4": w4, "r4": r4, "w2c": w2, "r2c": r2, "busy1": busy1, "busy2": busy2}


def cpu_times():
    """The machine's busy and total CPU time (jiffies, all cores) from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_while(fn):
    """Runs fn; returns its result and the share of the machine's CPU that was busy meanwhile
    (1.0: every core saturated) — what bounds a run when the links are not."""
    b0, t0 = cpu_times()
    result = fn()
    b1, t1 = cpu_times()
    return result, (b1 - b0) / max(1, t1 - t0)


class Gluster:
    """GlusterFS (Debian's glusterfs-server) on the same storage hosts: a glusterd per host in
    a mount namespace of its own (its state, sockets and logs in the run's directory), one
    brick per host on the same file system as Spillway's SSD paths, a distributed volume over
    the hosts, mounted with the glusterfs FUSE client on compute node c1."""

    def __init__(self, c, work):
        self.c, self.work, self.procs = c, work, {}

    def start(self, hosts, cgroup=None):
        """Starts a glusterd on each host (in the cgroup whose cgroup.procs file is cgroup: the
        bricks' glusterfsd it starts too)."""
        for name in hosts:
            base = os.path.join(self.work, "gluster", name)
            for d in ("lib", "run", "log", "brick"):
                os.makedirs(os.path.join(base, d), exist_ok=True)
            sh("cp", "-a", "/var/lib/glusterd/.", os.path.join(base, "lib"))
            # A /run of its own: glusterd's socket (/run/glusterd.socket) is per host.
            script = (f"mount --bind {base}/lib /var/lib/glusterd && mount -t tmpfs none /run && "
                      f"mkdir -p /run/gluster && mount --bind {base}/run /run/gluster && "
                      f"mount --bind {base}/log /var/log/glusterfs && exec glusterd -N")
            log = open(os.path.join(base, "glusterd.out"), "w")
            self.procs[name] = subprocess.Popen(
                ["ip", "netns", "exec", f"{self.c.tag}-{name}", "unshare", "--mount", "--propagation", "private",
                 "sh", "-c", script], stdout=log, stderr=log, preexec_fn=enter_cgroup(cgroup))
        for name in hosts:
            self.wait(name, "gluster pool list")

    def cli(self, name, args, check=True):
        cmd = ["nsenter", "-t", str(self.procs[name].pid), "-m", "-n", "--", "gluster", "--mode=script"] + args
        r = subprocess.run(cmd, capture_output=True, text=True)
        if check and r.returncode != 0:
            sys.exit(f"gluster {' '.join(args)} on {name}: {r.stdout}{r.stderr}")
        return r

    def wait(self, name, what):
        deadline = time.time() + 60
        while time.time() < deadline:
            # glusterd execs in a child of unshare's shell: enter the namespaces of that process.
            if self.cli(name, what.split()[1:], check=False).returncode == 0:
                return
            time.sleep(0.5)
        sys.exit(f"glusterd on {name} did not answer")

    def volume(self, hosts):
        first = hosts[0]
        for h in hosts[1:]:
            self.cli(first, ["peer", "probe", self.c.addr[h]])
        deadline = time.time() + 60
        while time.time() < deadline:
            out = self.cli(first, ["pool", "list"]).stdout
            if out.count("Connected") >= len(hosts):
                break
            time.sleep(0.5)
        bricks = [f"{self.c.addr[h]}:{os.path.join(self.work, 'gluster', h, 'brick', 'b')}" for h in hosts]
        self.cli(first, ["volume", "create", "bench", "transport", "tcp"] + bricks + ["force"])
        self.cli(first, ["volume", "start", "bench"])

    def up(self, hosts, client, path, server_cgroup=None, client_cgroup=None):
        """Everything at once: glusterds on hosts, the distributed volume over them, mounted on client at path."""
        self.start(hosts, server_cgroup)
        self.volume(hosts)
        self.mount(client, path, client_cgroup)

    def mount(self, host, path, cgroup=None):
        """Mounts the volume on host (its glusterfs client process in cgroup, if given)."""
        r = self.c.on(host, f"mkdir -p {path} && mount -t glusterfs {self.c.addr['s1']}:/bench {path} && "
                            f"chown {NOBODY}:{NOBODY} {path}", user=False, cgroup=cgroup)
        if r.returncode != 0:
            sys.exit(f"mounting the gluster volume on {host}: {r.stdout}{r.stderr}")

    def close(self, host, path):
        self.c.on(host, f"umount -l {path}", user=False)
        for name, p in self.procs.items():
            self.cli(name, ["volume", "stop", "bench", "force"], check=False) if name == "s1" else None
        for p in self.procs.values():
            subprocess.run(["pkill", "-TERM", "-P", str(p.pid)], capture_output=True)
            p.terminate()
        subprocess.run(["pkill", "-f", os.path.join(self.work, "gluster")], capture_output=True)


def job_instance(c, work, token, directive, nodes=("c1",)):
    """A job instance through the workload manager's calls (setup, paths, pre_run), as Slurm
    makes one: directive is the #DW line (e.g. "jobdw type=scratch access_mode=striped
    capacity=4GiB"), nodes the compute nodes it is mounted on. Returns the mount path the
    paths call gives (the first variable: $DW_JOB_STRIPED or $DW_JOB_PRIVATE); end_job ends it."""
    job = os.path.join(work, f"job{token}.sh")
    with open(job, "w") as f:
        f.write(f"#!/bin/sh\n#DW {directive}\n\0")
    capacity = directive.split("capacity=", 1)[1].split()[0]
    hostfile = os.path.join(work, f"nodes{token}")
    with open(hostfile, "w") as f:
        f.write("".join(n + "\n" for n in nodes))
    c.wlm("setup", "--token", token, "--caller", "SLURM", "--user", str(NOBODY), "--groupid", str(NOBODY),
          "--capacity", f"wlm_pool:{capacity}", "--job", job)
    pathfile = os.path.join(work, f"paths{token}")
    c.wlm("paths", "--token", token, "--job", job, "--pathfile", pathfile)
    mount = open(pathfile).read().strip().splitlines()[0].split("=", 1)[1].rstrip("/")
    c.wlm("pre_run", "--token", token, "--job", job, "--nodehostnamefile", hostfile)
    return mount


def end_job(c, work, token):
    """post_run and teardown of a job_instance."""
    job = os.path.join(work, f"job{token}.sh")
    c.wlm("post_run", "--token", token, "--job", job)
    c.wlm("teardown", "--token", token, "--job", job)


def cap_links(c, mbit, on):
    """Caps (or uncaps) every storage node's link both ways with a token bucket."""
    for name in STORAGE:
        for ns, dev in ((f"{c.tag}-{name}", "eth0"), (f"{c.tag}-sw", "v" + name)):
            if on:
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                   "rate", f"{mbit}mbit", "burst", "1mb", "latency", "100ms")
            else:
                subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)


def raw_xfs_loop(b, work, size_mib):
    """One stream, 1 MiB, on an XFS made as the agent makes a fragment's (sparse image, mkfs.xfs
    -K -m reflink=0, loop device with direct I/O): the ceiling of an xfs-loop fragment."""
    img, mnt = os.path.join(work, "rawxfs.img"), os.path.join(work, "rawxfs")
    os.makedirs(mnt)
    with open(img, "w") as f:
        f.truncate(max(320, 2 * size_mib + 256) << 20)
    sh("mkfs.xfs", "-q", "-K", "-m", "reflink=0", img)
    dev = sh("losetup", "--find", "--show", "--direct-io=on", img).stdout.strip()
    try:
        sh("mount", "-o", "nodev,nosuid,noexec", dev, mnt)
        try:
            os.chown(mnt, NOBODY, NOBODY)
            w, r = b.seq(None, mnt, "1M", 1)
            return {"w1": w, "r1": r}
        finally:
            sh("umount", mnt)
    finally:
        subprocess.run(["losetup", "-d", dev])
        os.remove(img)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"))
    ap.add_argument("--size-mib", type=int, default=1024, help="data moved by each sequential measurement")
    ap.add_argument("--cap-mbit", type=int, default=800, help="each storage node's link, each way, in the scaling runs")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--runtime", type=int, default=5, help="seconds of each random-I/O run")
    ap.add_argument("--servers", default="1,2,4")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--no-gluster", action="store_true", help="skip the GlusterFS comparison")
    ap.add_argument("--only-gluster", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--fragment-fs", choices=("directory", "xfs-loop"), default="directory",
                    help="the storage nodes' agent.fragment_filesystem: xfs-loop makes every fragment an XFS "
                         "on a loop device (needs xfsprogs), so the co-located mount writes through the kernel")
    ap.add_argument("--write-window-multiplier", type=int, default=None,
                    help="[limits] write_window_multiplier for the jobs (default: the site's, 10); 0 turns the "
                         "write window off, which a co-located mount needs to write through the kernel")
    a = ap.parse_args()
    # A SIGTERM (timeout, kill) still removes the namespaces and daemons (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    use_gluster = not a.no_gluster
    if use_gluster and not shutil.which("glusterd"):
        sys.exit("glusterd not found: apt-get install glusterfs-server glusterfs-client (or --no-gluster)")
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark creates network namespaces, caps links and drops the page cache")
    for tool in ("ip", "tc", "nsenter", "setpriv", "fio"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found (fio: apt-get install fio)")
    if a.fragment_fs == "xfs-loop" and not shutil.which("mkfs.xfs"):
        sys.exit("mkfs.xfs not found: apt-get install xfsprogs (or --fragment-fs directory)")
    binary = os.path.abspath(a.binary)
    work = a.dir or tempfile.mkdtemp(prefix="spillway-striped-bench-", dir="/var/tmp")
    os.chmod(work, 0o755)
    raw = os.path.join(work, "raw")
    os.makedirs(raw)
    os.chown(raw, NOBODY, NOBODY)
    c = Cluster(binary, work, storage=STORAGE, compute=COMPUTE)
    b = Bench(c, a, work)
    servers = [int(x) for x in a.servers.split(",")]
    results = {}
    try:
        c.netns()
        limits = "" if a.write_window_multiplier is None else f"[limits]\nwrite_window_multiplier = {a.write_window_multiplier}\n"
        c.configs(capacity_gib=8, extra=limits, storage_extra=f'fragment_filesystem = "{a.fragment_fs}"\n')
        for name in ("ctl",) + STORAGE + COMPUTE:
            c.start(name)
        print("raw file system …", flush=True)
        results["raw"] = b.all_uncapped(None, raw)
        w, r = b.seq(None, raw, "1M", 1)
        results["raw"]["w1"], results["raw"]["r1"] = w, r
        if a.fragment_fs == "xfs-loop":
            print("raw XFS on a loop device (what an xfs-loop fragment is) …", flush=True)
            results["rawxfs"] = raw_xfs_loop(b, work, a.size_mib)
        if use_gluster:
            g = Gluster(c, work)
            hosts = list(STORAGE[:max(servers)])
            gmnt = os.path.join(work, "gluster-mount")
            try:
                print(f"GlusterFS, {len(hosts)} bricks …", flush=True)
                g.up(hosts, "c1", gmnt)
                results["gluster"] = b.all_uncapped("c1", gmnt)
                print(json.dumps(results["gluster"], indent=1), flush=True)
            finally:
                g.close("c1", gmnt)
        for n in ([] if a.only_gluster else servers):
            token = str(100 + n)
            mount = job_instance(c, work, token, f"jobdw type=scratch access_mode=striped capacity={n}GiB",
                                 nodes=("c1", "c2", "s1"))
            print(f"{n} server(s): uncapped …", flush=True)
            results[n] = b.all_uncapped("c1", mount)
            if n == 1:
                w, r = b.seq("s1", mount, "1M", 1)
                results["colocated"] = {"w1": w, "r1": r}
            print(f"{n} server(s): links capped at {a.cap_mbit} Mbit/s …", flush=True)
            cap_links(c, a.cap_mbit, True)
            try:
                results[n]["capped"] = b.capped(mount)
            finally:
                cap_links(c, a.cap_mbit, False)
            end_job(c, work, token)
            print(json.dumps(results[n], indent=1), flush=True)
    finally:
        c.close()
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)

    mb = lambda v: f"{v / 1e6:.0f}"
    first = servers[0]
    lines = ["| servers | 1 client × 4 streams, write MB/s | read MB/s | 2 clients × 2 streams, write MB/s | read MB/s | CPU busy, 1 client / 2 clients |",
             "|---:|---:|---:|---:|---:|---:|"]
    for n in servers:
        cp, base = results[n]["capped"], results[first]["capped"]
        cells = [f"{mb(cp[k])} ({cp[k] / base[k]:.2f}×)" for k in ("w4", "r4", "w2c", "r2c")]
        cells.append(f"{cp['busy1']:.0%} / {cp['busy2']:.0%}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    scaling = "\n".join(lines)

    cols = [("w1", "1M write, 1 stream MB/s", mb), ("r1", "1M read, 1 MB/s", mb), ("w4", "1M write, 4 MB/s", mb),
            ("r4", "1M read, 4 MB/s", mb), ("w64", "64K write, 4 MB/s", mb), ("r64", "64K read, 4 MB/s", mb),
            ("rr", "4K randread IOPS", lambda v: f"{v:.0f}"), ("rw", "4K randwrite IOPS", lambda v: f"{v:.0f}"),
            ("sync", "4K write+fdatasync p50 µs", lambda v: f"{v:.0f}"),
            ("create", "creates/s", lambda v: f"{v:.0f}"), ("stat", "stats/s", lambda v: f"{v:.0f}"),
            ("unlink", "unlinks/s", lambda v: f"{v:.0f}")]
    lines = ["| path | " + " | ".join(c[1] for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    for label, key in [("raw file system (ceiling)", "raw")] + [(f"striped, {n} server(s), client c1", n) for n in servers]:
        r = results[key]
        lines.append(f"| {label} | " + " | ".join(fmt(r[k]) for k, _, fmt in cols) + " |")
    gluster = results.get("gluster")
    if gluster:
        lines.append(f"| GlusterFS, distributed volume, {max(servers)} bricks, client c1 | " +
                     " | ".join(fmt(gluster[k]) for k, _, fmt in cols) + " |")
    uncapped = "\n".join(lines)
    versus = ""
    if gluster and max(servers) in results:
        ours = results[max(servers)]
        def ratio(k, lower_is_better=False):
            return (gluster[k] / ours[k]) if lower_is_better else (ours[k] / gluster[k])
        versus = (f"Against GlusterFS on the same {max(servers)} hosts and file system (Spillway ÷ GlusterFS; for the "
                  f"fdatasync latency Spillway's p50 ÷ GlusterFS's): 1 MiB sequential write, 4 streams "
                  f"{ratio('w4'):.2f}×, read {ratio('r4'):.2f}×; 4 KiB random read {ratio('rr'):.2f}×, write "
                  f"{ratio('rw'):.2f}×; creates {ratio('create'):.2f}×; fdatasync p50 "
                  f"{ours['sync'] / gluster['sync']:.2f}×. GlusterFS runs with Debian's defaults, under which it "
                  "ignores O_DIRECT (performance.strict-o-direct off) and caches attributes on the client "
                  "(md-cache): its random reads and stats are served from its caches.\n\n")
    co = results.get("colocated")
    colocated = ""
    if co:
        raw = results["raw"]
        colocated = (f"Co-located (a one-server instance used on its own storage node, one stream, 1 MiB, "
                     f"fragments as agent.fragment_filesystem = {a.fragment_fs}): write "
                     f"{mb(co['w1'])} MB/s ({co['w1'] / raw['w1']:.2f} of raw), read {mb(co['r1'])} MB/s "
                     f"({co['r1'] / raw['r1']:.2f} of raw).\n\n")
        rx = results.get("rawxfs")
        if rx:
            colocated += (f"Raw XFS on a loop device (as the agent makes a fragment's): write {mb(rx['w1'])} MB/s, read "
                          f"{mb(rx['r1'])} MB/s; the co-located mount gets {co['w1'] / rx['w1']:.2f} of its writes and "
                          f"{co['r1'] / rx['r1']:.2f} of its reads.\n\n")
    print("\n" + scaling + "\n\n" + uncapped + "\n\n" + versus + colocated)
    if a.no_write:
        return
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    # Each fragment mode has a section of its own (--fragment-fs xfs-loop: the co-located path
    # through the kernel), so that a run of one never overwrites the other's figures.
    section, title = "striped", "Striped instances: scaling with storage nodes"
    if a.fragment_fs != "directory":
        section = f"striped-{a.fragment_fs}"
        title += f", fragments as agent.fragment_filesystem = {a.fragment_fs}"
    if a.write_window_multiplier is not None:
        section += f"-window{a.write_window_multiplier}"
        title += f", [limits] write_window_multiplier = {a.write_window_multiplier}"
    write_section(section, (
        f"## {title}\n\n"
        f"Measured {when} on {os.cpu_count()} cores, Linux {platform.release()}, with "
        f"`sudo python3 bench/striped_bench.py {' '.join(sys.argv[1:])}` (fio {sh('fio', '--version').stdout.strip()}, as an ordinary user on "
        f"compute node c1 (and c2), each host a network namespace; a job instance of 1, 2 and 4 GiB on 1 GiB grains, "
        f"so on 1, 2 and 4 storage nodes; 8 MiB stripes; {a.size_mib} MiB per sequential run, no preallocation, "
        f"writes fsynced at the end, reads after dropping the page cache; one run each).\n\n"
        f"**Scaling**: every storage node's link capped at {a.cap_mbit} Mbit/s each way (tc tbf); in brackets "
        f"the ratio to one server; the last column is the share of the machine's 2 cores busy during the runs "
        f"(clients, servers and fio share them: near 100 %, the CPU and not the links bounds the run).\n\n{scaling}\n\n"
        f"**Uncapped**, against the raw file system under the storage nodes (the ceiling):\n\n{uncapped}\n\n"
        f"{versus}{colocated}"
        "All storage nodes share this VM's one disk and its 2 cores with the client: uncapped, the figures measure "
        "CPU (FUSE, TCP, servers) more than disks; the capped runs show what striping over servers buys when each "
        "server's link is the limit, as on a real machine.\n"))


if __name__ == "__main__":
    main()
