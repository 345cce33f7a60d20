#!/usr/bin/env python3
"""libdatawarp: a checkpoint staged out through DataWarp's API, against cp, in one job.

Prints the figures and writes them into BENCHMARKS.md between <!-- libdatawarp:begin --> and
<!-- libdatawarp:end -->. In one `spillway run` job (a one-machine home, no workload manager),
a C program linked with libdatawarp (built from libdatawarp/ for the run):

  (a) writes a --size-mib checkpoint into $DW_JOB_STRIPED (fsync'd, not timed);
  (b) stages it out with dw_stage_file_out(..., DW_STAGE_IMMEDIATE) and waits with
      dw_wait_file_stage: the time of the call alone (the request is recorded and the job
      goes on) and until the copy is on the PFS (the stage worker fsyncs it, DataWarp's rule);
  (c) copies the same file with cp, and with cp then sync FILE (the same durability as (b));
  (d) calls dw_query_file_stage --queries times on the staged file: its latency;
  (e) per-call cost, against the old path: --calls dw_query_file_stage calls on a staged file,
      then --files dw_stage_file_in calls in a row, one small PFS file each (AXL's pattern: one
      call per file), the dispatch alone (the copies are waited for afterwards, untimed), then
      a dw_stage_file_out AT_JOB_END of each of those files and its revoke (requests that
      start no copy);
  (f) the same calls over TCP with MUNGE (unless --no-tcp; needs munged): a controller and an
      agent started as daemons, the controller listening on TCP, two munged with one key:
      with this library (it speaks to the controller itself, with a credential from munged)
      and with the library of --baseline-rev (built from git: each call runs `spillway dwcli
      stage --json`), in the same job, alternating, after a first run not counted (the
      daemons' warm-up); and, the control, this library on the same daemons' Unix socket (no
      TCP, no MUNGE): what TCP and MUNGE add to a call.

(b) and (c) alternate, --runs times each, each after a drop of the page cache (as root), so
that every copy reads the checkpoint from the disk; medians are reported. The PFS stand-in and the
pool's SSD path are directories of the same file system (--dir).

Usage: sudo python3 bench/libdatawarp_bench.py [--binary bin/spillway] [--size-mib 1024]
                                               [--runs 3] [--queries 50] [--calls 200] [--files 100]
                                               [--baseline-rev 968fcb3] [--no-tcp] [--dir DIR] [--no-write]
Needs cc, make, and a built binary (scripts/install-deps builds it).
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks_md import write_section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOBODY = 65534  # (f)'s job's user

PROGRAM = r"""
#define _GNU_SOURCE
#include <datawarp.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
/* drop the page cache (as root): every copy reads the checkpoint from the disk */
static void drop(void) { sync(); int fd = open("/proc/sys/vm/drop_caches", O_WRONLY); if (fd >= 0) { if (write(fd, "3", 1) < 0) {} close(fd); } }
static void must(int rc, const char *what) { if (rc != 0) { fprintf(stderr, "%s: %s\n", what, strerror(-rc)); exit(1); } }

