#!/usr/bin/env python3
"""Metadata and small I/O: the IO500 workloads (IOR and mdtest) on striped and private instances,
GlusterFS on the same bricks, and the raw directory, in one run (issue 21's benchmark).

Prints the figures and writes them into BENCHMARKS.md between <!-- metadata:begin --> and
<!-- metadata:end -->. The cluster is bench/striped_bench.py's (a controller, storage nodes
s1-s4 and compute nodes c1, c2, each a network namespace; GlusterFS's glusterd and bricks on
the same storage hosts and file system), and every workload runs as the ordinary user on
compute node c1, with 4 MPI ranks (Debian's Open MPI: mpirun --oversubscribe -np 4):

  * mdtest-easy   mdtest -n 1000 -u -F -L -N 1       per-rank directories, empty files
  * mdtest-hard   mdtest -n 500 -F -N 1 -w 3901 -e 3901   one shared directory, 3901-byte files
      each as four runs, one per phase (-C create, -T stat, -E read, -r remove), so that
      each phase's CPU and requests are its own;
  * ior-hard      ior -a POSIX -t 47008 -b 47008 -s 1500 -C -Q 1 -g -e   one shared file
  * ior-easy      ior -a POSIX -t 1m -b 128m -F -C -Q 1 -g -e            a file per rank
      each as a write run (-w -k) then a read run (-r), with no cache drop between (as IO500);
  * fio (bench/striped_bench.py's jobs, one process): 4 KiB random read and write (libaio,
    O_DIRECT, iodepth 32, after a cache drop) and the p50 of a 4 KiB write + fdatasync.

against (all set up at the start, measured in turns in each repetition):

  raw        the raw directory on the storage nodes' file system (the ceiling), in the
             machine's own namespaces
  s1, s1cc   a striped instance on 1 storage node (1 GiB), default and
             #DW jobdw access_mode=striped(client_cache)
  s4, s4cc   the same over 4 storage nodes (4 GiB, striped over all four)
  p4         access_mode=private over 4 storage nodes
  gluster    GlusterFS distribute over the same 4 storage hosts' bricks
  fuse       the raw directory mounted again through go-fuse's loopback file system
             (bench/fusefloor: names and attributes cached 10 s, no network, no server, every
             read and write a FUSE round trip, no passthrough): the floor of any go-fuse
             client on this machine, the kernel's FUSE round trips and the daemon's work alone

Each figure is the median of --repeat repetitions, with its ratio to raw and to GlusterFS, and
beside it the CPU per operation (per MiB for IOR): client + server, read from the cgroup CPU
accounting (cgroup v2 cpu.stat, else v1 cpuacct) of cgroups made for the run: the workload
(mpirun, mdtest/ior or fio), the client daemon (c1's agent, or the glusterfs FUSE process)
and the servers (s1-s4's agents, or glusterd and its bricks); the CPU of starting mpirun and
4 ranks (measured in the run: an mdtest of one file per rank) is subtracted from each MPI
run. For the Spillway targets the storage agents' spillway_warpfs_requests_total counters
(their /metrics) give the requests each operation costs.

hpc/ior is in no package registry: --ior-src DIR names a source tree of
https://github.com/hpc/ior (e.g. a git clone), which is built once with autotools
(./bootstrap && ./configure && make; needs Debian's openmpi-bin, libopenmpi-dev, autoconf,
automake, libtool, pkg-config: scripts/install-deps --bench) into --cache
(default /var/tmp/spillway-bench-cache/ior-<hash of the tree>), reused while the tree is
unchanged. The repository holds no copy of IOR. Without --ior-src the figures come from fio
instead, labelled so: the metadata phases with fio's filecreate, filestat and filedelete
engines and 3901-byte psync writes and reads (4 jobs, per-job directories for -easy, one
directory for -hard; there is no 0-byte read, so -easy has no read phase), ior-hard as 4 fio
jobs writing and reading 47008-byte blocks interleaved in one file (rw=write:141024,
offset_increment=47008), ior-easy as 4 jobs with 1 MiB blocks on a file each.

Usage: sudo python3 bench/metadata_bench.py [--ior-src DIR] [--repeat 3] [--binary bin/spillway]
                                            [--targets raw,s1,s1cc,s4,s4cc,p4,gluster]
                                            [--easy-files 1000] [--hard-files 500]
                                            [--segments 1500] [--easy-mib 128] [--runtime 5]
                                            [--ranks 4] [--cache DIR] [--dir DIR] [--no-write]
Needs root, iproute2, util-linux (nsenter, setpriv), fio, glusterfs-server and
glusterfs-client (unless --targets leaves gluster out), Open MPI with --ior-src, and a built
binary. Takes /tmp/spillway-netns.lock as the e2e tests do. A full run (3 repetitions) lasts
about 25 minutes on 2 cores.
"""
import argparse
import datetime
import fcntl
import hashlib
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
from striped_bench import COMPUTE, STORAGE, Bench, Gluster, end_job, job_instance
from warpfs_bench import NOBODY, ROOT, Cluster, drop_caches, sh

# key, label, the #DW jobdw options (None: not a Spillway instance)
TARGETS = [
    ("raw", "raw directory (ceiling)", None),
    ("s1", "striped, 1 server", "access_mode=striped capacity=1GiB"),
    ("s1cc", "striped(client_cache), 1 server", "access_mode=striped(client_cache) capacity=1GiB"),
    ("s4", "striped, 4 servers", "access_mode=striped capacity=4GiB"),
    ("s4cc", "striped(client_cache), 4 servers", "access_mode=striped(client_cache) capacity=4GiB"),
    ("p4", "private, 4 servers", "access_mode=private capacity=4GiB"),
    ("gluster", "GlusterFS distribute, 4 bricks", None),
    ("fuse", "go-fuse loopback of the raw directory (FUSE's floor)", None),
]
LABEL = {k: label for k, label, _ in TARGETS}
REQUESTS = r'spillway_warpfs_requests_total\{op="([^"]+)",transport="remote"\}'

