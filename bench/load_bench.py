#!/usr/bin/env python3
"""The controller under a grown state: dw_wlm_cli as Slurm calls it, at 0 to 10,000 persistent
instances and 0 to 1,000 live job sessions (issue 11).

For each row, a fresh state is seeded with the controller stopped (bench/loadseed: objects as
the lifecycle makes them, written through the store's typed tables; the job sessions are set up
and not yet running), then a controller and an agent start as separate processes and each call
is timed as a whole process (exec included), as slurmctld runs it:

- `job_process`, `paths` (of a set-up job), `pools`, `show_sessions`: median and 99th
  percentile of --runs calls;
- an empty job (`#DW jobdw capacity=` one grain, no stages): setup, paths, pre_run, post_run,
  teardown, one after the other; median of --jobs;
- --clients clients each running setup, paths, teardown in a loop for --seconds: job
  lifecycles completed per second;
- the CPU each of those lifecycles cost the controller, the agent, the `dw_wlm_cli` processes
  (three per lifecycle) and this harness: on 2 cores the rate is CPU-bound, and these columns
  say where it goes;
- the controller's resident memory at the end (VmRSS) and its peak (VmHWM).

A home row (--home-rows, counts of persistent instances) measures a one-machine home, the
README's `spillway run`: its server (controller and agent in one process) started as a command
starts it, 4 MiB grains, the persistent instances created through the REST API on the home's
socket (one POST /dw/v1/sessions each, as users make them; nothing seeded), then the median of
`spillway run` on an empty job script, one more on a stopped server (as after
home.idle_timeout: the run starts it), and the same dw_wlm_cli calls as above on the home's
socket. Its table is the section load-home of BENCHMARKS.md.

`dw_wlm_cli` is --wlm-binary (the small binary, bin/dw_wlm_cli, when it is built; else
--binary). --profile DIR writes each row's controller and agent CPU profiles there
(SPILLWAY_CPUPROFILE), and each home row's server's.

Usage: python3 bench/load_bench.py [--binary bin/spillway] [--wlm-binary bin/dw_wlm_cli]
       [--rows 0:0,1000:0,10000:0,0:1000,10000:1000] [--home-rows 0,2000] [--runs 100] [--profile DIR]
       [--label after] [--no-write]
Needs root (the agent mounts the empty job's instance).
"""
import argparse
import datetime
import http.client
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks_md import write_section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pct(times, p):
    times = sorted(times)
    return times[min(len(times) - 1, int(round(p / 100 * len(times) + 0.5)) - 1)]


def rss(pid):
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) / 1024
    return out


