#!/usr/bin/env python3
"""What FUSE over io_uring buys on this machine (issue 21, item 4): the same workloads over

  raw      the directory itself (the ceiling, no FUSE)
  gofuse   go-fuse's loopback of it (bench/fusefloor: the library Spillway's mounts use,
           reading /dev/fuse; names and attributes cached 10 s, no passthrough), the floor
           of issue 21's tables (BENCHMARKS.md "Metadata and small I/O")
  dev      libfuse's example/passthrough_hp over /dev/fuse (read + writev per request)
  uring    the same daemon with `-o io_uring`: requests and replies through the kernel's
           FUSE-over-io_uring queues (one per CPU, one io_uring_enter per request)
  gfdev, gfuring   with --gofuse-src DIR (a tree of github.com/hanwen/go-fuse's experimental
           `iouring` branch, the maintainer's own prototype, not in a release): bench/fusefloor
           built against it (a module made for the run, replace => DIR), without and with its
           MountOptions.EnableIoUring: the transport in go-fuse itself

dev and uring are the same program with the same options (--nopassthrough, so every read
and write is a FUSE round trip, and --nosplice, so /dev/fuse is read and written with plain
system calls); only the transport differs, and their difference is what io_uring removes.
The uring variant is checked to really use it: libfuse's FUSE_INIT status must say
`io_uring=on` (`io_uring=off:disabled` for dev), and the completions counted by the rings'
fdinfo (CqHead) are reported per operation. /sys/module/fuse/parameters/enable_uring is set
to Y for the run if it is N (and put back after), which the report says; a kernel without
the parameter has no FUSE over io_uring and the uring variant is left out, saying so.

Workloads (each a run of its own, measured with the CPU of its processes):

  * mdtest-easy's phases on empty files (mdtest -u -F -L -N 1: a directory per thread),
    with 1 and with --threads threads, each phase a run of its own: create (open O_CREAT|O_EXCL
    + close), stat (after a drop of the kernel's dentry and inode caches, else every stat is
    answered from the FUSE mount's caches without a request), open+close (O_RDONLY) and
    remove (unlink). A small C program built for the run (MDLOOP in this script: pthreads, a barrier
    between setup and the timed loop, no MPI), so that the CPU counted is the work's:
    issue 21's MPI ranks spin in their barriers while waiting for the slowest, which a cost
    per request cannot tell from the request's.
  * fio, one process, on a file of --size-mib written beforehand, O_DIRECT (passthrough_hp
    answers it with FOPEN_DIRECT_IO, go-fuse's loopback sends it on; either way each I/O
    is a FUSE request): 4 KiB random read and write with psync (one at a time: its mean
    completion latency is reported too) and with libaio at iodepth 32; 1 MiB sequential
    read and write (psync).

Then the Go prototype (internal/fuseuring: FUSE over io_uring in Go, a fixed tree answering
LOOKUP and GETATTR) runs a stat loop against itself over /dev/fuse and go-fuse v2's fs
package over /dev/fuse (bench/fuseuringstat; --stats 0 leaves it out): what the transport
buys a Go server, with no C library's thread model in the comparison; its io_uring both with
each request handled on the queue's thread and on a goroutine of its own, and again with
handlers that sleep --delay-us (a network file system's wait).

CPU is the cgroup accounting (bench/metadata_bench.py's CpuGroups) of the workload's
processes and of each daemon; the kernel's work counts in the process it ran for. Each cell
gives the median rate of --repeat repetitions, then the CPU per operation (per MiB for the
sequential rows) of the daemon + the workload; the variants run in turns, a different one
first in each repetition. The daemons' context switches per operation are summed over their
threads' /proc status (a libfuse worker that exits takes its own with it).

libfuse is built from --libfuse-src (a source tree of https://github.com/libfuse/libfuse at
3.17 or later, with io_uring support) with meson and ninja in a temporary directory; it needs
liburing-dev (Debian), meson (Debian or pip) and ninja; the repository holds no copy.

Usage: sudo python3 bench/fuse_uring_bench.py --libfuse-src DIR [--repeat 3]
           [--variants raw,gofuse,dev,uring] [--files 8000] [--threads 4] [--size-mib 256]
           [--runtime 5] [--stats 100000] [--delay-us 200] [--gofuse-src DIR] [--xfs GIB | --dir DIR] [--json FILE] [--write]
Prints the table; --write also puts it in BENCHMARKS.md between <!-- fuse-uring:begin -->
and <!-- fuse-uring:end -->. Takes /tmp/spillway-netns.lock, as the other benchmarks do, so
that none runs at the same time. About 8 minutes with the defaults on 2 cores, 11 with --gofuse-src.
"""
import argparse
import datetime
import fcntl
import glob
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
from metadata_bench import CpuGroups, XfsScratch, fs_type, num

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
URING_PARAM = "/sys/module/fuse/parameters/enable_uring"