# The CPU groups: what each target's CPU is the sum of (the workload's own is always counted).
GROUPS = ("workload", "spillway-client", "spillway-server", "gluster-client", "gluster-server", "fuse-client", "other")
DAEMONS = {"raw": ((), ()), "gluster": (("gluster-client",), ("gluster-server",)), "fuse": (("fuse-client",), ())}
SPILLWAY_DAEMONS = (("spillway-client",), ("spillway-server",))


class CpuGroups:
    """One cgroup per name under a cgroup made for the run, for their CPU time: the cgroup v2
    cpu.stat's usage_usec (a unified hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified,
    where the base CPU statistics need no controller), else cgroup v1's cpuacct.usage. Both
    count the time of processes that have exited, which /proc/<pid>/stat would lose."""

    def __init__(self, names):
        tag = f"spillway-bench-{os.getpid()}"
        if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            self.base, self.v2 = "/sys/fs/cgroup", True
        elif os.path.exists("/sys/fs/cgroup/unified/cgroup.controllers"):
            self.base, self.v2 = "/sys/fs/cgroup/unified", True
        elif os.path.exists("/sys/fs/cgroup/cpuacct/cpuacct.usage"):
            self.base, self.v2 = "/sys/fs/cgroup/cpuacct", False
        else:
            sys.exit("no cgroup CPU accounting (cgroup v2 cpu.stat or v1 cpuacct) to count the CPU per operation")
        self.root = os.path.join(self.base, tag)
        self.names = names
        for n in names:
            os.makedirs(os.path.join(self.root, n))

    def procs(self, name):
        return os.path.join(self.root, name, "cgroup.procs")

    def usage(self):
        """Seconds of CPU (user + system) of each group so far."""
        out = {}
        for n in self.names:
            if self.v2:
                with open(os.path.join(self.root, n, "cpu.stat")) as f:
                    usec = next(int(line.split()[1]) for line in f if line.startswith("usage_usec "))
                out[n] = usec / 1e6
            else:
                with open(os.path.join(self.root, n, "cpuacct.usage")) as f:
                    out[n] = int(f.read()) / 1e9
        return out

    def close(self):
        """Moves what is left (a process that outlived the run) back to the top and removes the groups."""
        for n in self.names:
            d = os.path.join(self.root, n)
            try:
                for pid in open(os.path.join(d, "cgroup.procs")).read().split():
                    try:
                        with open(os.path.join(self.base, "cgroup.procs"), "w") as f:
                            f.write(pid)
                    except OSError:
                        pass
                os.rmdir(d)
            except OSError:
                pass
        try:
            os.rmdir(self.root)
        except OSError:
            pass


def build_ior(src, cache):
    """Builds IOR and mdtest from the source tree src (autotools) into a directory of cache
    named by a hash of the tree (paths, sizes, times), unless already there; returns the
    directory of the binaries and the version mdtest reports."""
    src = os.path.abspath(src)
    if not os.path.isfile(os.path.join(src, "configure.ac")) or not os.path.isdir(os.path.join(src, "src")):
        sys.exit(f"--ior-src {src}: not a source tree of github.com/hpc/ior (no configure.ac and src/)")
    h = hashlib.sha256()
    for d, dirs, files in os.walk(src):
        dirs[:] = sorted(x for x in dirs if x != ".git")
        for name in sorted(files):
            p = os.path.join(d, name)
            st = os.lstat(p)
            h.update(f"{os.path.relpath(p, src)}\0{st.st_size}\0{int(st.st_mtime)}\n".encode())
    for ref in ("HEAD",):  # a git tree: its commit too (what the report names)
        r = subprocess.run(["git", "-C", src, "rev-parse", ref], capture_output=True, text=True)
        commit = r.stdout.strip() if r.returncode == 0 else ""
        h.update(commit.encode())
    dest = os.path.join(os.path.abspath(cache), "ior-" + h.hexdigest()[:16])
    bindir = os.path.join(dest, "bin")
    if not (os.path.exists(os.path.join(bindir, "ior")) and os.path.exists(os.path.join(bindir, "mdtest"))):
        for tool in ("mpicc", "autoreconf", "automake", "libtoolize", "pkg-config", "make"):
            if not shutil.which(tool):
                sys.exit(f"{tool} not found: building IOR needs openmpi-bin, libopenmpi-dev, autoconf, automake, "
                         "libtool, pkg-config and make (scripts/install-deps --bench)")
        build = dest + ".build"
        shutil.rmtree(build, ignore_errors=True)
        os.makedirs(os.path.dirname(build), exist_ok=True)
        shutil.copytree(src, build, symlinks=True)
        log = dest + ".log"
        print(f"building IOR from {src} into {dest} (log: {log}) …", flush=True)
        with open(log, "w") as f:
            for step in (["./bootstrap"], ["./configure", f"--prefix={dest}"], ["make", f"-j{os.cpu_count()}"],
                         ["make", "install"]):
                if subprocess.run(["nice"] + step, cwd=build, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                    sys.exit(f"building IOR: {' '.join(step)} failed; see {log}")
        shutil.rmtree(build, ignore_errors=True)
        os.chmod(os.path.abspath(cache), 0o755)
    version = "IOR " + (commit[:12] if commit else os.path.basename(dest))
    return bindir, version


class XfsScratch:
    """An XFS on a loop device (direct I/O) over a sparse file under /var/tmp, mounted for the run."""

    def __init__(self, gib):
        if not shutil.which("mkfs.xfs"):
            sys.exit("mkfs.xfs not found: apt-get install xfsprogs (or leave out --xfs)")
        self.base = tempfile.mkdtemp(prefix="spillway-metadata-xfs-", dir="/var/tmp")
        os.chmod(self.base, 0o755)  # the workloads run as an ordinary user
        self.img, self.mnt = os.path.join(self.base, "scratch.img"), os.path.join(self.base, "mnt")
        os.makedirs(self.mnt)
        with open(self.img, "w") as f:
            f.truncate(gib << 30)
        sh("mkfs.xfs", "-q", "-K", "-m", "reflink=0", self.img)
        self.dev = sh("losetup", "--find", "--show", "--direct-io=on", self.img).stdout.strip()
        sh("mount", self.dev, self.mnt)

    def close(self, keep=False):
        if keep:  # a failed run: its logs stay for a look
            print(f"the XFS scratch stays mounted at {self.mnt} ({self.dev}) for a look", flush=True)
            return
        if sh("umount", self.mnt, check=False).returncode != 0:
            time.sleep(2)
            sh("umount", "-l", self.mnt, check=False)
        sh("losetup", "-d", self.dev, check=False)
        shutil.rmtree(self.base, ignore_errors=True)


def fs_type(path):
    r = sh("stat", "-f", "-c", "%T", path, check=False)
    return r.stdout.strip() or "unknown"


def slab_drops():
    """How many times the kernel's dentry and inode caches were dropped (drop_caches) since boot:
    a phase during which another process dropped them finds no cached names."""
    try:
        with open("/proc/vmstat") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("drop_slab ")), 0)
    except OSError:
        return 0