def cpu_seconds(pid):
    """user + system CPU time of a running process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def own_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def spawn_cpu(argv, runs=40):
    """The median CPU (ms) one process of argv costs, as the harness starts it: the machine's
    own speed at starting processes, to compare runs on different days."""
    times = []
    for _ in range(runs):
        before = children_cpu()
        subprocess.run(argv, capture_output=True)
        times.append((children_cpu() - before) * 1000)
    return statistics.median(times)


def run_row(a, persistent, jobs):
    d = tempfile.mkdtemp(prefix="spillway-load-bench-", dir="/var/tmp")
    cfg = os.path.join(d, "spillway.toml")
    capacity = 16 << 30
    with open(cfg, "w") as f:
        f.write(f'''[controller]
state_dir = "{d}/state"
socket = "{d}/controller.sock"
mount_root = "{d}/mounts"
[[pool]]
name = "wlm_pool"
granularity = "1MiB"
[stage]
allow_root = true
[agent]
name = "bench1"
pool = "wlm_pool"
ssd_path = "{d}/ssd"
capacity = "{capacity}"
listen = "unix:{d}/agent.sock"
controller = "unix:{d}/controller.sock"
[client]
controller = "unix:{d}/controller.sock"
''')
    seeded = subprocess.run([a.seed, "--config", cfg, "--persistent", str(persistent), "--jobs", str(jobs),
                             "--node", "bench1", "--capacity", str(capacity)], capture_output=True, text=True)
    if seeded.returncode != 0:
        sys.exit(f"seeding: {seeded.stdout}{seeded.stderr}")
    print(f"  {seeded.stdout.strip()}", flush=True)
    link = os.path.join(d, "dw_wlm_cli")
    os.symlink(os.path.abspath(a.wlm_binary), link)
    env = {"PATH": "/usr/bin:/bin", "SPILLWAY_CONFIG": cfg}
    logs = open(os.path.join(d, "daemons.log"), "w")
    daemons = []
    for name in ("controller", "agent"):
        denv = dict(os.environ)
        if a.profile:
            os.makedirs(a.profile, exist_ok=True)
            denv["SPILLWAY_CPUPROFILE"] = os.path.join(os.path.abspath(a.profile), f"{name}-{persistent}-{jobs}.pprof")
        daemons.append(subprocess.Popen([a.binary, name, "--config", cfg], stdout=logs, stderr=logs, env=denv))
    try:
        deadline = time.time() + 120
        while subprocess.run([link, "--function", "pools"], env=env, capture_output=True, text=True).stdout.find('"quantity":16384') < 0:
            if time.time() > deadline:
                sys.exit("the daemons did not come up; see " + logs.name)
            time.sleep(0.2)
        result = measure(a, d, link, env, [p.pid for p in daemons])
    finally:
        for p in daemons:
            p.terminate()
        for p in daemons:
            p.wait(timeout=60)
        subprocess.run(["umount", "-l", "-R", f"{d}/mounts"], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)
    return result


class UnixHTTP(http.client.HTTPConnection):
    """HTTP on a Unix socket (the home's API)."""

    def __init__(self, path):
        super().__init__("home", timeout=120)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(120)
        self.sock.connect(self.unix_path)


def api(conn, method, path, body=None):
    conn.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status >= 300:
        raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
    return json.loads(data) if data else None


def run_home_row(a, persistent):
    """A one-machine home (the README's `spillway run`): its server (controller and agent in
    one process, started on demand as `spillway run` starts it), 4 MiB grains, and persistent
    instances created through the REST API on the home's socket, one request each, as users
    make them; then `spillway run` of an empty job script, and the same dw_wlm_cli calls as
    the daemons' rows, on the home's socket."""
    d = tempfile.mkdtemp(prefix="spillway-load-bench-home-", dir="/var/tmp")
    grain = 4 << 20
    with open(os.path.join(d, "spillway.toml"), "w") as f:
        f.write(f'''[controller]
state_dir = "{d}/state"
socket = "{d}/controller.sock"
mount_root = "{d}/mounts"
max_sessions_per_user = {persistent + 100000}
max_persistent_per_user = {persistent + 100000}
[[pool]]
name = "wlm_pool"
granularity = "4MiB"
[stage]
allow_root = true
[agent]
name = "bench1"
pool = "wlm_pool"
ssd_path = "{d}/ssd"
capacity = "{16384 * grain}"
[client]
controller = "unix:{d}/controller.sock"
[home]
idle_timeout = "1h"
''')
    client_cfg = os.path.join(d, "client.toml")
    with open(client_cfg, "w") as f:
        f.write(f'[client]\ncontroller = "unix:{d}/controller.sock"\n')
    henv = dict(os.environ, SPILLWAY_HOME=d)
    henv.pop("SPILLWAY_CONFIG", None)
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
        henv["SPILLWAY_CPUPROFILE"] = os.path.join(os.path.abspath(a.profile), f"home-{persistent}.pprof")
    result = {}
    try:
        started = subprocess.run([a.binary, "dwstat", "pools"], env=henv, capture_output=True, text=True)
        if started.returncode != 0:
            sys.exit(f"the home's server did not start: {started.stdout}{started.stderr}")
        henv.pop("SPILLWAY_CPUPROFILE", None)  # the server's alone
        with open(os.path.join(d, "server.json")) as f:
            server = json.load(f)["pid"]
        conn = UnixHTTP(os.path.join(d, "controller.sock"))
        t0 = time.perf_counter()
        for i in range(persistent):
            api(conn, "POST", "/dw/v1/sessions", {"token": f"p{i:05d}", "creator": "CLI", "persistent": True, "expiration": -1,
                "instance": {"capacity": grain, "pool": "wlm_pool", "type": "scratch", "access_modes": ["striped"], "optimization_strategy": "bandwidth"}})
        deadline = time.time() + 600
        while True:
            sessions = api(conn, "GET", "/dw/v1/sessions")["sessions"]
            settled = sum(1 for x in sessions if x["state"]["actualized"] and not x["state"]["transitioning"])
            if settled >= persistent:
                break
            if time.time() > deadline:
                sys.exit(f"only {settled} of {persistent} persistent instances were created; see {d}/server.log")
            time.sleep(0.5)
        created = time.perf_counter() - t0
        conn.close()
        print(f"  {persistent} persistent instances created through the API in {created:.1f} s", flush=True)
        result["created"] = persistent / created if persistent else 0
        # spillway run of an empty job, as the README runs it: the median of --jobs, after one
        job = os.path.join(d, "empty.sh")
        with open(job, "w") as f:
            f.write(f"#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity={grain >> 20}MiB\ntrue\n")
        runs = []
        for _ in range(a.jobs + 1):
            t = time.perf_counter()
            p = subprocess.run([a.binary, "run", job], env=henv, capture_output=True, text=True, cwd=d)
            if p.returncode != 0:
                sys.exit(f"spillway run: {p.stdout}{p.stderr}")
            runs.append(time.perf_counter() - t)
        result["run_job"] = statistics.median(runs[1:])
        # The same once the server has exited (idle for home.idle_timeout): the run starts it
        # again, and its start reads the state and the node's fragments.
        subprocess.run([a.binary, "home", "stop"], env=henv, capture_output=True)
        t = time.perf_counter()
        p = subprocess.run([a.binary, "run", job], env=henv, capture_output=True, text=True, cwd=d)
        if p.returncode != 0:
            sys.exit(f"spillway run: {p.stdout}{p.stderr}")
        result["cold_job"] = time.perf_counter() - t
        with open(os.path.join(d, "server.json")) as f:
            server = json.load(f)["pid"]
        link = os.path.join(d, "dw_wlm_cli")
        os.symlink(os.path.abspath(a.wlm_binary), link)
        result.update(measure(a, d, link, {"PATH": "/usr/bin:/bin", "SPILLWAY_CONFIG": client_cfg}, [server]))
    finally:
        subprocess.run([a.binary, "home", "stop", "--force"], env=henv, capture_output=True)
        subprocess.run(["umount", "-l", "-R", f"{d}/mounts"], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)
    return result


def measure(a, d, link, env, pids):
    """The calls, the empty job and the rate, with dw_wlm_cli at link and env, against the
    controller (and agent) processes pids: the first is the one whose memory is reported."""
    result = {}
    script = os.path.join(d, "script")
    with open(script, "w") as f:
        f.write("#!/bin/bash\n#SBATCH -N 1\n#DW jobdw type=scratch access_mode=striped capacity=1MiB\nsrun app\n\0")
    nodefile = os.path.join(d, "nodes")
    with open(nodefile, "w") as f:
        f.write("bench1\n")

    def call(*args):
        p = subprocess.run([link, "--function", *args], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"dw_wlm_cli {' '.join(args)}: {p.stdout}{p.stderr}")

    def timed(*args):
        t0 = time.perf_counter()
        call(*args)
        return time.perf_counter() - t0

    def setup(token):
        call("setup", "--token", token, "--caller", "SLURM", "--user", "0", "--groupid", "0", "--capacity", "wlm_pool:1MiB", "--job", script)

    setup("1")
    calls = {
        "job_process": ("job_process", "--job", script),
        "paths": ("paths", "--job", script, "--token", "1", "--pathfile", os.path.join(d, "path")),
        "pools": ("pools",),
        "show_sessions": ("show_sessions",),
        "show_instances": ("show_instances",),
        "show_configurations": ("show_configurations",),
    }
    for name, args in calls.items():
        call(*args)
        times = [timed(*args) for _ in range(a.runs)]
        result[name] = (statistics.median(times), pct(times, 99))
    call("teardown", "--token", "1", "--job", script, "--hurry")

    def empty_job(token):
        t0 = time.perf_counter()
        setup(token)
        call("paths", "--job", script, "--token", token, "--pathfile", os.path.join(d, "path" + token))
        call("pre_run", "--token", token, "--job", script, "--nodehostnamefile", nodefile)
        call("post_run", "--token", token, "--job", script)
        call("teardown", "--token", token, "--job", script)
        return time.perf_counter() - t0

    result["empty_job"] = statistics.median([empty_job(str(100 + i)) for i in range(a.jobs)])

    done, errors, stop = [0], [], time.time() + a.seconds
    lock = threading.Lock()

    def client(c):
        i = 0
        while time.time() < stop:
            token = str(1000000 + c * 100000 + i)
            i += 1
            try:
                setup(token)
                call("paths", "--job", script, "--token", token, "--pathfile", os.path.join(d, "p" + token))
                call("teardown", "--token", token, "--job", script)
            except RuntimeError as e:
                with lock:
                    errors.append(str(e))
                return
            with lock:
                done[0] += 1

    cpu0 = [cpu_seconds(p) for p in pids] + [children_cpu(), own_cpu()]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result["rate"] = done[0] / (time.perf_counter() - t0)
    cpu1 = [cpu_seconds(p) for p in pids] + [children_cpu(), own_cpu()]
    # CPU per lifecycle, in ms: controller, agent, dw_wlm_cli processes, this harness
    result["cpu"] = [(after - before) * 1000 / max(done[0], 1) for before, after in zip(cpu0, cpu1)]
    if errors:
        print(f"  {len(errors)} clients stopped on an error, the first: {errors[0][:300]}")
    result["mem"] = rss(pids[0])
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"))
    ap.add_argument("--wlm-binary", default="", help="the dw_wlm_cli run as Slurm runs it (default: bin/dw_wlm_cli if built, else --binary)")
    ap.add_argument("--profile", default="", help="write the daemons' CPU profiles into this directory")
    ap.add_argument("--seed", default=os.path.join(ROOT, "bin", "loadseed"), help="bench/loadseed built (go build -o bin/loadseed ./bench/loadseed)")
    ap.add_argument("--rows", default="0:0,1000:0,10000:0,0:1000,10000:1000", help="persistent:jobs,... of the daemons' rows ('' none)")
    ap.add_argument("--home-rows", default="0,2000", help="persistent instances of each home row, made through the API: N,... ('' none)")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--label", default="", help="a word naming the build measured (before/after)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    if not a.wlm_binary:
        small = os.path.join(ROOT, "bin", "dw_wlm_cli")
        a.wlm_binary = small if os.path.exists(small) else a.binary
    if os.geteuid() != 0:
        sys.exit("run as root: the agent mounts instances")
    calibration = (spawn_cpu(["/bin/true"]), spawn_cpu([a.wlm_binary, "--help"]))
    print(f"this machine: /bin/true costs {calibration[0]:.2f} ms of CPU per process, `{os.path.basename(a.wlm_binary)} --help` {calibration[1]:.2f} ms", flush=True)
    rows = []
    for spec in filter(None, a.rows.split(",")):
        persistent, jobs = (int(x) for x in spec.split(":"))
        print(f"{persistent} persistent instances, {jobs} live job sessions", flush=True)
        r = run_row(a, persistent, jobs)
        rows.append((persistent, jobs, r))
        print(f"  {r}", flush=True)
    home_rows = []
    for spec in filter(None, a.home_rows.split(",")):
        persistent = int(spec)
        print(f"a home with {persistent} persistent instances made through the API", flush=True)
        r = run_home_row(a, persistent)
        home_rows.append((persistent, r))
        print(f"  {r}", flush=True)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ms = lambda s: f"{s*1000:.0f}" if s >= 0.1 else f"{s*1000:.1f}"
    label = f" ({a.label})" if a.label else ""
    wlm = os.path.basename(a.wlm_binary)
    machine = (f"This machine's speed at starting processes, measured in the same run: `/bin/true` costs "
               f"{calibration[0]:.2f} ms of CPU, `{wlm} --help` {calibration[1]:.2f} ms.")
    calls = ("job_process", "paths", "pools", "show_sessions", "show_instances", "show_configurations")
    if rows:
        lines = [f"## The controller under a grown state{label}", "",
                 f"Measured {now} on {os.cpu_count()} cores with `python3 bench/load_bench.py --runs {a.runs} --jobs {a.jobs} "
                 f"--clients {a.clients} --seconds {a.seconds:g}` (SQLite; state seeded by bench/loadseed; controller and agent as separate "
                 f"processes; each call a whole dw_wlm_cli process). Times in ms, median / 99th percentile; the empty job is "
                 f"setup, paths, pre_run, post_run, teardown (median of {a.jobs}); the rate is setup, paths, teardown lifecycles "
                 f"per second over {a.clients} concurrent clients, and the CPU milliseconds each of them cost the controller, "
                 f"the agent, the three `{wlm}` processes and the harness. " + machine, "",
                 "| persistent | live jobs | `job_process` | `paths` | `pools` | `show_sessions` | `show_instances` | `show_configurations` | empty job | lifecycles/s | CPU ms per lifecycle: controller / agent / dw_wlm_cli / harness | controller RSS / peak (MiB) |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for persistent, jobs, r in rows:
            cells = [f"{ms(r[n][0])} / {ms(r[n][1])}" for n in calls]
            cpu = " / ".join(f"{x:.1f}" for x in r["cpu"])
            lines.append(f"| {persistent:,} | {jobs:,} | " + " | ".join(cells) +
                         f" | {ms(r['empty_job'])} | {r['rate']:.1f} | {cpu} | {r['mem']['VmRSS']:.0f} / {r['mem']['VmHWM']:.0f} |")
        text = "\n".join(lines)
        print(text)
        if not a.no_write:
            write_section("load" + ("-" + a.label if a.label else ""), text)
    if home_rows:
        lines = [f"## A home under a grown state{label}", "",
                 f"Measured {now} on {os.cpu_count()} cores with `python3 bench/load_bench.py --rows '' --home-rows "
                 f"{a.home_rows} --runs {a.runs} --jobs {a.jobs} --clients {a.clients} --seconds {a.seconds:g}`: a one-machine "
                 f"home (`spillway run`'s; controller and agent in its server, one process; SQLite; 4 MiB grains) whose "
                 f"persistent instances were created through the REST API on its socket, one request each (the rate they "
                 f"were created at, settled, is given). `spillway run` is the README's command on an empty job script "
                 f"(`#DW jobdw capacity=4MiB`, `true`), whole process, median of {a.jobs}, and once on a stopped server "
                 f"(as after home.idle_timeout: the run starts it); the other columns are the "
                 f"daemons' rows' dw_wlm_cli calls on the home's socket, in ms, median / 99th percentile, the empty job "
                 f"setup, paths, pre_run, post_run, teardown, and the CPU ms per lifecycle of the home's server, the three "
                 f"`{wlm}` processes and the harness. " + machine, "",
                 "| persistent (API) | created/s | `spillway run` empty job | the same, server stopped | `job_process` | `paths` | `pools` | `show_sessions` | `show_instances` | `show_configurations` | empty job | lifecycles/s | CPU ms per lifecycle: server / dw_wlm_cli / harness | server RSS / peak (MiB) |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for persistent, r in home_rows:
            cells = [f"{ms(r[n][0])} / {ms(r[n][1])}" for n in calls]
            cpu = " / ".join(f"{x:.1f}" for x in r["cpu"])
            created = f"{r['created']:.0f}" if persistent else "–"
            lines.append(f"| {persistent:,} | {created} | {ms(r['run_job'])} | {ms(r['cold_job'])} | " + " | ".join(cells) +
                         f" | {ms(r['empty_job'])} | {r['rate']:.1f} | {cpu} | {r['mem']['VmRSS']:.0f} / {r['mem']['VmHWM']:.0f} |")
        text = "\n".join(lines)
        print(text)
        if not a.no_write:
            write_section("load-home" + ("-" + a.label if a.label else ""), text)

if __name__ == "__main__":
    main()