int main(int argc, char **argv)
{
	long mib = atol(argv[1]), i;
	int runs = atoi(argv[3]), queries = atoi(argv[4]), r;
	const char *pfs = argv[2], *bb = getenv("DW_JOB_STRIPED");
	char src[4096], dst[4096], cmd[16384];
	static char chunk[1 << 20];
	memset(chunk, 'c', sizeof(chunk));
	snprintf(src, sizeof(src), "%sckpt", bb);
	int fd = open(src, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	for (i = 0; i < mib; i++)
		if (write(fd, chunk, sizeof(chunk)) != (ssize_t)sizeof(chunk)) { perror("write"); return 1; }
	fsync(fd);
	close(fd);
	printf("{\"runs\": [");
	for (r = 0; r < runs; r++) {
		double t0, call, api, cp, cpsync;
		snprintf(dst, sizeof(dst), "%s/ckpt.api", pfs);
		drop();
		t0 = now();
		must(dw_stage_file_out(src, dst, DW_STAGE_IMMEDIATE), "dw_stage_file_out");
		call = now() - t0;
		must(dw_wait_file_stage(src), "dw_wait_file_stage");
		api = now() - t0;
		snprintf(cmd, sizeof(cmd), "cp %s %s/ckpt.cp", src, pfs);
		drop();
		t0 = now();
		if (system(cmd) != 0) return 1;
		cp = now() - t0;
		snprintf(cmd, sizeof(cmd), "rm -f %s/ckpt.cp", pfs);
		if (system(cmd) != 0) return 1;
		snprintf(cmd, sizeof(cmd), "cp %s %s/ckpt.cp && sync %s/ckpt.cp", src, pfs, pfs);
		drop();
		t0 = now();
		if (system(cmd) != 0) return 1;
		cpsync = now() - t0;
		printf("%s{\"call\": %.6f, \"api\": %.6f, \"cp\": %.6f, \"cp_sync\": %.6f}", r ? ", " : "", call, api, cp, cpsync);
		snprintf(cmd, sizeof(cmd), "rm -f %s/ckpt.api %s/ckpt.cp", pfs, pfs);
		if (system(cmd) != 0) return 1;
	}
	printf("], \"query\": [");
	for (r = 0; r < queries; r++) {
		int c, p, d, f;
		double t0 = now();
		must(dw_query_file_stage(src, &c, &p, &d, &f), "dw_query_file_stage");
		printf("%s%.6f", r ? ", " : "", now() - t0);
	}
	printf("]}\n");
	return 0;
}
"""


CALLS = r"""
#define _GNU_SOURCE
#include <datawarp.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void must(int rc, const char *what) { if (rc != 0) { fprintf(stderr, "%s: %s\n", what, strerror(-rc)); exit(1); } }

/* calls PFS_DIR QUERIES FILES TAG: per-call latency of dw_query_file_stage, of
   dw_stage_file_in's dispatch, of dw_stage_file_out AT_JOB_END and of its revoke, one JSON
   line. */
int main(int argc, char **argv)
{
	const char *pfs = argv[1], *tag = argv[4], *bb = getenv("DW_JOB_STRIPED");
	int queries = atoi(argv[2]), files = atoi(argv[3]), i, c, p, d, f;
	char src[4096], dst[4096];
	snprintf(src, sizeof(src), "%sq.%s", bb, tag);
	int fd = open(src, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	if (fd < 0 || write(fd, "q", 1) != 1) { perror(src); return 1; }
	close(fd);
	snprintf(dst, sizeof(dst), "%s/q.%s", pfs, tag);
	must(dw_stage_file_out(src, dst, DW_STAGE_IMMEDIATE), "dw_stage_file_out");
	must(dw_wait_file_stage(src), "dw_wait_file_stage");
	printf("{\"tag\": \"%s\", \"query\": [", tag);
	for (i = 0; i < queries; i++) {
		double t0 = now();
		must(dw_query_file_stage(src, &c, &p, &d, &f), "dw_query_file_stage");
		printf("%s%.6f", i ? ", " : "", now() - t0);
	}
	printf("], \"stage_in\": [");
	for (i = 0; i < files; i++) {
		double t0;
		snprintf(src, sizeof(src), "%sin.%s.%d", bb, tag, i);
		snprintf(dst, sizeof(dst), "%s/small.%d", pfs, i);
		t0 = now();
		must(dw_stage_file_in(src, dst), "dw_stage_file_in");
		printf("%s%.6f", i ? ", " : "", now() - t0);
	}
	printf("]");
	fflush(stdout);
	must(dw_wait_directory_stage(bb), "dw_wait_directory_stage");
	/* requests that start no copy: a stage-out at job end of each file, then its revoke */
	for (int w = 0; w < 2; w++) {
		printf(", \"%s\": [", w ? "revoke" : "at_job_end");
		for (i = 0; i < files; i++) {
			double t0;
			snprintf(src, sizeof(src), "%sin.%s.%d", bb, tag, i);
			snprintf(dst, sizeof(dst), "%s/out.%s.%d", pfs, tag, i);
			t0 = now();
			must(dw_stage_file_out(src, w ? NULL : dst, w ? DW_REVOKE_STAGE_AT_JOB_END : DW_STAGE_AT_JOB_END), "dw_stage_file_out");
			printf("%s%.6f", i ? ", " : "", now() - t0);
		}
		printf("]");
	}
	printf("}\n");
	return 0;
}
"""


def api(sock, method, path, body=None):
    """One request to the controller's Unix socket, as root: (status, decoded JSON)."""
    import http.client
    import socket as socketmod

    class Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socketmod.socket(socketmod.AF_UNIX, socketmod.SOCK_STREAM)
            self.sock.connect(sock)
    c = Conn("spillway", timeout=60)
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else None


def wait_for(what, ok, timeout=60):
    import time
    end = time.time() + timeout
    while time.time() < end:
        try:
            if ok():
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"timed out waiting for {what}")


def cpu_of(pid):
    """CPU seconds of process pid so far: its own (user + system), and its children's, reaped
    (cutime, cstime) or alive (the stage workers an agent keeps between stages)."""
    tick = os.sysconf("SC_CLK_TCK")

    def times(p):
        with open(f"/proc/{p}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return [int(x) for x in fields[11:15]]  # utime, stime, cutime, cstime
    live = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = f.read().split()
        except OSError:
            continue
        for c in children:
            try:
                t = times(c)
                live += sum(t)
            except OSError:
                pass
    u, s, cu, cs = times(pid)
    return (u + s) / tick, (cu + cs + live) / tick


def tcp_calls(a, binary, calls, work, pfs):
    """(f): the calls programs on a compute node's terms: a controller and an agent as daemons
    (`spillway controller`, `spillway agent`), the controller listening on TCP and checking
    MUNGE credentials; the job's calls go to its TCP address with a credential from the node's
    munged (its own daemon, the cluster's key). The job is nobody's and its calls run as nobody,
    as a cluster's jobs run as their users (libdatawarp keeps its connection between calls for
    any user but root). Returns the per-call times as in (e)."""
    import socket as socketmod
    import time
    d = os.path.join(work, "tcp")
    os.makedirs(os.path.join(d, "pfs"), exist_ok=True)
    # the job's user: nobody reaches the programs and the library, and owns the PFS directory
    # (the small files to stage in, the stage-outs' destinations)
    os.chmod(work, 0o755)
    job_pfs = os.path.join(d, "pfs")
    for name in os.listdir(pfs):
        if name.startswith("small."):
            shutil.copy(os.path.join(pfs, name), job_pfs)
    for x in [job_pfs] + [os.path.join(job_pfs, f) for f in os.listdir(job_pfs)]:
        os.chown(x, NOBODY, NOBODY)
    pfs = job_pfs
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    procs = []
    try:
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        socks = {}
        for name in ("munged-controller", "munged-node"):
            socks[name] = os.path.join(d, name + ".sock")
            procs.append(subprocess.Popen(["munged", "-F", "-f", "--socket=" + socks[name], "--key-file=" + key,
                                           "--log-file=" + os.path.join(d, name + ".log"), "--pid-file=" + os.path.join(d, name + ".pid"),
                                           "--seed-file=" + os.path.join(d, name + ".seed")],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_for(name, lambda n=name: os.path.exists(socks[n]))
        s = socketmod.socket()
        s.bind(("127.0.0.1", 0))
        addr = "127.0.0.1:%d" % s.getsockname()[1]
        s.close()
        token = os.path.join(d, "token")
        with open(token, "w") as f:
            f.write("libdw-bench-token\n")
        os.chmod(token, 0o600)
        cfg = os.path.join(d, "spillway.toml")
        with open(cfg, "w") as f:
            f.write(f"""[controller]
state_dir = "{d}/state"
socket = "{d}/controller.sock"
mount_root = "{d}/mounts"
listen = "{addr}"
token_file = "{token}"
munge_socket = "{socks['munged-controller']}"
[stage]
allow_root = true
[agent]
name = "node1"
pool = "wlm_pool"
ssd_path = "{d}/ssd"
capacity = "4GiB"
listen = "unix:{d}/agent.sock"
controller = "unix:{d}/controller.sock"
token_file = "{token}"
[client]
controller = "unix:{d}/controller.sock"
""")
        for name in ("controller", "agent"):
            log = open(os.path.join(d, name + ".log"), "a")
            procs.append(subprocess.Popen([binary, name, "--config", cfg], stdout=log, stderr=log))
        ctl = os.path.join(d, "controller.sock")
        wait_for("the controller", lambda: api(ctl, "GET", "/dw/v1/nodes")[0] == 200)
        wait_for("the agent", lambda: any(n.get("id") == "node1" for n in api(ctl, "GET", "/dw/v1/nodes")[1].get("nodes", [])))
        # an agent presenting its node key is no storage node until the administrator admits it
        api(ctl, "PATCH", "/dw/v1/nodes/node1", {"storage": True})
        wait_for("the agent's pool", lambda: any(n.get("id") == "node1" and n.get("pool") for n in api(ctl, "GET", "/dw/v1/nodes")[1].get("nodes", [])))

        def step(path, body, name):
            for _ in range(300):  # the agent's capacity counts once its heartbeat is in
                code, out = api(ctl, "POST", path, body)
                if code in (200, 202):
                    break
                time.sleep(0.1)
            else:
                sys.exit(f"{name}: {code} {out}")
            wait_for(name, lambda: api(ctl, "GET", f"/dw/v1/sessions/tcp1/status?step={name}&wait=1s")[1].get("done"))
        step("/dw/v1/sessions", {"token": "tcp1", "creator": "BENCH", "owner": NOBODY, "group": NOBODY,
                                 "instance": {"capacity": 1 << 30, "pool": "wlm_pool", "type": "scratch", "access_modes": ["striped"]}}, "setup")
        step("/dw/v1/sessions/tcp1/pre_run", {"nodes": ["node1"]}, "pre_run")
        mount = api(ctl, "GET", "/dw/v1/sessions/tcp1/paths")[1]["paths"]["DW_JOB_STRIPED"]
        node = os.path.join(d, "node.toml")
        with open(node, "w") as f:
            f.write(f'[client]\ncontroller = "http://{addr}"\nmunge_socket = "{socks["munged-node"]}"\n')
        # the control: this library on the same daemons' Unix socket (no TCP, no MUNGE)
        local = os.path.join(d, "local.toml")
        with open(local, "w") as f:
            f.write(f'[client]\ncontroller = "unix:{ctl}"\n')
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/", "SPILLWAY_CONFIG": node, "SPILLWAY_BIN": binary, "DW_JOB_STRIPED": mount}
        kinds = ("query", "stage_in", "at_job_end", "revoke")
        per = {"new": {k: [] for k in kinds}, "old": {k: [] for k in kinds}, "unix": {k: [] for k in kinds}}
        controller_pid, agent_pid = procs[-2].pid, procs[-1].pid
        cpu = {"new": [], "old": [], "unix": []}  # per run: seconds of the controller, the agent, its workers
        # A run first, not counted: the daemons' first calls pay their warm-up (a fresh
        # controller's caches and heap), 0.7-0.9 ms on that run's median stage-in, which the
        # run that happens to go first would carry; a cluster's daemons run for days.
        run(*as_nobody, calls["new"], pfs, str(a.calls), str(a.files), "tcpwarm", env=env)
        for tag in ("new", "unix", "old", "new", "unix"):
            prog = calls["old" if tag == "old" else "new"]
            c0, (a0, w0) = sum(cpu_of(controller_pid)), cpu_of(agent_pid)
            out = run(*as_nobody, prog, pfs, str(a.calls), str(a.files), "tcp" + tag + str(len(per[tag]["query"])),
                      env=dict(env, SPILLWAY_CONFIG=local) if tag == "unix" else env)
            # the copies of the last stage-ins end after the calls: wait for them (the agent
            # idle), then count
            time.sleep(1)
            c1, (a1, w1) = sum(cpu_of(controller_pid)), cpu_of(agent_pid)
            cpu[tag].append((c1 - c0, a1 - a0, w1 - w0))
            line = json.loads(out.stdout.strip().splitlines()[-1])
            for k in kinds:
                per[tag][k] += line[k]
        api(ctl, "POST", "/dw/v1/sessions/tcp1/post_run")
        api(ctl, "POST", "/dw/v1/sessions/tcp1/teardown", {"hurry": True})
        wait_for("the teardown", lambda: not any(x.get("token") == "tcp1" for x in api(ctl, "GET", "/dw/v1/sessions")[1].get("sessions", [])), timeout=120)
        per["cpu"] = cpu
        return per
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for line in open("/proc/mounts"):
            m = line.split()[1]
            if m.startswith(d):
                subprocess.run(["umount", "-l", m], capture_output=True)


def run(*cmd, **kw):
    return subprocess.run(list(cmd), check=True, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"))
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--calls", type=int, default=200, help="(e): dw_query_file_stage calls per library")
    ap.add_argument("--files", type=int, default=100, help="(e): dw_stage_file_in calls per library")
    ap.add_argument("--baseline-rev", default="968fcb3",
                    help="(e): the git revision whose libdatawarp is the old path (default: the last that ran the helper per call)")
    ap.add_argument("--no-tcp", action="store_true", help="skip (f), the calls over TCP with MUNGE (needs munged)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one under /var/tmp)")
    ap.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    a = ap.parse_args()
    if not os.access(a.binary, os.X_OK):
        sys.exit(f"{a.binary} not found: run scripts/install-deps first")
    for tool in ("cc", "make"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found")
    binary = os.path.abspath(a.binary)
    work = a.dir or tempfile.mkdtemp(prefix="spillway-libdw-bench-", dir="/var/tmp")
    home, pfs, build = (os.path.join(work, d) for d in ("home", "pfs", "build"))
    for d in (home, pfs, build):
        os.makedirs(d, exist_ok=True)
    try:
        for f in ("Makefile", "datawarp.c", "datawarp.h", "cray-datawarp.pc.in"):
            shutil.copy(os.path.join(ROOT, "libdatawarp", f), build)
        prefix = os.path.join(work, "prefix")
        run("make", "-s", "-C", build, f"PREFIX={prefix}", "LDCONFIG=true", "install")
        src = os.path.join(work, "bench.c")
        with open(src, "w") as f:
            f.write(PROGRAM)
        prog = os.path.join(work, "bench")
        run("cc", "-O2", "-o", prog, src, f"-I{prefix}/include", f"-L{prefix}/lib", "-ldatawarp", f"-Wl,-rpath,{prefix}/lib")
        # (e): the calls program, linked with this library and with the baseline's
        old_build, old_prefix = os.path.join(work, "build-old"), os.path.join(work, "prefix-old")
        os.makedirs(old_build, exist_ok=True)
        for f in ("Makefile", "datawarp.c", "datawarp.h", "cray-datawarp.pc.in"):
            with open(os.path.join(old_build, f), "w") as out_f:
                out_f.write(run("git", "-C", ROOT, "show", f"{a.baseline_rev}:libdatawarp/{f}").stdout)
        run("make", "-s", "-C", old_build, f"PREFIX={old_prefix}", "LDCONFIG=true", "install")
        calls_src = os.path.join(work, "calls.c")
        with open(calls_src, "w") as f:
            f.write(CALLS)
        calls = {}
        for tag, pre in (("new", prefix), ("old", old_prefix)):
            calls[tag] = os.path.join(work, "calls-" + tag)
            run("cc", "-O2", "-o", calls[tag], calls_src, f"-I{pre}/include", f"-L{pre}/lib", "-ldatawarp", f"-Wl,-rpath,{pre}/lib")
        for i in range(a.files):
            with open(os.path.join(pfs, f"small.{i}"), "w") as f:
                f.write("s" * 4096)
        gib = a.size_mib // 1024 + 2
        with open(os.path.join(home, "spillway.toml"), "w") as f:
            f.write(f"""[controller]
state_dir = "{home}/state"
socket = "{home}/controller.sock"
mount_root = "{home}/mounts"
[agent]
pool = "wlm_pool"
ssd_path = "{home}/ssd"
capacity = "{gib + 1}GiB"
[client]
controller = "unix:{home}/controller.sock"
[stage]
allow_root = true
""")
        job = os.path.join(work, "job.sh")
        with open(job, "w") as f:
            f.write(f"#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity={gib}GiB\n"
                    f"{prog} {a.size_mib} {pfs} {a.runs} {a.queries} || exit 1\n"
                    f"{calls['new']} {pfs} {a.calls} {a.files} new || exit 1\n"
                    f"{calls['old']} {pfs} {a.calls} {a.files} old || exit 1\n"
                    f"{calls['new']} {pfs} {a.calls} {a.files} new2 || exit 1\n")
        os.chmod(job, 0o755)
        env = dict(os.environ, SPILLWAY_HOME=home, SPILLWAY_BIN=binary)
        out = subprocess.run([binary, "run", "--quiet", job], env=env, capture_output=True, text=True)
        subprocess.run([binary, "home", "stop", "--force"], env=env, capture_output=True)
        if out.returncode != 0:
            sys.exit(f"the job failed:\n{out.stdout}\n{out.stderr}")
        lines = [json.loads(l) for l in out.stdout.strip().splitlines() if l.startswith("{")]
        data = lines[0]
        kinds = ("query", "stage_in", "at_job_end", "revoke")
        per = {"new": {k: [] for k in kinds}, "old": {k: [] for k in kinds}}
        for l in lines[1:]:
            for k in kinds:
                per["old" if l["tag"] == "old" else "new"][k] += l[k]
        tcp = None
        if not a.no_tcp and shutil.which("munged"):
            tcp = tcp_calls(a, binary, calls, work, pfs)
    finally:
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(r[k] for r in data["runs"]) for k in ("call", "api", "cp", "cp_sync")}
    q = sorted(data["query"])
    p90 = q[min(len(q) - 1, int(len(q) * 0.9))]
    def pct(xs, f):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(len(xs) * f))]
    def table(per):
        rows = []
        for k, name in (("query", "`dw_query_file_stage`"), ("stage_in", "`dw_stage_file_in`, the dispatch (one small file a call; the copies of the previous ones run meanwhile)"),
                        ("at_job_end", "`dw_stage_file_out(..., DW_STAGE_AT_JOB_END)` (recorded; no copy starts)"),
                        ("revoke", "`dw_stage_file_out(..., DW_REVOKE_STAGE_AT_JOB_END)`")):
            n, o = per["new"][k], per["old"][k]
            mn, mo = statistics.median(n), statistics.median(o)
            rows.append(f"| {name} | {mn * 1000:.2f} ({pct(n, 0.9) * 1000:.2f}) | {len(n) / sum(n):.0f} | "
                        f"{mo * 1000:.1f} ({pct(o, 0.9) * 1000:.1f}) | {len(o) / sum(o):.0f} | {mo / mn:.0f}x |")
        return "\n".join(rows)
    def control(per):
        rows = []
        for k, name in (("query", "`dw_query_file_stage`"), ("stage_in", "`dw_stage_file_in`, the dispatch"),
                        ("at_job_end", "`dw_stage_file_out(..., DW_STAGE_AT_JOB_END)`"),
                        ("revoke", "`dw_stage_file_out(..., DW_REVOKE_STAGE_AT_JOB_END)`")):
            t, u = per["new"][k], per["unix"][k]
            mt, mu = statistics.median(t), statistics.median(u)
            rows.append(f"| {name} | {mt * 1000:.2f} ({pct(t, 0.9) * 1000:.2f}) | {mu * 1000:.2f} ({pct(u, 0.9) * 1000:.2f}) | {(mt - mu) * 1000:+.2f} |")
        return "\n".join(rows)
    def cpu_rows(cpu):
        rows = []
        for tag, name in (("new", "this library over TCP with MUNGE"), ("unix", "this library over the Unix socket"), ("old", "the old path")):
            if cpu[tag]:
                c, ag, w = (statistics.median(r[i] for r in cpu[tag]) * 1000 / a.files for i in range(3))
                rows.append(f"| {name} | {c:.2f} | {ag:.2f} | {w:.2f} |")
        return "\n".join(rows)
    tcp_text = ""
    if tcp is not None:
        tcp_text = f"""
**Over TCP with MUNGE** (f), a cluster's compute node: the controller and an agent as daemons (`spillway controller`, `spillway agent`), the controller listening on TCP; the job is nobody's and its calls run as nobody; the calls name its `http://` address and authenticate with a MUNGE credential (this library: one per connection, asked of munged in its protocol before the call probes its paths, in the process, and the connection kept for the next call; the old path: one per call, the binary asks munged on its socket), two munged daemons with one key standing for the controller's host and the node. Same calls, same counts, after a first run of this library that is not counted (the daemons' warm-up: a cluster's run for days). The controller checks each credential by asking its munged on its socket (munged's client protocol, `internal/munge`: one round trip, no process per request; it ran `unmunge` for each before).

| call | this library: median ms (90th pct) | calls/s | old path: median ms (90th pct) | calls/s | speed-up |
|---|---:|---:|---:|---:|---:|
{table(tcp)}

The same daemons, this library over TCP with MUNGE against over their Unix socket (no credential: the caller is its uid), alternating, the same counts: what TCP and MUNGE add to a call.

| call | over TCP with MUNGE: median ms (90th pct) | over the Unix socket: median ms (90th pct) | difference, ms |
|---|---:|---:|---:|
{control(tcp)}

CPU of the daemons per run of the calls program ({a.calls} queries, {a.files} stage-ins of a 4 KiB file, {a.files} stage-outs at job end and their revokes), from /proc: the controller, the agent itself, and the agent's stage workers (reaped or alive), per stage-in; median of the runs.

| run | controller, ms per stage-in | agent, ms per stage-in | stage workers, ms per stage-in |
|---|---:|---:|---:|
{cpu_rows(tcp["cpu"])}
"""
    rows = table(per)
    small = os.path.join(os.path.dirname(os.path.abspath(binary)), "spillway-stage-worker")
    worker = ("the small `spillway-stage-worker` beside the binary" if os.access(small, os.X_OK)
              else "`spillway stage-worker`: no small `spillway-stage-worker` beside the binary")
    size = f"{a.size_mib} MiB" if a.size_mib % 1024 else f"{a.size_mib // 1024} GiB"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = f"""## libdatawarp: a checkpoint staged out through the API

Measured {when} on {os.cpu_count()} cores, Linux {platform.release()}, with `python3 bench/libdatawarp_bench.py` (one `spillway run` job, a one-machine home; the PFS stand-in and the pool's SSD path on the same file system). Medians of {a.runs} runs, alternating, each copy after a drop of the page cache.

| figure | time | ratio to `cp` + `sync` |
|---|---:|---:|
| `dw_stage_file_out` of a {size} checkpoint, the call alone (the job goes on) | {med['call'] * 1000:.0f} ms | |
| the same, until `dw_wait_file_stage` returns (the copy is on the PFS, fsync'd) | {med['api']:.3f} s | {med['cp_sync'] / med['api']:.2f} |
| `cp` of the same file in the same job | {med['cp']:.3f} s | |
| `cp` then `sync FILE` (the same durability) | {med['cp_sync']:.3f} s | 1.00 |
| `dw_query_file_stage`, median of {len(q)} (90th percentile) | {statistics.median(q) * 1000:.2f} ms ({p90 * 1000:.2f} ms) | |

**Per call** (e), the same job: this library, which speaks to the controller's Unix socket itself (`POST /dw/v1/job_stages`, no child process), against the old path, the library of `{a.baseline_rev}` (each call runs `spillway dwcli stage --json`, which finds the mount and asks the controller); this library ran before and after the old one, {a.calls} queries and {a.files} stage-ins each time; the target is 2 ms a call.

| call | this library: median ms (90th pct) | calls/s | old path: median ms (90th pct) | calls/s | speed-up |
|---|---:|---:|---:|---:|---:|
{rows}

The library's own part of a call (probing the paths, one request on the socket) is well under a millisecond: a query costs the controller's read. A call that records something costs the controller's durable commit besides (the state's SQLite WAL with synchronous=FULL: the request is on the disk before the call returns, as the API promises), and a stage-in's dispatch also shares the machine's cores with the copies of the calls before it: the executor's transactions that start them (the call's goes first: `executor.yield_to_requests`; a burst's calls wake the executor once per `executor.wake_delay`) and their stage workers ({worker}, one process for a burst of one user's stages: a worker is kept between them, `stage.worker_idle_timeout`).
{tcp_text}
Ratio = the baseline's time / the API's (1.00 = as fast as `cp` + `sync`). `cp` in the job reads the checkpoint through the job's FUSE mount; the stage worker reads it on the storage node, beside the mount. Each libdatawarp call is one request to the controller, no child process (the library probes the paths as the job's user, the controller resolves the session and records the stage). The copy itself is the stage worker's, as the job's user, with DataWarp's fsync of the file.
"""
    print(text)
    if not a.no_write:
        write_section("libdatawarp", text)


if __name__ == "__main__":
    main()