def start_fuse_floor(c, host, raw, mountpoint, cgroup_procs):
    """Builds bench/fusefloor and mounts raw again at mountpoint through it, in host's mount
    namespace (its process in the cgroup whose cgroup.procs is cgroup_procs); returns the
    process."""
    here = os.path.dirname(os.path.abspath(__file__))
    exe = os.path.join(tempfile.mkdtemp(prefix="fusefloor-"), "fusefloor")
    r = sh("go", "build", "-o", exe, "./bench/fusefloor", check=False, cwd=os.path.dirname(here))
    if r.returncode != 0:
        sys.exit(f"building bench/fusefloor failed: {r.stdout}{r.stderr}")
    os.makedirs(mountpoint, exist_ok=True)
    p = subprocess.Popen(["nsenter", "-t", str(c.procs[host].pid), "-m", "--", exe, raw, mountpoint],
                         stdout=subprocess.PIPE, text=True)
    with open(cgroup_procs, "w") as f:
        f.write(str(p.pid))
    if p.stdout.readline().strip() != "mounted":
        p.kill()
        sys.exit("bench/fusefloor did not mount")
    return p


class Run:
    """The workloads on one target, each phase measured: its figure, the CPU of the groups
    that serve the target, and (Spillway) the storage agents' requests by operation."""

    def __init__(self, a, c, b, groups, mpi_base, bindir):
        self.a, self.c, self.b, self.groups = a, c, b, groups
        self.mpi_base, self.bindir = mpi_base, bindir
        self.failures = []

    def host(self, target):
        return None if target == "raw" else "c1"

    def measure(self, target, phase, fn, mpi=False):
        """Runs fn (returns (figure, units of work) or None on failure), with the CPU of the
        target's groups and its requests; returns a record, or None."""
        spill = target not in DAEMONS
        req0 = self.c.metrics(STORAGE, REQUESTS) if spill else {}
        u0 = self.groups.usage()
        drops0 = slab_drops()
        started = time.time()
        out = fn()
        seconds = time.time() - started
        drops = slab_drops() - drops0
        u1 = self.groups.usage()
        req1 = self.c.metrics(STORAGE, REQUESTS) if spill else {}
        if out is None:
            return None
        figure, units = out
        clients, servers = SPILLWAY_DAEMONS if spill else DAEMONS[target]
        work = u1["workload"] - u0["workload"]
        if mpi:
            work = max(0.0, work - self.mpi_base)
        client = work + sum(u1[g] - u0[g] for g in clients)
        server = sum(u1[g] - u0[g] for g in servers)
        requests = {k[0]: req1.get(k, 0) - req0.get(k, 0) for k in req1}
        return {"value": figure, "units": units, "client": client, "server": server, "started": started,
                "seconds": seconds, "caches_dropped": drops, "requests": {k: v for k, v in requests.items() if v}}

    def shell(self, target, script, what):
        """Runs script as the user in the workload's cgroup; returns its output, or None (recorded) on failure."""
        r = self.b.run(self.host(target), script)
        if r.returncode != 0:
            return self.fail(target, f"{what} (exit {r.returncode})", r.stdout + r.stderr)
        return r.stdout

    def fail(self, target, what, output):
        """Records a failed run (left out of the medians, listed in the report); returns None."""
        msg = f"{LABEL[target]}: {what}: " + " ".join(output.strip()[-600:].split())
        print("FAILED " + msg, flush=True)
        self.failures.append(msg)
        return None

    def mpirun(self, target, cmd, what):
        return self.shell(target, f"cd /tmp && HOME=/tmp {mpirun_prefix(self.a.ranks)} {self.bindir}/{cmd}", what)

    def all(self, target, directory):
        """Every workload on directory (a fresh one inside the target); {phase: record or None}."""
        a, out = self.a, {}
        n = a.ranks
        if self.bindir:
            easy = f"mdtest -n {a.easy_files} -u -F -L -N 1 -d {directory}/mdt-easy"
            hard = f"mdtest -n {a.hard_files} -F -N 1 -w 3901 -e 3901 -d {directory}/mdt-hard"
            for prefix, base, files in (("easy", easy, a.easy_files), ("hard", hard, a.hard_files)):
                if f"mdtest-{prefix}" not in a.workloads:
                    continue
                for phase, flag in (("create", "-C"), ("stat", "-T"), ("read", "-E"), ("remove", "-r")):
                    def one(base=base, flag=flag, files=files, what=f"mdtest-{prefix} {phase}"):
                        o = self.mpirun(target, f"{base} {flag}", what)
                        rate = parse_mdtest(o, phase) if o is not None else None
                        if o is not None and rate is None:
                            return self.fail(target, f"{what}: no rate in mdtest's output", o)
                        return None if rate is None else (rate, files * n)
                    out[f"{prefix}_{phase}"] = self.measure(target, f"{prefix}_{phase}", one, mpi=True)
            seg = a.segments
            hard = f"ior -a POSIX -t 47008 -b 47008 -s {seg} -C -Q 1 -g -e -o {directory}/ior-hard/file"
            easy = f"ior -a POSIX -t 1m -b {a.easy_mib}m -F -C -Q 1 -g -e -o {directory}/ior-easy/file"
            self.shell(target, f"mkdir -p {directory}/ior-hard {directory}/ior-easy", "mkdir")
            for prefix, base, mib in (("iorhard", hard, n * seg * 47008 / 2**20), ("ioreasy", easy, n * a.easy_mib)):
                if prefix.replace("ior", "ior-") not in a.workloads:
                    continue
                # ior-easy's files are read a second time by the same node: what its page cache
                # keeps across opens (another node's writes would be seen: the mounts' leases).
                phases = ((("write", "-w -k"), ("read", "-r -k"), ("reread", "-r")) if prefix == "ioreasy"
                          else (("write", "-w -k"), ("read", "-r")))
                for phase, flags in phases:
                    def one(base=base, flags=flags, mib=mib, phase=phase, what=f"{prefix} {phase}"):
                        o = self.mpirun(target, f"{base} {flags}", what)
                        rate = parse_ior(o, "read" if phase == "reread" else phase) if o is not None else None
                        if o is not None and rate is None:
                            return self.fail(target, f"{what}: no rate in IOR's output", o)
                        return None if rate is None else (rate, mib)
                    out[f"{prefix}_{phase}"] = self.measure(target, f"{prefix}_{phase}", one, mpi=True)
        else:
            self.fio_fallback(target, directory, out)
        host = self.host(target)

        def fio_measure(name, run):
            rec = self.measure(target, name, lambda: (0, run()))
            out[name] = rec
            return rec["units"]
        if "random" in a.workloads:
            rr, rw = self.b.random(host, directory, measure=fio_measure)
            out["randread"].update(value=rr, units=out["randread"]["units"]["jobs"][0]["read"]["total_ios"])
            out["randwrite"].update(value=rw, units=out["randwrite"]["units"]["jobs"][0]["write"]["total_ios"])
        if "sync" in a.workloads:
            p50 = self.b.fdatasync_p50(host, directory, measure=fio_measure)
            out["sync"].update(value=p50, units=out["sync"]["units"]["jobs"][0]["write"]["total_ios"])
        return out

    def fio_fallback(self, target, directory, out):
        """The same phases with fio (no IOR tree given)."""
        a, n = self.a, self.a.ranks
        common = "--output-format=json --group_reporting --fallocate=none --openfiles=1"

        def fio(args, what, op="read"):
            o = self.shell(target, f"fio {common} {args}", what)
            if o is None:
                return None
            j = json.loads(o[o.index("{"):])["jobs"][0]
            if not j[op]["total_ios"] or not j[op]["iops"]:
                # fio times in milliseconds: a phase faster than that has no rate
                return self.fail(target, f"{what}: fio counted {j[op]['total_ios']} operations in "
                                         f"{j['job_runtime']} ms", "")
            return j[op]

        ranks = " ".join(f"--name=r{r} --directory={directory}/easy/r{r}" for r in range(n))
        self.shell(target, f"mkdir -p {directory}/hard " + " ".join(f"{directory}/easy/r{r}" for r in range(n)), "mkdir")
        easy = f"--nrfiles={a.easy_files} --filesize=4k"
        for phase, engine in (("create", "filecreate"), ("stat", "filestat"), ("remove", "filedelete")):
            def one(engine=engine, phase=phase):
                j = fio(f"--ioengine={engine} {easy} {ranks}", f"fio-easy {phase}")
                return None if j is None else (j["iops"], j["total_ios"])
            out[f"easy_{phase}"] = self.measure(target, f"easy_{phase}", one)
        # bs = filesize: one operation per file (with a larger block fio counts none)
        hard = (f"--directory={directory}/hard --name=hard --numjobs={n} --nrfiles={a.hard_files} --filesize=3901 "
                "--bs=3901")
        for phase, args, op in (("create", "--ioengine=psync --rw=write", "write"),
                                ("stat", "--ioengine=filestat", "read"),
                                ("read", "--ioengine=psync --rw=read", "read"),
                                ("remove", "--ioengine=filedelete", "read")):
            def one(args=args, op=op, phase=phase):
                j = fio(f"{args} {hard}", f"fio-hard {phase}", op)
                return None if j is None else (j["iops"], j["total_ios"])
            out[f"hard_{phase}"] = self.measure(target, f"hard_{phase}", one)
        seg = a.segments
        shared = (f"--filename={directory}/iorhard --name=iorhard --numjobs={n} --ioengine=psync --bs=47008 "
                  f"--offset_increment=47008 --size={seg * n * 47008} --io_size={seg * 47008}")
        perfile = f"--directory={directory} --name=ioreasy --numjobs={n} --ioengine=psync --bs=1M --size={a.easy_mib}M"
        for prefix, base, hole in (("iorhard", shared, f":{(n - 1) * 47008}"), ("ioreasy", perfile, "")):
            for phase in ("write", "read") + (("reread",) if prefix == "ioreasy" else ()):
                def one(base=base, phase=phase, hole=hole, prefix=prefix):
                    # fio drops the page cache before it reads (invalidate=1), as IOR does not:
                    # the second read keeps it, as IOR's would
                    extra = {"write": "--end_fsync=1", "reread": "--invalidate=0"}.get(phase, "")
                    rw = "read" if phase == "reread" else phase
                    j = fio(f"{base} --rw={rw}{hole} {extra}", f"fio {prefix} {phase}", rw)
                    return None if j is None else (j["bw_bytes"] / 2**20, j["io_bytes"] / 2**20)
                out[f"{prefix}_{phase}"] = self.measure(target, f"{prefix}_{phase}", one)
        self.shell(target, f"rm -rf {directory}/iorhard {directory}/ioreasy.* {directory}/easy {directory}/hard", "rm")


