#!/usr/bin/env python3
"""Swap on the burst buffer (issue 22's benchmark): page-out and page-in bandwidth of a process
twice its memory cgroup's limit, through a co-located swap area, a remote swap area, and a
plain swap file on the storage node's raw file system, in the same run.

Prints the figures and writes them into BENCHMARKS.md between <!-- swap:begin --> and
<!-- swap:end -->. The areas are made by the agent's own code (AttachSwap/DetachSwap, driven
by the Go program bench/swapbench, as the job path is not on this branch):

  * raw: a swap file on the file system of --dir (fallocate, mkswap, swapon): the kernel's own
    swap-file path, no loop device, no Spillway; the baseline;
  * co-located: an agent with a storage role on this host, a fragment (agent.fragment_filesystem
    "directory") under --dir, the area's file in its namespace, a direct-I/O loop device;
  * remote: a storage agent in a network namespace of its own (host s1, a veth pair to this
    host, uncapped) serves the namespace over warpfs; this host's compute agent mounts it and
    the area's file is reached through that mount (FUSE, direct I/O), its memory locked.

The process (the hog, in a v1 memory cgroup of --limit-mib, memory.swappiness 60) touches
--hog-mib of anonymous memory (each page written once), then reads every page back and checks
it. Page-out: the bytes paged out while it touched (/proc/vmstat pswpout) over that phase's
time. Page-in: the bytes paged in while it read back (pswpin) over that phase's time; the
cgroup is still at its limit then, so reading a page back pushes another out: the bytes paged
out during that phase are shown too. Each kind runs --runs times in turn; the figures are the
medians, each run's beside them.

Usage: sudo python3 bench/swap_bench.py [--dir /var/tmp/spillway-swapbench] [--runs 3]
                                        [--limit-mib 512] [--hog-mib 1024]
Needs root, cgroup v1 memory, loop devices, iproute2, util-linux (mkswap, swapon, swapoff),
Go (to build bench/swapbench). Takes /tmp/spillway-netns.lock as the e2e tests do; each
measurement takes /run/spillway-swaptest.lock as the swap tests do. A run with the defaults
lasts about a minute.
"""
import argparse
import datetime
import fcntl
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from benchmarks_md import ROOT, write_section

NS = f"swb-s1-{os.getpid()}"
HOST_IF, NS_IF = "swbh%d" % (os.getpid() % 10000), "swbn%d" % (os.getpid() % 10000)
HOST_IP, NS_IP = "10.231.0.1", "10.231.0.2"
PORT = 7702
TOKEN = "swap-bench-secret"
KINDS = ("raw", "colocated", "remote")
LABEL = {"raw": "swap file on the raw file system", "colocated": "co-located area", "remote": "remote area (warpfs mount)"}


