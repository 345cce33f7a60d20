#!/usr/bin/env python3
"""What a burst buffer costs a job under a real Slurm.

Brings up Debian's Slurm driving Spillway on this machine (deploy/single-host/up.sh), then
submits, one after the other, N jobs of each kind as an ordinary user and times each from
`sbatch` to the end of its stage-out and teardown:

  plain      no burst buffer (Slurm's own floor)
  jobdw      #DW jobdw 1GiB, nothing staged
  staged     #DW jobdw 1GiB + stage_in of a 1 MiB file + stage_out of a 1 MiB file
  staged-1G  #DW jobdw 2GiB + stage_in of a 1 GiB file (compared with `cp` of the same file)

It also reads how long each dw_wlm_cli call took as Slurm itself timed it (slurmctld logs
"<function> ran for usec=N" with DebugFlags=BurstBuffer). Figures go to BENCHMARKS.md between
<!-- slurm:begin --> and <!-- slurm:end -->.

Usage: python3 bench/slurm_bench.py [--runs 5] [--no-write]
Needs root, and Slurm installed (scripts/install-deps --test).
"""
import argparse
import collections
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks_md import write_section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER = "spwbench"


def sh(args, env=None, user=None, cwd=None, check=True):
    if user:
        args = ["runuser", "-u", user, "--"] + args
    r = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def job_state(jid, env):
    out = sh(["scontrol", "-o", "show", "job", jid], env=env, check=False).stdout
    st = re.search(r"\bJobState=(\S+)", out)
    bb = re.search(r"\bBurstBufferState=(\S+)", out)
    return (st.group(1) if st else ""), (bb.group(1) if bb else "")