def mpirun_prefix(ranks):
    # --bind-to none: 4 ranks share 2 cores with the servers, the scheduler places them; the
    # vader BTL's single-copy (CMA) is refused between processes of an ordinary user in
    # some sandboxes, and small MPI messages do not need it.
    return (f"mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none "
            f"-np {ranks}")


def parse_mdtest(out, phase):
    name = {"create": "File creation", "stat": "File stat", "read": "File read", "remove": "File removal"}[phase]
    m = re.search(r"^\s*" + name + r"\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)", out, re.M)
    return float(m.group(3)) if m else None  # the mean (one iteration: max = min = mean)


def parse_ior(out, phase):
    """MiB/s: "Max Write: N MiB/sec" (older IOR), else the Max(MiB) column of the summary table."""
    m = re.search(r"^Max " + phase.capitalize() + r":\s+([0-9.]+) MiB/sec", out, re.M)
    if not m and "Summary of all tests" in out:
        m = re.search(r"^" + phase + r"\s+([0-9.]+)\s", out.split("Summary of all tests", 1)[1], re.M)
    return float(m.group(1)) if m else None


# The workloads a run may be limited to (--workloads).
WORKLOADS = ["mdtest-easy", "mdtest-hard", "ior-hard", "ior-easy", "random", "sync"]