def sh(*argv, check=True):
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def netns_up():
    sh("ip", "netns", "add", NS)
    sh("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
    sh("ip", "link", "set", NS_IF, "netns", NS)
    sh("ip", "addr", "add", HOST_IP + "/24", "dev", HOST_IF)
    sh("ip", "link", "set", HOST_IF, "up")
    for cmd in (["ip", "addr", "add", NS_IP + "/24", "dev", NS_IF], ["ip", "link", "set", NS_IF, "up"], ["ip", "link", "set", "lo", "up"]):
        sh("ip", "netns", "exec", NS, *cmd)


def netns_down():
    sh("ip", "link", "del", HOST_IF, check=False)
    sh("ip", "netns", "del", NS, check=False)


def run_kind(exe, kind, args):
    argv = [exe, "run", "--mode", kind, "--dir", os.path.join(args.dir, kind), "--limit-mib", str(args.limit_mib), "--hog-mib", str(args.hog_mib)]
    if kind == "remote":
        argv += ["--data", f"{NS_IP}:{PORT}", "--token", TOKEN]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"swapbench run --mode {kind} failed: {p.stderr.strip()}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def mibs(nbytes, secs):
    return nbytes / (1 << 20) / secs if secs > 0 else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/spillway-swapbench")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--limit-mib", type=int, default=512)
    ap.add_argument("--hog-mib", type=int, default=1024)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("swap_bench.py needs root (cgroups, loop devices, swapon, network namespaces)")
    exe = "/tmp/spillway-swapbench"
    subprocess.run(["go", "build", "-o", exe, "./bench/swapbench"], cwd=ROOT, check=True)
    os.makedirs(args.dir, exist_ok=True)
    lock = open("/tmp/spillway-netns.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    server = None
    results = {k: [] for k in KINDS}
    try:
        netns_up()
        server = subprocess.Popen(["ip", "netns", "exec", NS, exe, "serve", "--ssd", os.path.join(args.dir, "storage"),
                                   "--listen", f"{NS_IP}:{PORT}", "--token", TOKEN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the storage agent did not start: " + server.stderr.read())
        for r in range(args.runs):
            for kind in KINDS:
                res = run_kind(exe, kind, args)
                results[kind].append(res)
                print(f"run {r + 1} {kind:9s}: page-out {mibs(res['out_bytes'], res['out_seconds']):7.1f} MiB/s "
                      f"({res['out_bytes'] >> 20} MiB in {res['out_seconds']:.2f} s), page-in {mibs(res['in_bytes'], res['in_seconds']):7.1f} MiB/s "
                      f"({res['in_bytes'] >> 20} MiB in {res['in_seconds']:.2f} s, {res['in_phase_out_bytes'] >> 20} MiB paged out meanwhile)", flush=True)
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        netns_down()
    rows, med = [], {}
    for kind in KINDS:
        outs = [mibs(x["out_bytes"], x["out_seconds"]) for x in results[kind]]
        ins = [mibs(x["in_bytes"], x["in_seconds"]) for x in results[kind]]
        med[kind] = (statistics.median(outs), statistics.median(ins))
        rows.append(f"| {LABEL[kind]} | {med[kind][0]:.0f} | {med[kind][1]:.0f} | "
                    f"{', '.join(f'{v:.0f}' for v in outs)} | {', '.join(f'{v:.0f}' for v in ins)} |")
    raw_out, raw_in = med["raw"]
    ratio = "; ".join(f"{LABEL[k]}: page-out {med[k][0] / raw_out:.2f}x, page-in {med[k][1] / raw_in:.2f}x the raw swap file"
                      for k in ("colocated", "remote") if raw_out > 0 and raw_in > 0)
    spread = max(max(v) / min(v) for kind in KINDS for v in (
        [mibs(x["out_bytes"], x["out_seconds"]) for x in results[kind]], [mibs(x["in_bytes"], x["in_seconds"]) for x in results[kind]]) if min(v) > 0)
    noise = (f"Runs of one kind differ by up to {spread:.1f}x (the disk and the 2 cores are shared with other work): "
             "the medians compare the kinds, not one run." if spread > 1.3 else "")
    print("\n" + ratio)
    kernel = platform.release()
    text = f"""## Swap on the burst buffer (`#DW swap`)

`sudo python3 bench/swap_bench.py --runs {args.runs} --limit-mib {args.limit_mib} --hog-mib {args.hog_mib}` ({datetime.date.today()}, Linux {kernel}, {os.cpu_count()} cores shared with other work, --dir {args.dir}).
A process in a v1 memory cgroup of {args.limit_mib} MiB touches {args.hog_mib} MiB, then reads it all back; the
page-out figure is the bytes paged out while it touched over that time, the page-in figure the
bytes paged in while it read back over that time (/proc/vmstat). Areas made by the agent's
AttachSwap (direct-I/O loop device over a reserved file); the remote one through a warpfs
mount of a storage agent in a network namespace (veth, uncapped), the compute agent's memory
locked. Medians of {args.runs} runs, MiB/s:

| swap on | page-out | page-in | page-out, each run | page-in, each run |
|---|---|---|---|---|
""" + "\n".join(rows) + f"""

{ratio}. {noise}
"""
    write_section("swap", text)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