def run_job(script_path, env, pfs):
    t0 = time.monotonic()
    jid = sh(["sbatch", "--parsable", script_path], env=env, user=USER, cwd=pfs).stdout.strip().split(";")[0]
    while True:
        st, bb = job_state(jid, env)
        if st in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") and bb in ("", "complete"):
            if st != "COMPLETED":
                raise RuntimeError(f"job {jid} ended {st}")
            return jid, time.monotonic() - t0
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"))
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: it starts slurmctld, slurmd, munged and Spillway's daemons")
    d = tempfile.mkdtemp(prefix="spillway-slurm-bench-", dir="/var/tmp")
    os.rmdir(d)  # up.sh makes it
    up = [os.path.join(ROOT, "deploy/single-host/up.sh"), "--dir", d, "--user", USER, "--no-install",
          "--spillway", os.path.abspath(a.binary), "--capacity", "8GiB"]
    sh(up)
    env = {"PATH": f"{d}/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": f"{d}/etc/slurm.conf",
           "SPILLWAY_CONFIG": f"{d}/etc/spillway.toml", "LANG": "C"}
    pfs = os.path.join(d, "pfs", USER)
    results = collections.OrderedDict()
    try:
        def write(name, body, mode=0o755):
            p = os.path.join(pfs, name)
            with open(p, "w") as f:
                f.write(body)
            os.chmod(p, mode)
            shutil.chown(p, USER, USER)
            return p
        small = write("small.in", "x" * (1 << 20), 0o644)
        big = os.path.join(pfs, "big.in")
        with open(big, "wb") as f:
            for _ in range(1024):
                f.write(os.urandom(1 << 20))
        shutil.chown(big, USER, USER)
        jobs = collections.OrderedDict([
            ("plain", write("plain.sh", "#!/bin/bash\ntrue\n")),
            ("jobdw", write("jobdw.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\ntrue\n")),
            ("staged", write("staged.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n"
                             f"#DW stage_in type=file source={small} destination=$DW_JOB_STRIPED/in\n"
                             f"#DW stage_out type=file source=$DW_JOB_STRIPED/out destination={pfs}/out-%j\n"
                             "cp \"$DW_JOB_STRIPED/in\" \"$DW_JOB_STRIPED/out\"\n")),
            ("staged-1G", write("big.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=2GiB\n"
                                f"#DW stage_in type=file source={big} destination=$DW_JOB_STRIPED/in\ntrue\n")),
        ])
        ids = collections.defaultdict(list)
        for name, path in jobs.items():
            run_job(path, env, pfs)  # warm-up, not counted
            times = []
            for _ in range(a.runs):
                jid, t = run_job(path, env, pfs)
                times.append(t)
                ids[name].append(jid)
            results[name] = statistics.median(times)
        # The same 1 GiB copied by cp into the same file system (page cache warm, like the stage).
        cps = []
        for _ in range(3):
            t0 = time.monotonic()
            sh(["cp", big, os.path.join(d, "spillway", "ssd", "cp-baseline")])
            sh(["sync", "-f", os.path.join(d, "spillway", "ssd", "cp-baseline")])
            cps.append(time.monotonic() - t0)
            os.remove(os.path.join(d, "spillway", "ssd", "cp-baseline"))
        cp_time = statistics.median(cps)
        # Slurm's own timing of each call: per job where the log names it, else per call.
        log = open(os.path.join(d, "log", "slurmctld.log")).read()
        kind_of = {jid: name for name, jids in ids.items() for jid in jids}
        per_kind = collections.defaultdict(lambda: collections.defaultdict(list))
        calls = collections.defaultdict(list)
        for m in re.finditer(r"(\w+) for (?:job )?JobId=(\d+) ran for usec=(\d+)|: (\w+) ran for usec=(\d+)", log):
            fn = (m.group(1) or m.group(4)).removeprefix("dws_")
            usec = int(m.group(3) or m.group(5))
            calls[fn].append(usec / 1e6)
            if m.group(2) in kind_of:
                per_kind[kind_of[m.group(2)]][fn].append(usec / 1e6)
    finally:
        sh([os.path.join(ROOT, "deploy/single-host/down.sh"), "--dir", d], check=False)

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["## A job under Slurm: what the burst buffer adds", "",
             f"Measured {now} on {os.cpu_count()} cores with `python3 bench/slurm_bench.py` (Debian's Slurm 22.05, "
             "burst_buffer/datawarp, driving a Spillway controller and agent on the same host, brought up by "
             f"deploy/single-host/up.sh; `SchedulerParameters=sched_interval=2`). Each job from `sbatch` to the end of its "
             f"teardown, median of {a.runs}, one job at a time.", "",
             "| job | sbatch → torn down | added to a plain job |", "|---|---:|---:|"]
    plain = results["plain"]
    for name, t in results.items():
        lines.append(f"| {name} | {t:.2f} s | {'' if name == 'plain' else f'{t - plain:+.2f} s'} |")
    lines += ["", f"`cp` + `sync -f` of the same 1 GiB file onto the storage node's file system: {cp_time:.2f} s.", "",
              "The calls Slurm waits for, as slurmctld timed them (`ran for usec=` in its log), median per job kind:", "",
              "| job | setup | data_in | pre_run | post_run | data_out | teardown |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in results:
        if name == "plain":
            continue
        k = per_kind[name]
        cell = lambda fn: f"{statistics.median(k[fn])*1000:.0f} ms" if k.get(fn) else "–"
        lines.append(f"| {name} | " + " | ".join(cell(fn) for fn in ("setup", "data_in", "pre_run", "post_run", "data_out", "teardown")) + " |")
    lines += ["", "Calls logged without a job id (every call of the run, warm-ups included):", "",
              "| call | median | max | calls |", "|---|---:|---:|---:|"]
    for fn in ("job_process", "paths", "real_size", "pools", "show_sessions", "show_instances", "show_configurations"):
        if calls.get(fn):
            v = calls[fn]
            lines.append(f"| `{fn}` | {statistics.median(v)*1000:.0f} ms | {max(v)*1000:.0f} ms | {len(v)} |")
    text = "\n".join(lines)
    print(text)
    if not a.no_write:
        write_section("slurm", text)

if __name__ == "__main__":
    main()