def workload_of(key):
    """The workload (WORKLOADS) a row's key belongs to."""
    if key in ("randread", "randwrite"):
        return "random"
    prefix = key.split("_")[0]
    return {"easy": "mdtest-easy", "hard": "mdtest-hard", "iorhard": "ior-hard", "ioreasy": "ior-easy"}.get(prefix, prefix)


# The rows of the report: key, label, unit of the figure, unit of the CPU column, higher is better
def rows(ior):
    r = []
    for prefix, what in (("easy", "mdtest-easy" if ior else "mdtest-easy-like (fio filecreate/filestat/filedelete, 4 jobs)"),
                         ("hard", "mdtest-hard (3901 B)" if ior else "mdtest-hard-like (fio, 3901 B, 4 jobs one dir)")):
        for phase in ("create", "stat", "read", "remove"):
            if prefix == "easy" and phase == "read" and not ior:
                continue
            r.append((f"{prefix}_{phase}", f"{what} {phase}, ops/s", "µs", True))
    for prefix, what in (("iorhard", "ior-hard" if ior else "ior-hard-like (fio, 47008 B, 4 jobs one file)"),
                         ("ioreasy", "ior-easy" if ior else "ior-easy-like (fio, 1 MiB, 4 jobs a file each)")):
        for phase in ("write", "read"):
            r.append((f"{prefix}_{phase}", f"{what} {phase}, MiB/s", "ms/MiB", True))
    r.append(("ioreasy_reread", ("ior-easy" if ior else "ior-easy-like") + " read again on the same node, MiB/s",
              "ms/MiB", True))
    r += [("randread", "fio 4 KiB random read, IOPS", "µs", True),
          ("randwrite", "fio 4 KiB random write, IOPS", "µs", True),
          ("sync", "fio 4 KiB write + fdatasync p50, µs", "µs", False)]
    return r


# Issue 21's targets: (phase, against GlusterFS (×, or at most × for a latency), against raw
# (None: none)), for striped over 4 servers in its default mode.
GOALS = [("easy_create", 4, None), ("easy_stat", 10, 0.25), ("easy_read", 10, 0.25), ("easy_remove", 4, None),
         ("hard_create", 3, None), ("hard_stat", 10, None), ("randread", 3, 0.4), ("sync", 0.6, None),
         ("iorhard_write", 3, None), ("iorhard_read", 3, None)]


def targets_summary(med):
    """Issue 21's targets against this run: s4 ÷ GlusterFS (and ÷ raw where the target names it),
    met or not, and what the FUSE floor (the fuse target) reaches against GlusterFS: a target
    above it cannot be met by any go-fuse client on this machine."""
    s4, g, raw, floor = (med.get(t, {}) for t in ("s4", "gluster", "raw", "fuse"))
    out = []
    for key, vs_g, vs_raw in GOALS:
        if key not in s4 or key not in g or not g[key]["value"]:
            continue
        latency = key == "sync"
        r = s4[key]["value"] / g[key]["value"]
        met = r <= vs_g if latency else r >= vs_g
        text = f"{key.replace('_', ' ')} {r:.2f}× G (target {'≤' if latency else '≥'} {vs_g}×"
        if vs_raw and key in raw and raw[key]["value"]:
            rr = s4[key]["value"] / raw[key]["value"]
            met = met and rr >= vs_raw
            text += f", and ≥ {vs_raw}× raw: {rr:.2f}×"
        text += ")"
        if key in floor and floor[key]["value"]:
            fr = floor[key]["value"] / g[key]["value"]
            text += f", FUSE floor {fr:.2f}× G, s4 at {s4[key]['value'] / floor[key]['value']:.2f}× the floor"
        out.append(("met: " if met else "missed: ") + text)
    if not out:
        return ""
    return ("Issue 21's targets (striped over 4 servers, default mode, against GlusterFS on the same bricks; the FUSE "
            "floor is the fuse target's figure against GlusterFS's):\n\n" + "".join(f"- {line}\n" for line in out))