VARIANTS = [
    ("raw", "raw directory (no FUSE)"),
    ("gofuse", "go-fuse v2 loopback, /dev/fuse (FUSE floor)"),
    ("dev", "libfuse passthrough_hp, /dev/fuse"),
    ("uring", "libfuse passthrough_hp, io_uring"),
    # with --gofuse-src: bench/fusefloor built against go-fuse's experimental iouring branch
    ("gfdev", "go-fuse iouring branch, /dev/fuse"),
    ("gfuring", "go-fuse iouring branch, io_uring"),
]
LABEL = dict(VARIANTS)
DAEMONS = ("gofuse", "dev", "uring", "gfdev", "gfuring")
BRANCH = ("gfdev", "gfuring")

MD_PHASES = ("create", "stat", "open", "remove")
# fio jobs: key, label, fio options, the direction fio counts, unit of the rate
FIO_JOBS = [
    ("rr_psync", "fio 4 KiB random read, psync, IOPS", "--rw=randread --bs=4k --ioengine=psync", "read", "IOPS"),
    ("rw_psync", "fio 4 KiB random write, psync, IOPS", "--rw=randwrite --bs=4k --ioengine=psync", "write", "IOPS"),
    ("rr_aio", "fio 4 KiB random read, libaio QD32, IOPS", "--rw=randread --bs=4k --ioengine=libaio --iodepth=32",
     "read", "IOPS"),
    ("rw_aio", "fio 4 KiB random write, libaio QD32, IOPS", "--rw=randwrite --bs=4k --ioengine=libaio --iodepth=32",
     "write", "IOPS"),
    ("sr", "fio 1 MiB sequential read, MiB/s", "--rw=read --bs=1M --ioengine=psync", "read", "MiB/s"),
    ("sw", "fio 1 MiB sequential write, MiB/s", "--rw=write --bs=1M --ioengine=psync", "write", "MiB/s"),
]


# The metadata workload: mdloop PHASE THREADS FILES DIR; FILES split over THREADS, each in DIR/tN.
MDLOOP = r'''
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *phase, *dir;
static int threads, files;
static pthread_barrier_t start;
static struct timespec *began, *ended; /* each thread's own: the main thread may run late */

static void die(const char *what, const char *path) {
    fprintf(stderr, "mdloop %s: %s %s: %s\n", phase, what, path, strerror(errno));
    exit(1);
}

static void *work(void *arg) {
    long t = (long)arg;
    char d[4096], p[4200];
    snprintf(d, sizeof d, "%s/t%ld", dir, t);
    if (!strcmp(phase, "create") && mkdir(d, 0755) && errno != EEXIST)
        die("mkdir", d);
    int n = files / threads;
    pthread_barrier_wait(&start);
    clock_gettime(CLOCK_MONOTONIC, &began[t]);
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/f%d", d, i);
        struct stat st;
        int fd;
        if (!strcmp(phase, "create")) {
            if ((fd = open(p, O_CREAT | O_EXCL | O_WRONLY, 0644)) < 0 || close(fd))
                die("create", p);
        } else if (!strcmp(phase, "stat")) {
            if (stat(p, &st))
                die("stat", p);
        } else if (!strcmp(phase, "open")) {
            if ((fd = open(p, O_RDONLY)) < 0 || close(fd))
                die("open", p);
        } else if (unlink(p)) {
            die("unlink", p);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &ended[t]);
    if (!strcmp(phase, "remove"))
        rmdir(d);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: mdloop create|stat|open|remove THREADS FILES DIR\n");
        return 2;
    }
    phase = argv[1], threads = atoi(argv[2]), files = atoi(argv[3]), dir = argv[4];
    if (threads < 1 || files < threads)
        return 2;
    pthread_barrier_init(&start, NULL, threads);
    began = calloc(threads, sizeof *began), ended = calloc(threads, sizeof *ended);
    pthread_t tid[threads];
    for (long t = 0; t < threads; t++)
        pthread_create(&tid[t], NULL, work, (void *)t);
    double first = 1e30, last = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        double a = began[t].tv_sec + began[t].tv_nsec / 1e9, b = ended[t].tv_sec + ended[t].tv_nsec / 1e9;
        first = a < first ? a : first, last = b > last ? b : last;
    }
    printf("%d operations in %.6f s\n", files / threads * threads, last - first);
    return 0;
}
'''


def sh(*cmd, check=True, **kw):
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, **kw)