def request_cell(requests, per=1):
    """The requests of one operation ({op: requests per unit}, times per): the total, then by operation."""
    ops = sorted(((v * per, op) for op, v in requests.items() if v * per >= 0.05), reverse=True)
    return f"**{sum(requests.values()) * per:.1f}**<br>" + ", ".join(f"{v:.1f} {op.upper()}" for v, op in ops)


def num(v):
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"), help="the spillway binary (scripts/install-deps builds it)")
    ap.add_argument("--ior-src", default=None, help="a source tree of github.com/hpc/ior to build IOR and mdtest from "
                    "(without it: fio's engines, labelled so)")
    ap.add_argument("--cache", default="/var/tmp/spillway-bench-cache", help="where IOR is built and kept")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions (the figures are their medians)")
    ap.add_argument("--targets", default=",".join(k for k, _, _ in TARGETS),
                    help="what to measure, comma-separated (the ratios need raw and gluster)")
    ap.add_argument("--ranks", type=int, default=4, help="MPI ranks (fio jobs) on compute node c1")
    ap.add_argument("--easy-files", type=int, default=1000, help="mdtest-easy's -n (files per rank)")
    ap.add_argument("--hard-files", type=int, default=500, help="mdtest-hard's -n (files per rank)")
    ap.add_argument("--segments", type=int, default=1500, help="ior-hard's -s (47008-byte blocks per rank)")
    ap.add_argument("--easy-mib", type=int, default=128, help="ior-easy's -b in MiB (per rank; the 1-server "
                    "instances hold 1 GiB)")
    ap.add_argument("--runtime", type=int, default=5, help="seconds of each fio random-I/O run")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one under /var/tmp)")
    ap.add_argument("--xfs", type=int, default=0, metavar="GIB",
                    help="run everything (raw directory, bricks, storage agents) on an XFS of GIB GiB made for the "
                         "run on a sparse file (loop device, direct I/O), as a burst-buffer node's NVMe would be "
                         "formatted: the root file system here is ext4 without a journal, whose create scans "
                         "recently deleted inodes (a create costs 60-700 µs depending on the last 30 s's deletes)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help="which workloads to run, comma-separated (" + ", ".join(WORKLOADS) + "); a partial run "
                         "prints its figures and does not update BENCHMARKS.md")
    ap.add_argument("--fragment-fs", choices=("directory", "xfs-loop"), default="directory",
                    help="the storage nodes' agent.fragment_filesystem: xfs-loop makes every fragment an XFS of "
                         "its own (its own journal, as a node's own SSD has), on a loop device over a sparse file")
    ap.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    ap.add_argument("--json", default=None, help="also write every repetition's records (figure, units, CPU, requests "
                    "by operation) to this file")
    a = ap.parse_args()
    a.size_mib = 256  # striped_bench's Bench: the random-I/O file
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    a.workloads = [w for w in a.workloads.split(",") if w]
    for w in a.workloads:
        if w not in WORKLOADS:
            sys.exit(f"--workloads: unknown {w} (known: {', '.join(WORKLOADS)})")
    if set(a.workloads) != set(WORKLOADS):
        a.no_write = True  # BENCHMARKS.md's table holds whole runs only
    targets = [t for t in a.targets.split(",") if t]
    for t in targets:
        if t not in LABEL:
            sys.exit(f"--targets: unknown {t} (known: {', '.join(LABEL)})")
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark creates network namespaces and cgroups and drops the page cache")
    need = ["ip", "nsenter", "setpriv", "fio"] + (["glusterd"] if "gluster" in targets else []) + \
        (["mpirun"] if a.ior_src else [])
    for tool in need:
        if not shutil.which(tool):
            sys.exit(f"{tool} not found (scripts/install-deps --bench installs what the benchmarks need)")
    binary = os.path.abspath(a.binary)
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary} not found: run scripts/install-deps first")
    bindir, tool = None, f"fio {sh('fio', '--version').stdout.strip()}"
    if a.ior_src:
        bindir, version = build_ior(a.ior_src, a.cache)
        mpi = sh("mpirun", "--version").stdout.splitlines()[0]
        tool = f"{version} (mdtest, ior), {mpi}, {tool}"
    lock = open("/tmp/spillway-netns.lock", "w")
    print("waiting for /tmp/spillway-netns.lock …", flush=True)
    fcntl.flock(lock, fcntl.LOCK_EX)
    load0 = os.getloadavg()
    started = time.time()
    xfs = None
    if a.xfs:
        if a.dir:
            sys.exit("--xfs makes its own scratch directory: leave out --dir")
        xfs = XfsScratch(a.xfs)
        work = xfs.mnt
    else:
        work = a.dir or tempfile.mkdtemp(prefix="spillway-metadata-bench-", dir="/var/tmp")
    os.chmod(work, 0o755)
    fs_note = (f"an XFS of {a.xfs} GiB on a loop device (direct I/O) over a sparse file, made for the run" if xfs
               else f"the scratch directory's file system ({fs_type(work)})")
    if a.fragment_fs == "xfs-loop":
        fs_note += " (the storage nodes' fragments each an XFS of its own on a loop device: agent.fragment_filesystem = xfs-loop)"
    raw = os.path.join(work, "raw")
    os.makedirs(raw)
    os.chown(raw, NOBODY, NOBODY)
    groups = CpuGroups(GROUPS)
    c = Cluster(binary, work, storage=STORAGE, compute=COMPUTE)
    b = Bench(c, a, work)
    g, gmnt = None, os.path.join(work, "gluster-mount")
    floor = None
    mounts = {"raw": raw}
    results = {t: [] for t in targets}
    failures = []
    try:
        c.netns()
        c.configs(capacity_gib=8, metrics=True, storage_extra=f'fragment_filesystem = "{a.fragment_fs}"\n')
        for name in ("ctl",) + STORAGE + COMPUTE:
            c.start(name, groups.procs({"c1": "spillway-client"}.get(name, "spillway-server" if name in STORAGE
                                                                     else "other")))
        for i, (key, _, directive) in enumerate(TARGETS):
            if key in targets and directive:
                print(f"instance {key}: #DW jobdw type=scratch {directive} …", flush=True)
                mounts[key] = job_instance(c, work, str(200 + i), f"jobdw type=scratch {directive}")
        if "fuse" in targets:
            print("go-fuse loopback of the raw directory …", flush=True)
            floor = start_fuse_floor(c, "c1", raw, os.path.join(work, "fuse-mount"), groups.procs("fuse-client"))
            mounts["fuse"] = os.path.join(work, "fuse-mount")
        if "gluster" in targets:
            print("GlusterFS, 4 bricks …", flush=True)
            g = Gluster(c, work)
            g.up(list(STORAGE), "c1", gmnt, groups.procs("gluster-server"), groups.procs("gluster-client"))
            mounts["gluster"] = gmnt
        b.cgroup = groups.procs("workload")
        mpi_base = 0.0
        if bindir:  # the CPU of starting mpirun and its ranks, subtracted from each MPI run
            samples = []
            for i in range(3):
                u0 = groups.usage()["workload"]
                r = b.run(None, f"cd /tmp && HOME=/tmp {mpirun_prefix(a.ranks)} {bindir}/mdtest -n 1 -u -F -L -N 1 "
                                f"-d {raw}/mpi-base")
                if r.returncode != 0:
                    sys.exit(f"mpirun as the user failed: {r.stdout}{r.stderr}")
                samples.append(groups.usage()["workload"] - u0)
            mpi_base = statistics.median(samples)
            print(f"starting mpirun and {a.ranks} ranks: {mpi_base * 1000:.0f} core-ms", flush=True)
        run = Run(a, c, b, groups, mpi_base, bindir)
        for rep in range(a.repeat):
            order = targets[rep % len(targets):] + targets[:rep % len(targets)]  # in turns: none always first
            for t in order:
                t0 = time.time()
                d = f"{mounts[t]}/io500-{rep}"
                run.shell(t, f"mkdir -p {d}", "mkdir")
                results[t].append(run.all(t, d))
                run.shell(t, f"rm -rf {d}", "rm -rf")
                summary = ", ".join(f"{k} {num(v['value'])}" for k, v in results[t][-1].items() if v)
                print(f"repetition {rep + 1}, {t} ({time.time() - t0:.0f} s): {summary}", flush=True)
        failures = run.failures
        if g:
            g.close("c1", gmnt)
            g = None
        for i, (key, _, directive) in enumerate(TARGETS):
            if key in targets and directive:
                end_job(c, work, str(200 + i))
    finally:
        if g:
            g.close("c1", gmnt)
        if floor:
            floor.terminate()
            try:
                floor.wait(timeout=30)
            except subprocess.TimeoutExpired:
                floor.kill()
                c.on("c1", f"umount -l {work}/fuse-mount", user=False)
        c.close()
        groups.close()
        if xfs:
            xfs.close(keep=sys.exc_info()[0] is not None)
        elif not a.dir:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.time() - started
    load1 = os.getloadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "mpi_base": mpi_base, "failures": failures, "results": results}, f, indent=1)

    # Medians over the repetitions that succeeded.
    med = {}
    for t in targets:
        med[t] = {}
        for key, _, _, _ in rows(bool(bindir)):
            recs = [r[key] for r in results[t] if r.get(key)]
            if not recs:
                continue
            med[t][key] = {
                "value": statistics.median(r["value"] for r in recs),
                "cpu": statistics.median((r["client"] + r["server"]) / r["units"] for r in recs),
                "client": statistics.median(r["client"] / r["units"] for r in recs),
                "n": len(recs),
                "requests": {op: statistics.median(r["requests"].get(op, 0) / r["units"] for r in recs)
                             for op in sorted({op for r in recs for op in r["requests"]})},
            }
    cols = [t for t in targets]
    lines = ["| workload | " + " | ".join(LABEL[t] for t in cols) + " |", "|---|" + "---:|" * len(cols)]
    for key, label, cpu_unit, _ in rows(bool(bindir)):
        if workload_of(key) not in a.workloads:
            continue
        cells = []
        for t in cols:
            m = med[t].get(key)
            if not m:
                cells.append("failed" if results[t] else "—")
                continue
            v = m["value"]
            ratios = []
            for ref, name in (("raw", "raw"), ("gluster", "G")):
                if ref != t and ref in med and key in med[ref] and med[ref][key]["value"]:
                    ratios.append(f"{v / med[ref][key]['value']:.2f}× {name}")
            scale = 1e3 if cpu_unit == "ms/MiB" else 1e6
            if m["cpu"] > 0:
                cpu = f"{num(m['cpu'] * scale)} {cpu_unit} ({num(m['client'] * scale)} client)"
            else:  # less than the noise of the CPU of starting mpirun, which is subtracted
                cpu = "CPU below the noise"
            short = "" if m["n"] == a.repeat else f" [{m['n']} of {a.repeat}]"
            cells.append(f"**{num(v)}**{short}<br>{', '.join(ratios)}<br>{cpu}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)

    # Requests per operation on the storage agents (Spillway targets).
    spill = [t for t in cols if t not in DAEMONS]
    req_rows = [k for k, _, _, _ in rows(bool(bindir))
                if k not in ("randread", "randwrite", "sync") and workload_of(k) in a.workloads]
    rlines = ["| requests per operation | " + " | ".join(LABEL[t] for t in spill) + " |", "|---|" + "---:|" * len(spill)]
    labels = {k: l for k, l, _, _ in rows(bool(bindir))}
    for key in req_rows:
        cells = []
        # ior-hard per transfer (47008 bytes), ior-easy per MiB (a transfer too), mdtest per file
        per = 47008 / 2**20 if key.startswith("iorhard") else 1
        for t in spill:
            m = med[t].get(key)
            cells.append(request_cell(m["requests"], per) if m else "—")
        unit = {"iorhard": "per 47008-byte transfer", "ioreasy": "per 1 MiB transfer"}.get(key.split("_")[0], "per file")
        rlines.append(f"| {labels[key].rsplit(',', 1)[0]}, {unit} | " + " | ".join(cells) + " |")
    per_file = {}
    for t in spill:
        total = {}
        for ph in ("create", "stat", "read", "remove"):
            for op, v in med[t].get(f"easy_{ph}", {}).get("requests", {}).items():
                total[op] = total.get(op, 0) + v
        per_file[t] = total
    rlines.append(f"| {'mdtest-easy' if bindir else 'mdtest-easy-like'}, one file's phases | " +
                  " | ".join(f"**{sum(per_file[t].values()):.1f}**" for t in spill) + " |")
    rtable = "\n".join(rlines)
    breakdown = ""
    for t in spill:
        ops = sorted(per_file[t].items(), key=lambda kv: -kv[1])
        breakdown += f"- {LABEL[t]}: " + ", ".join(f"{op.upper()} {v:.1f}" for op, v in ops if v >= 0.05) + "\n"

    failed = "".join(f"- {f}\n" for f in failures)
    goals = targets_summary(med)
    print("\n" + table + "\n\n" + rtable + "\n\n" + breakdown + "\n" + goals + ("\nFailures:\n" + failed if failed else ""))
    print(f"\n{elapsed / 60:.1f} minutes; load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end")
    if a.no_write:
        return
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    busy = max(load0[0], load1[0])
    shared = (f" The machine was shared with other work during the run (load average {load0[0]:.1f} at its start, "
              f"{load1[0]:.1f} at its end, on {os.cpu_count()} cores): compare the ratios, measured in turns, more than "
              f"the absolute figures." if busy >= 0.5 else "")
    cmd = " ".join(["sudo python3 bench/metadata_bench.py"] + ["IOR_SRC" if x == a.ior_src else x for x in sys.argv[1:]])
    write_section("metadata", (
        "## Metadata and small I/O: IOR and mdtest (the IO500 workloads)\n\n"
        f"Measured {when} on {os.cpu_count()} cores, Linux {platform.release()}, with `{cmd.strip()}`"
        + (" (IOR_SRC: a clone of https://github.com/hpc/ior)" if a.ior_src else "") +
        f" in {elapsed / 60:.0f} minutes ({tool}), on {fs_note}. {a.ranks} MPI ranks as an ordinary user on compute node c1, "
        f"each host a network namespace (bench/striped_bench.py's cluster); medians of {a.repeat} repetitions, the "
        f"targets in turns.{shared} These are the figures issue 21's work is measured against.\n\n"
        + ((f"mdtest-easy: `mdtest -n {a.easy_files} -u -F -L -N 1`; mdtest-hard: `mdtest -n {a.hard_files} -F -N 1 "
            f"-w 3901 -e 3901`, each phase a run of its own (`-C`, `-T`, `-E`, `-r`); ior-hard: `ior -a POSIX -t 47008 "
            f"-b 47008 -s {a.segments} -C -Q 1 -g -e`, ior-easy: `ior -a POSIX -t 1m -b {a.easy_mib}m -F -C -Q 1 -g -e`, "
            "each a write run (`-w -k`) then a read run (`-r`), no cache drop between (as IO500); ior-easy's files "
            "are read a second time by the same node (`-r -k`, then `-r`: \"read again\"). mdtest's files "
            "are five path components below the mount point (`io500-R/mdt-easy/test-dir.0-0/mdtest_tree.N.0/file`): "
            "where nothing is cached, each component costs a LOOKUP and a GETATTR in every phase.")
           if bindir else
           "No IOR source tree was given: the metadata figures are fio's filecreate, filestat and filedelete engines "
           "and 3901-byte psync writes and reads; ior-hard and ior-easy are fio jobs of the same shapes (see the "
           "script's --help); their CPU includes fio's own start-up, which is not subtracted.") +
        " fio: bench/striped_bench.py's jobs, one process, 4 KiB random reads and writes with libaio, O_DIRECT "
        "(GlusterFS ignores it under Debian's defaults), iodepth 32, after a drop of the page cache; the p50 of a "
        "4 KiB psync write + fdatasync.\n\n"
        "Each cell: the median figure; its ratio to raw and to GlusterFS (G; for the fdatasync latency lower is "
        "better); the CPU per operation (per MiB for IOR, per I/O for fio), client + server, in core-µs (core-ms "
        "per MiB), the client's share in brackets. CPU is the cgroup accounting of the processes of the run: the "
        "workload (mpirun and its ranks, less the CPU of starting them, "
        f"{mpi_base * 1e3:.0f} core-ms per run, measured; or fio), the client daemon (c1's agent, GlusterFS's FUSE "
        "process) and the servers (the storage agents, glusterd and its bricks); the kernel's work counts in the "
        "process it ran for. On 2 cores CPU bounds these runs, so the cost per operation is what carries to a real "
        "machine.\n\n"
        f"{table}\n\n"
        "Requests the storage agents answered per operation (spillway_warpfs_requests_total, transport remote, "
        "summed over s1-s4):\n\n"
        f"{rtable}\n\nBy operation, one {'mdtest-easy' if bindir else 'mdtest-easy-like'} file (all its phases):\n\n{breakdown}\n"
        f"{goals}\n"
        + ("Failed runs (left out of the medians):\n\n" + failed + "\n" if failed else "")
        + "All storage nodes share this VM's one disk and its 2 cores with the client and the MPI ranks.\n"))


if __name__ == "__main__":
    main()