def build_libfuse(src, tmp):
    """Builds libfuse's example/passthrough_hp from the tree src in tmp (meson + ninja); returns
    the executable, libfuse's version and whether it was built with io_uring support."""
    src = os.path.abspath(src)
    if not os.path.isfile(os.path.join(src, "meson.build")) or not os.path.isfile(
            os.path.join(src, "example", "passthrough_hp.cc")):
        sys.exit(f"--libfuse-src {src}: not a source tree of github.com/libfuse/libfuse "
                 "(no meson.build and example/passthrough_hp.cc)")
    if not os.path.isfile(os.path.join(src, "lib", "fuse_uring.c")):
        sys.exit(f"--libfuse-src {src}: this libfuse has no lib/fuse_uring.c (FUSE over io_uring came with 3.17): "
                 "use a newer tree")
    for tool in ("meson", "ninja", "c++", "pkg-config"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: building libfuse needs meson (apt-get install meson, or pip install meson), "
                     "ninja-build, g++ and pkg-config")
    build = os.path.join(tmp, "libfuse-build")
    log = os.path.join(tmp, "libfuse-build.log")
    print(f"building libfuse's passthrough_hp from {src} (log: {log}) …", flush=True)
    with open(log, "w") as f:
        for step in (["meson", "setup", build, src, "-Dexamples=true", "-Dutils=false", "-Dtests=false"],
                     ["ninja", "-C", build, "example/passthrough_hp"]):
            if subprocess.run(["nice"] + step, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                sys.exit(f"building libfuse: {' '.join(step)} failed; see {log}")
    text = open(log).read()
    uring = re.search(r"io_uring support\s*:\s*(\S+)", text)
    if not uring or uring.group(1).lower() not in ("true", "yes"):
        sys.exit(f"libfuse was configured without io_uring support (see {log}): it needs liburing with SQE128 "
                 "(apt-get install liburing-dev)")
    version = re.search(r"^libfuse3 (\S+)", text, re.M)
    exe = os.path.join(build, "example", "passthrough_hp")
    if not os.access(exe, os.X_OK):
        sys.exit(f"building libfuse: no {exe}; see {log}")
    return exe, version.group(1) if version else "?"


def build_fusefloor_branch(src, tmp):
    """bench/fusefloor built against the go-fuse tree src (its iouring branch), in a module of
    its own made in tmp; returns the executable."""
    src = os.path.abspath(src)
    try:
        api = open(os.path.join(src, "fuse", "api.go")).read()
    except OSError:
        sys.exit(f"--gofuse-src {src}: not a source tree of github.com/hanwen/go-fuse (no fuse/api.go)")
    if "EnableIoUring" not in api:
        sys.exit(f"--gofuse-src {src}: this go-fuse has no MountOptions.EnableIoUring (use its iouring branch)")
    mod = os.path.join(tmp, "fusefloor-branch")
    os.makedirs(mod)
    shutil.copy(os.path.join(HERE, "fusefloor", "main.go"), mod)
    go = re.search(r"^go (\S+)", open(os.path.join(ROOT, "go.mod")).read(), re.M).group(1)
    with open(os.path.join(mod, "go.mod"), "w") as f:
        f.write(f"module fusefloorbranch\n\ngo {go}\n\nrequire github.com/hanwen/go-fuse/v2 v2.0.0\n\n"
                f"replace github.com/hanwen/go-fuse/v2 => {src}\n")
    exe = os.path.join(tmp, "fusefloor-branch.bin")
    for step in (["go", "mod", "tidy"], ["go", "build", "-o", exe, "."]):
        r = sh(*step, check=False, cwd=mod)
        if r.returncode != 0:
            sys.exit(f"building bench/fusefloor against {src}: {' '.join(step)}: {r.stdout}{r.stderr}")
    return exe


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == path and " - fuse" in line:
                return True
    return False


def in_cgroup(procs, argv):
    """argv run from its first instruction in the cgroup whose cgroup.procs is procs."""
    return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"] + argv


class Daemon:
    """A FUSE daemon serving src at mnt, in its own cgroup."""

    def __init__(self, variant, argv, mnt, procs, log):
        self.variant, self.mnt, self.log = variant, mnt, log
        env = dict(os.environ, FUSE_INIT_STATUS="1")  # libfuse: report the negotiated transport
        self.p = subprocess.Popen(in_cgroup(procs, argv), stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 30
        while not mounted(mnt):
            if self.p.poll() is not None or time.time() > deadline:
                self.close()
                sys.exit(f"{LABEL[variant]} did not mount {mnt}: {open(log).read()[-2000:]}")
            time.sleep(0.1)

    def status(self):
        """libfuse's FUSE_INIT status line about io_uring (None for go-fuse), waited for: the mount
        appears before the daemon has answered INIT and logged it."""
        deadline = time.time() + 10
        while True:
            m = re.search(r"FUSE_INIT: (io_uring=\S+)", open(self.log).read())
            if m or time.time() > deadline:
                return m.group(1) if m else None
            time.sleep(0.05)

    def ring_fds(self):
        """The /proc paths of the daemon's open io_uring descriptors."""
        out = []
        for fd in glob.glob(f"/proc/{self.p.pid}/fd/*"):
            try:
                if os.readlink(fd) == "anon_inode:[io_uring]":
                    out.append(fd)
            except OSError:
                pass
        return out

    def rings(self):
        """How many io_urings the daemon has open."""
        return len(self.ring_fds())

    def ring_completions(self):
        """Completions so far on the daemon's io_urings (CqHead of their fdinfo)."""
        total = 0
        for fd in self.ring_fds():
            try:
                with open(fd.replace("/fd/", "/fdinfo/")) as f:
                    total += int(re.search(r"^CqHead:\s*(\d+)", f.read(), re.M).group(1))
            except (OSError, AttributeError):
                pass
        return total

    def switches(self):
        """Context switches (voluntary + not) of the daemon's threads alive now."""
        total = 0
        for st in glob.glob(f"/proc/{self.p.pid}/task/*/status"):
            try:
                with open(st) as f:
                    total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
            except OSError:
                pass
        return total

    def close(self):
        if mounted(self.mnt):
            if sh("umount", self.mnt, check=False).returncode != 0:
                time.sleep(1)
                sh("umount", "-l", self.mnt, check=False)
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


class Bench:
    def __init__(self, a, groups, mounts, daemons, mdloop):
        self.a, self.groups, self.mounts, self.daemons, self.mdloop = a, groups, mounts, daemons, mdloop
        self.failures = []

    def run(self, argv, what, variant):
        """argv in the workload's cgroup; its stdout, or None (recorded) on failure."""
        r = subprocess.run(in_cgroup(self.groups.procs("workload"), argv), capture_output=True, text=True, cwd="/tmp")
        if r.returncode != 0:
            msg = f"{LABEL[variant]}: {what} (exit {r.returncode}): " + " ".join((r.stdout + r.stderr)[-600:].split())
            print("FAILED " + msg, flush=True)
            self.failures.append(msg)
            return None
        return r.stdout

    def measure(self, variant, fn):
        """fn() -> (rate, units of work, extra fields) or None; returns its record with the CPU of
        the workload and of the variant's daemon, the daemon's context switches and ring completions."""
        d = self.daemons.get(variant)
        u0, cs0, cq0 = self.groups.usage(), d.switches() if d else 0, d.ring_completions() if d else 0
        load = os.getloadavg()[0]
        out = fn()
        u1, cs1, cq1 = self.groups.usage(), d.switches() if d else 0, d.ring_completions() if d else 0
        if out is None:
            return None
        rate, units, extra = out
        rec = {"value": rate, "units": units, "load": load, "workload": u1["workload"] - u0["workload"],
               "daemon": u1[variant] - u0[variant] if d else 0.0, "switches": cs1 - cs0, "ring": cq1 - cq0}
        rec.update(extra)
        return rec

    def all(self, variant, rep):
        a, out = self.a, {}
        top = os.path.join(self.mounts[variant], f"rep-{rep}")
        os.makedirs(top, exist_ok=True)
        for threads in sorted({1, a.threads}):
            d = f"{top}/md-{threads}"
            os.makedirs(d)
            for phase in MD_PHASES:
                if phase == "stat":  # else each stat is answered from the mount's caches
                    os.sync()
                    with open("/proc/sys/vm/drop_caches", "w") as f:
                        f.write("2\n")

                def one(phase=phase, what=f"mdloop {phase}, {threads} thread(s)"):
                    o = self.run([self.mdloop, phase, str(threads), str(a.files), d], what, variant)
                    if o is None:
                        return None
                    m = re.search(r"^(\d+) operations in ([0-9.]+) s$", o, re.M)
                    if not m or not float(m.group(2)):
                        self.failures.append(f"{LABEL[variant]}: {what}: no rate in its output: {o[-300:]}")
                        return None
                    return int(m.group(1)) / float(m.group(2)), int(m.group(1)), {}
                out[f"{phase}_{threads}"] = self.measure(variant, one)
        shutil.rmtree(top, ignore_errors=True)
        data = os.path.join(self.mounts[variant], "fio.dat")
        for key, _, opts, op, unit in FIO_JOBS:
            def one(opts=opts, op=op, unit=unit, key=key):
                o = self.run(["fio", "--output-format=json", "--name=j", f"--filename={data}", f"--size={a.size_mib}M",
                              "--direct=1", "--time_based", f"--runtime={a.runtime}", "--norandommap",
                              "--randrepeat=0"] + opts.split(), f"fio {key}", variant)
                if o is None:
                    return None
                j = json.loads(o[o.index("{"):])["jobs"][0][op]
                if unit == "MiB/s":
                    return j["bw_bytes"] / 2**20, j["io_bytes"] / 2**20, {}
                return j["iops"], j["total_ios"], {"lat_us": j["clat_ns"]["mean"] / 1e3}
            out[key] = self.measure(variant, one)
        return out


def rows(a):
    r = []
    for threads in sorted({1, a.threads}):
        for phase in MD_PHASES:
            what = {"create": "create", "stat": "stat (dentries dropped)", "open": "open+close", "remove": "remove"}[phase]
            r.append((f"{phase}_{threads}", f"{what}, {threads} thread{'s' if threads > 1 else ''}, ops/s", "µs"))
    for key, label, _, _, unit in FIO_JOBS:
        r.append((key, label, "ms/MiB" if unit == "MiB/s" else "µs"))
    return r


def summarize(results, variants, a):
    """Medians over the repetitions: {variant: {key: {...}}}."""
    med = {}
    for v in variants:
        med[v] = {}
        for key, _, _ in rows(a):
            recs = [r[key] for r in results[v] if r.get(key)]
            if not recs:
                continue
            m = {"n": len(recs), "value": statistics.median(r["value"] for r in recs)}
            for f in ("daemon", "workload"):
                m[f] = statistics.median(r[f] / r["units"] for r in recs)
            m["cpu"] = statistics.median((r["daemon"] + r["workload"]) / r["units"] for r in recs)
            m["switches"] = statistics.median(r["switches"] / r["units"] for r in recs)
            m["ring"] = statistics.median(r["ring"] / r["units"] for r in recs)
            if all("lat_us" in r for r in recs):
                m["lat_us"] = statistics.median(r["lat_us"] for r in recs)
            med[v][key] = m
    return med


def table(med, variants, a):
    lines = ["| workload | " + " | ".join(LABEL[v] for v in variants) + " |", "|---|" + "---:|" * len(variants)]
    for key, label, cpu_unit in rows(a):
        cells = []
        scale = 1e3 if cpu_unit == "ms/MiB" else 1e6
        for v in variants:
            m = med[v].get(key)
            if not m:
                cells.append("failed")
                continue
            parts = [f"**{num(m['value'])}**" + ("" if m["n"] == a.repeat else f" [{m['n']} of {a.repeat}]")]
            ref = {"uring": "dev", "gfuring": "gfdev"}.get(v)
            if ref in med and key in med[ref] and med[ref][key]["value"]:
                parts[0] += f" ({m['value'] / med[ref][key]['value']:.2f}× {ref})"
            if "lat_us" in m:
                parts.append(f"{num(m['lat_us'])} µs/I/O")
            cpu = f"{num(m['cpu'] * scale)} {cpu_unit}"
            if v in DAEMONS:
                cpu += f" ({num(m['daemon'] * scale)} + {num(m['workload'] * scale)})"
            parts.append(cpu)
            if v in DAEMONS and cpu_unit == "µs":
                parts.append(f"{m['switches']:.1f} cs" + (f", {m['ring']:.1f} CQE" if v in ("uring", "gfuring") else ""))
            cells.append("<br>".join(parts))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def savings(med, a, ref="dev", new="uring"):
    """What new (io_uring) saves against ref (/dev/fuse), per row: CPU per operation and rate."""
    if new not in med or ref not in med:
        return ""
    out = []
    for key, label, cpu_unit in rows(a):
        d, u = med[ref].get(key), med[new].get(key)
        if not d or not u or not d["cpu"]:
            continue
        scale = 1e3 if cpu_unit == "ms/MiB" else 1e6
        diff = (u["cpu"] - d["cpu"]) * scale
        text = (f"{label.rsplit(',', 1)[0]}: {num(d['cpu'] * scale)} → {num(u['cpu'] * scale)} {cpu_unit} "
                f"({diff:+.1f}, {100 * (u['cpu'] / d['cpu'] - 1):+.0f} %; daemon {num(d['daemon'] * scale)} → "
                f"{num(u['daemon'] * scale)}), rate {u['value'] / d['value']:.2f}×")
        if "lat_us" in d and "lat_us" in u:
            text += f", latency {num(d['lat_us'])} → {num(u['lat_us'])} µs"
        out.append(text)
    return "".join(f"- {t}\n" for t in out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libfuse-src", required=True, help="a source tree of github.com/libfuse/libfuse (3.17 or later)")
    ap.add_argument("--variants", default=None, help="what to measure, comma-separated (default: all; gfdev and "
                    "gfuring with --gofuse-src only)")
    ap.add_argument("--gofuse-src", default=None, help="a source tree of go-fuse's iouring branch "
                    "(github.com/hanwen/go-fuse): adds the variants gfdev and gfuring")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions (the figures are their medians)")
    ap.add_argument("--files", type=int, default=8000, help="files of each metadata run, split over its threads")
    ap.add_argument("--threads", type=int, default=4, help="threads of the parallel metadata runs (also run with 1)")
    ap.add_argument("--size-mib", type=int, default=256, help="fio's file")
    ap.add_argument("--runtime", type=int, default=5, help="seconds of each fio run")
    ap.add_argument("--xfs", type=int, default=8, metavar="GIB", help="run on an XFS of GIB GiB made for the run on a "
                    "sparse file (loop device, direct I/O), as issue 21's tables were; 0 with --dir")
    ap.add_argument("--dir", default=None, help="scratch directory instead of the XFS")
    ap.add_argument("--json", default=None, help="also write every repetition's records to this file")
    ap.add_argument("--stats", type=int, default=100000, help="stats of each run of the Go prototype's stat loop "
                    "(bench/fuseuringstat; 0 leaves it out)")
    ap.add_argument("--delay-us", type=int, default=200, help="the prototype's stat loop again (16 threads, 16 "
                    "ring entries and /dev/fuse readers) with every request's handler sleeping this long, as a "
                    "network file system's waits (0 leaves it out)")
    ap.add_argument("--write", action="store_true", help="put the table in BENCHMARKS.md (section fuse-uring)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    if a.variants is None:
        a.variants = ",".join(k for k, _ in VARIANTS if a.gofuse_src or k not in BRANCH)
    variants = [v for v in a.variants.split(",") if v]
    if any(v in BRANCH for v in variants) and not a.gofuse_src:
        sys.exit("--variants gfdev, gfuring: need --gofuse-src (a tree of go-fuse's iouring branch)")
    for v in variants:
        if v not in LABEL:
            sys.exit(f"--variants: unknown {v} (known: {', '.join(LABEL)})")
    if a.dir and a.xfs:
        a.xfs = 0
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark mounts FUSE file systems, makes cgroups and drops the dentry cache")
    for tool in ("fio", "go", "cc"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found (scripts/install-deps --bench installs what the benchmarks need)")
    notes = []
    param0 = None
    if "uring" in variants:
        if not os.path.exists(URING_PARAM):
            notes.append(f"this kernel has no {URING_PARAM}: no FUSE over io_uring, the uring variant is left out")
            variants.remove("uring")
        else:
            param0 = open(URING_PARAM).read().strip()
            if param0 != "Y":
                with open(URING_PARAM, "w") as f:
                    f.write("Y\n")
                notes.append(f"{URING_PARAM} was {param0}: set to Y for the run, put back after")
    tmp = tempfile.mkdtemp(prefix="fuse-uring-bench-")
    passthrough_hp, libfuse_version = build_libfuse(a.libfuse_src, tmp)
    mdloop = os.path.join(tmp, "mdloop")
    with open(mdloop + ".c", "w") as f:
        f.write(MDLOOP)
    r = sh("cc", "-O2", "-pthread", "-o", mdloop, mdloop + ".c", check=False)
    if r.returncode != 0:
        sys.exit(f"building the metadata loop failed: {r.stdout}{r.stderr}")
    fusefloor = os.path.join(tmp, "fusefloor")
    statbench = os.path.join(tmp, "fuseuringstat")
    for exe, pkg in ((fusefloor, "./bench/fusefloor"), (statbench, "./bench/fuseuringstat")):
        r = sh("go", "build", "-o", exe, pkg, check=False, cwd=ROOT)
        if r.returncode != 0:
            sys.exit(f"building {pkg} failed: {r.stdout}{r.stderr}")
    fusefloor_branch = build_fusefloor_branch(a.gofuse_src, tmp) if a.gofuse_src else None
    gofuse = re.search(r"github.com/hanwen/go-fuse/v2 (\S+)", open(os.path.join(ROOT, "go.mod")).read())
    lock = open("/tmp/spillway-netns.lock", "w")
    print("waiting for /tmp/spillway-netns.lock …", flush=True)
    fcntl.flock(lock, fcntl.LOCK_EX)
    load0, started = os.getloadavg(), time.time()
    xfs = XfsScratch(a.xfs) if a.xfs else None
    work = xfs.mnt if xfs else (a.dir or tempfile.mkdtemp(prefix="fuse-uring-bench-", dir="/var/tmp"))
    fs_note = (f"an XFS of {a.xfs} GiB on a loop device (direct I/O) over a sparse file, made for the run" if xfs
               else f"a directory of {fs_type(work)}")
    groups = CpuGroups(("workload",) + tuple(v for v in variants if v in DAEMONS))
    daemons, mounts, results = {}, {}, {v: [] for v in variants}
    proto, proto_delay = "", ""
    b = None
    try:
        for v in variants:
            src = os.path.join(work, f"src-{v}")
            os.makedirs(src)
            if v == "raw":
                mounts[v] = src
                continue
            mnt = os.path.join(work, f"mnt-{v}")
            os.makedirs(mnt)
            if v == "gofuse":
                argv = [fusefloor, src, mnt]
            elif v in BRANCH:
                argv = [fusefloor_branch] + (["--io-uring"] if v == "gfuring" else []) + [src, mnt]
            else:
                argv = [passthrough_hp, "--foreground", "--nopassthrough", "--nosplice", "-o", "allow_other"] + \
                       (["-o", "io_uring"] if v == "uring" else []) + [src, mnt]
            daemons[v] = Daemon(v, argv, mnt, groups.procs(v), os.path.join(tmp, f"{v}.log"))
            mounts[v] = mnt
            want = {"dev": "io_uring=off:disabled", "uring": "io_uring=on"}.get(v)
            if want and daemons[v].status() != want:
                sys.exit(f"{LABEL[v]}: libfuse says {daemons[v].status()}, not {want}; its log: {daemons[v].log}")
            if v in BRANCH:
                time.sleep(0.5)  # the rings are set up after INIT's answer
                rings = daemons[v].rings()
                want = f"{rings} io_urings"
                if (v == "gfuring") != (rings > 0):
                    sys.exit(f"{LABEL[v]}: the daemon has {rings} io_urings open; its log: {daemons[v].log}")
            print(f"{LABEL[v]} mounted at {mnt}" + (f" ({want})" if want else ""), flush=True)
        for v in variants:  # fio's file, written once
            sh("fio", "--name=layout", f"--filename={mounts[v]}/fio.dat", f"--size={a.size_mib}M", "--rw=write",
               "--bs=1M", "--direct=1", "--ioengine=psync")
        b = Bench(a, groups, mounts, daemons, mdloop)
        for rep in range(a.repeat):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for v in order:
                t0, l0 = time.time(), os.getloadavg()[0]
                results[v].append(b.all(v, rep))
                got = results[v][-1]
                summary = ", ".join(f"{k} {num(r['value'])}" for k, r in got.items() if r)
                print(f"repetition {rep + 1}, {v} ({time.time() - t0:.0f} s, load {l0:.2f}): {summary}", flush=True)
        if a.stats and "uring" in variants:  # the Go prototype, while enable_uring is on
            print("the Go prototype's stat loop (bench/fuseuringstat) …", flush=True)
            r = sh(statbench, "-stats", str(a.stats), "-repeat", str(a.repeat), "-threads", f"1,{a.threads}",
                   check=False)
            if r.returncode != 0:
                sys.exit(f"bench/fuseuringstat failed: {r.stdout}{r.stderr}")
            proto = r.stdout.strip()
            if a.delay_us:  # handlers that wait: what the queue's thread serializes
                print(f"… with handlers that wait {a.delay_us} µs", flush=True)
                r = sh(statbench, "-stats", str(a.stats // 10), "-repeat", str(a.repeat), "-threads", "16",
                       "-delay", f"{a.delay_us}us", "-readers", "16", "-entries", "16", check=False)
                if r.returncode != 0:
                    sys.exit(f"bench/fuseuringstat -delay failed: {r.stdout}{r.stderr}")
                proto_delay = r.stdout.strip()
    finally:
        for d in daemons.values():
            d.close()
        groups.close()
        if xfs:
            xfs.close()
        elif not a.dir:
            shutil.rmtree(work, ignore_errors=True)
        if param0 is not None and param0 != "Y":
            with open(URING_PARAM, "w") as f:
                f.write(param0 + "\n")
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed, load1 = time.time() - started, os.getloadavg()
    loads = [r["load"] for v in variants for rep in results[v] for r in rep.values() if r]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "failures": b.failures, "results": results}, f,
                      indent=1)
    med = summarize(results, variants, a)
    tab, sav, gfsav = table(med, variants, a), savings(med, a), savings(med, a, "gfdev", "gfuring")
    load_note = (f"load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end, {min(loads):.2f}–"
                 f"{max(loads):.2f} at the runs' starts" if loads else "")
    failed = "".join(f"- {f}\n" for f in b.failures) if b else ""
    print("\n" + tab + "\n\nio_uring against /dev/fuse (same daemon), CPU per operation daemon + workload:\n\n" + sav)
    if gfsav:
        print("go-fuse's iouring branch, io_uring against /dev/fuse:\n\n" + gfsav)
    if proto:
        print("The Go prototype (internal/fuseuring, bench/fuseuringstat), a stat loop:\n\n" + proto + "\n")
    if proto_delay:
        print(f"The same with handlers that wait {a.delay_us} µs:\n\n" + proto_delay + "\n")
    print("".join(f"note: {n}\n" for n in notes) + (("Failures:\n" + failed) if failed else ""))
    print(f"{elapsed / 60:.1f} minutes; {load_note}")
    if not a.write:
        return
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = " ".join(["sudo python3 bench/fuse_uring_bench.py"] +
                   ["LIBFUSE_SRC" if x == a.libfuse_src else "GOFUSE_SRC" if x == a.gofuse_src else x
                    for x in sys.argv[1:] if x != "--write"])
    write_section("fuse-uring", (
        "## FUSE over io_uring: what it would buy (issue 21, item 4)\n\n"
        f"Measured {when} on {os.cpu_count()} cores, Linux {platform.release()}, with `{cmd} --write` (LIBFUSE_SRC: "
        f"a clone of https://github.com/libfuse/libfuse, libfuse {libfuse_version}) in {elapsed / 60:.0f} minutes, on {fs_note}; go-fuse {gofuse.group(1) if gofuse else '?'}. "
        f"Medians of {a.repeat} repetition{'s' if a.repeat > 1 else ''}, the variants in turns; {load_note} (2 cores shared with other work: "
        "compare the variants, measured in turns, more than the absolute figures).\n\n"
        "dev and uring are libfuse's `example/passthrough_hp --nopassthrough --nosplice` (every read and write a "
        "FUSE request), the same daemon over /dev/fuse and with `-o io_uring` (its FUSE_INIT status said "
        "`io_uring=on`); go-fuse is bench/fusefloor, issue 21's FUSE floor"
        + ("; gfdev and gfuring are bench/fusefloor built against GOFUSE_SRC, a tree of go-fuse's experimental "
           "`iouring` branch (github.com/hanwen/go-fuse, not in a release), without and with its "
           "`MountOptions.EnableIoUring`" if a.gofuse_src else "") + ". The metadata rows are mdtest-easy's "
        f"phases on {a.files} empty files (a directory per thread), by a C loop (the script's MDLOOP) with 1 and "
        f"{a.threads} threads, each phase a run of its own, the stat phase after a drop of the dentry and inode "
        "caches (else no request reaches the daemon); fio: one process, O_DIRECT, a "
        f"{a.size_mib} MiB file, {a.runtime} s per run.\n\n"
        "Each cell: the median rate (uring's also against dev); for psync the mean latency per I/O; the CPU per "
        "operation (per MiB for the sequential rows) of the daemon + the workload (the daemon's share first), from "
        "the cgroup accounting; the daemon's context switches per operation "
        "(cs) and, for uring, the completions on its rings per operation (CQE: its FUSE requests).\n\n"
        f"{tab}\n\nio_uring against /dev/fuse, the same daemon (CPU per operation, daemon + workload):\n\n{sav}\n"
        + (f"go-fuse's iouring branch (GOFUSE_SRC), io_uring against /dev/fuse:\n\n{gfsav}\n" if gfsav else "")
        + (("### The Go prototype: a stat loop\n\ninternal/fuseuring serves a fixed tree (files of known sizes, entry and "
            "attribute timeouts 0: each stat is a LOOKUP and a GETATTR) over io_uring (a ring per CPU queue, served "
            "inline by a goroutine locked to a thread pinned to that CPU) and, with the same handler, over /dev/fuse "
            "(2 goroutines reading it, one writev per answer); go-fuse v2's fs package serves the same tree. "
            f"`bench/fuseuringstat -stats {a.stats} -repeat {a.repeat} -threads 1,{a.threads}`: the stat loop in a "
            "child process; each cell the median rate, the CPU per stat of the server + the loop (core-µs, getrusage), "
            "the requests per stat the prototype counted. Its io_uring is measured twice: each request handled on "
            "its queue's thread (as libfuse and go-fuse's branch do), and on a goroutine of its own whose answer "
            "goes back to the queue's thread through an eventfd the ring polls (what a handler that waits needs).\n\n"
            + proto + "\n\n") if proto else "")
        + ((f"With every LOOKUP and GETATTR blocked {a.delay_us} µs in nanosleep (a handler waiting on the "
            "network; 16 threads, 16 ring entries per CPU queue, 16 goroutines reading /dev/fuse; go-fuse left "
            "out):\n\n"
            + proto_delay + "\n\n") if proto_delay else "")
        + "".join(f"Note: {n}\n\n" for n in notes)
        + ("Failed runs (left out of the medians):\n\n" + failed + "\n" if failed else "")))


if __name__ == "__main__":
    main()
