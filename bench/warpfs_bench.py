#!/usr/bin/env python3
"""Sequential 1 MiB throughput of Spillway's data paths, against the raw file system, in one run.

Prints the figures and writes them into BENCHMARKS.md between <!-- warpfs:begin --> and
<!-- warpfs:end -->. Measures, with dd (1 MiB blocks, one file of --size-mib):

  (a) the local mount: the job's instance mounted on its own storage node (the storage
      server's code in the agent's process, no network hop);
  (b) the remote mount: the same instance mounted on a compute node in another network
      namespace, reaching the storage node's agent over TCP (warpfs);
  (c) raw: dd on a directory of the same file system as the storage node's SSD path.

Writes are buffered with an fsync at the end (conv=fsync); reads follow a drop of the page
cache (echo 3 > /proc/sys/vm/drop_caches), so they come from the disk. Each is measured with
one dd, and with --streams dd processes on as many files at once (the same total). The
three paths are measured in turns, --runs times after a warm-up; medians are reported, and
ratios to (c).

The cluster is real: a controller, a storage agent (hosta, 10.77.0.2) and a compute-only
agent (hostb, 10.77.0.3), each in its own network and mount namespace (ip netns), a job
created with dw_wlm_cli and mounted on both hosts with pre_run. Everything is removed at the
end, on failure too.

With --tls every host gets a certificate of a CA made for the run (openssl): the APIs speak
TLS and the storage node serves warpfs over TLS (warpfs.tls); the figures go to their own
section (warpfs-tls), to be compared with the plain run's.

Usage: sudo python3 bench/warpfs_bench.py [--binary bin/spillway] [--size-mib 2048] [--runs 3]
                                          [--streams 4] [--dir DIR] [--no-write] [--tls]
Needs root, iproute2, util-linux (nsenter, setpriv), dd, and a built binary
(scripts/install-deps builds it).
"""
import argparse
import datetime
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOBODY = 65534


def sh(*cmd, check=True, **kw):
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, **kw)


class Cluster:
    """A controller (ctl), storage nodes and compute nodes, each a network namespace of its own
    on a bridge, addresses 10.77.0.1, .2, ... in that order."""

    def __init__(self, binary, work, use_tls=False, storage=("hosta",), compute=("hostb",)):
        self.binary, self.work, self.tls = binary, work, use_tls
        self.tag = f"spwbench-{os.getpid()}"
        self.spaces, self.procs = [], {}
        self.storage, self.compute = list(storage), list(compute)
        names = ["ctl"] + self.storage + self.compute
        self.addr = {name: f"10.77.0.{i + 1}" for i, name in enumerate(names)}

    def netns(self):
        sw = self.tag + "-sw"
        sh("ip", "netns", "add", sw)
        self.spaces.append(sw)
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        for name, addr in self.addr.items():
            ns = f"{self.tag}-{name}"
            sh("ip", "netns", "add", ns)
            self.spaces.append(ns)
            sh("ip", "link", "add", "v" + name, "netns", sw, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", sw, "link", "set", "v" + name, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def certificates(self):
        """A CA and one certificate for every host's address, made with openssl."""
        w, a = self.work, self.addr
        ca_key, ca, key, csr, cert = (os.path.join(w, n) for n in ("ca.key", "ca.pem", "host.key", "host.csr", "host.pem"))
        sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
           "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", "/CN=spillway bench CA")
        sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
           "-keyout", key, "-out", csr, "-subj", "/CN=spillway bench host")
        ext = os.path.join(w, "san.ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=" + ",".join("IP:" + ip for ip in a.values()) + "\n")
        sh("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
           "-out", cert, "-days", "1", "-extfile", ext)
        return (f'[tls]\ncert_file = "{cert}"\nkey_file = "{key}"\nca_file = "{ca}"\n'
                f'[warpfs]\ntls = true\n')

    def configs(self, capacity_gib, extra="", storage_extra="", metrics=False, granularity="1GiB"):
        """Writes every host's configuration: extra goes to every file (after the [[pool]]),
        granularity is the pool's grain (an instance takes whole grains, one per storage node),
        storage_extra into the storage nodes' [agent] section (e.g. fragment_filesystem);
        metrics: every agent serves its Prometheus metrics on port 7703 of its address
        (Cluster.metrics reads them)."""
        w, a = self.work, self.addr
        scheme = "https" if self.tls else "http"
        token = os.path.join(w, "token")
        with open(token, "w") as f:
            f.write("bench-secret\n")
        os.chmod(token, 0o600)
        common = (f'[controller]\nstate_dir = "{w}/state"\nsocket = "{w}/controller.sock"\n'
                  f'listen = "{a["ctl"]}:7700"\ntoken_file = "{token}"\nmount_root = "{w}/mounts"\n'
                  f'[client]\ncontroller = "unix:{w}/controller.sock"\n'
                  f'[[pool]]\nname = "wlm_pool"\ngranularity = "{granularity}"\n' + extra)
        if self.tls:
            common += self.certificates()

        def agent(name, storage):
            s = (f'[agent]\nname = "{name}"\nlisten = "{a[name]}:7701"\nadvertise = "{scheme}://{a[name]}:7701"\n'
                 f'controller = "{scheme}://{a["ctl"]}:7700"\ntoken_file = "{token}"\nheartbeat_interval = "1s"\n')
            if metrics:
                s += f'metrics_listen = "{a[name]}:7703"\n'
            if storage:
                s += (f'pool = "wlm_pool"\nssd_path = "{w}/{name}/ssd"\ncapacity = "{capacity_gib}GiB"\n'
                      f'data_listen = "{a[name]}:7702"\n' + storage_extra)
            return s
        self.config = {}
        bodies = {"ctl": common}
        for name in self.storage + self.compute:
            bodies[name] = agent(name, name in self.storage) + common
        for name, body in bodies.items():
            path = os.path.join(w, name + ".toml")
            with open(path, "w") as f:
                f.write(body)
            self.config[name] = path

    def start(self, name, cgroup=None):
        """Starts a host's daemon; cgroup: the cgroup.procs file to start it in (its CPU counted there)."""
        role = "controller" if name == "ctl" else "agent"
        log = open(os.path.join(self.work, name + ".log"), "a")
        self.procs[name] = subprocess.Popen(
            ["ip", "netns", "exec", f"{self.tag}-{name}", self.binary, role, "--config", self.config[name]],
            stdout=log, stderr=log, env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}, preexec_fn=enter_cgroup(cgroup))
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.procs[name].poll() is not None:
                sys.exit(f"{role} of {name} exited; see {log.name}")
            out = self.wlm_try("show_instances") if name == "ctl" else self.node_online(name)
            if out:
                if name in self.storage:
                    self.admit(name)
                return
            time.sleep(0.1)
        sys.exit(f"{name} did not come up")

    def node_online(self, name, storage=False):
        """Whether dwstat shows the node online (storage: and in a pool, admitted)."""
        p = subprocess.run([self.binary, "dwstat", "--config", self.config["ctl"], "nodes"], capture_output=True, text=True)
        for line in p.stdout.splitlines():
            # Storage nodes: node pool online drain gran capacity ...; compute nodes (and
            # storage claims not yet admitted), a table of their own: node role online ...
            f = line.split()
            if f[:1] != [name] or "online" not in f:
                continue
            if not storage:
                return True
            if len(f) >= 6 and f[1] not in ("-", "compute") and f[2] == "online" and "unadmitted" not in f:
                return True
        return False

    def admit(self, name):
        """An agent's heartbeat does not make its host a storage node: the administrator admits it
        (dwcli update node --storage); waits for the next heartbeat to bring its pool and capacity."""
        deadline = time.time() + 30
        while True:
            # Again until it shows: an admission before the node's heartbeat brought its claim
            # has nothing to admit.
            sh(self.binary, "dwcli", "--config", self.config["ctl"], "update", "node", "--name", name, "--storage")
            wait = time.time() + 3
            while time.time() < wait:
                if self.node_online(name, storage=True):
                    return
                time.sleep(0.1)
            if time.time() > deadline:
                sys.exit(f"{name} was admitted but is still not a storage node (dwstat nodes)")

    def wlm_try(self, function, *args):
        p = subprocess.run([self.binary, "dw_wlm_cli", "--function", function, *args], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "SPILLWAY_CONFIG": self.config["ctl"]}, cwd=self.work)
        return p.returncode == 0

    def wlm(self, function, *args):
        p = subprocess.run([self.binary, "dw_wlm_cli", "--function", function, *args], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "SPILLWAY_CONFIG": self.config["ctl"]}, cwd=self.work)
        if p.returncode != 0:
            sys.exit(f"dw_wlm_cli {function}: {p.stdout}{p.stderr}")
        return p.stdout

    def on(self, name, script, user=True, cgroup=None):
        """Runs a shell script inside a host's network and mount namespaces (as the ordinary
        user unless user=False; in the cgroup whose cgroup.procs file is cgroup, if given)."""
        cmd = ["nsenter", "-t", str(self.procs[name].pid), "-m", "-n", "--"]
        if user:
            cmd += ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
        return subprocess.run(cmd + ["/bin/sh", "-c", script], capture_output=True, text=True, cwd="/",
                              preexec_fn=enter_cgroup(cgroup))

    def metrics(self, names, pattern):
        """The samples of the agents' metrics (configs(metrics=True)) whose line matches the regular
        expression pattern (its groups: the labels that key the sample), summed over the hosts
        names: {groups: value}. Read from compute node c1's network namespace."""
        urls = [f"http://{self.addr[n]}:7703/metrics" for n in names]
        script = ("import sys, urllib.request\n"
                  "for u in sys.argv[1:]:\n"
                  "    sys.stdout.write(urllib.request.urlopen(u, timeout=10).read().decode())\n")
        host = self.compute[0]
        r = subprocess.run(["nsenter", "-t", str(self.procs[host].pid), "-n", "--", "python3", "-c", script] + urls,
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"reading the agents' metrics: {r.stderr}")
        out = {}
        for line in r.stdout.splitlines():
            m = re.match(pattern, line)
            if m:
                out[m.groups()] = out.get(m.groups(), 0) + float(line.rsplit(None, 1)[1])
        return out

    def close(self):
        for name in list(reversed(self.compute + self.storage)) + ["ctl"]:
            p = self.procs.get(name)
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for ns in reversed(self.spaces):
            subprocess.run(["ip", "netns", "del", ns])


def enter_cgroup(procs):
    """A preexec_fn that moves the new process into the cgroup whose cgroup.procs file is procs
    (None: stay where it is)."""
    if procs is None:
        return None

    def move():
        with open(procs, "w") as f:
            f.write("0")
    return move


def dd_seconds(result):
    """The seconds dd reports ("... copied, 1.234 s, ...")."""
    m = re.search(r"copied, ([0-9.]+) s", result.stderr)
    if not m:
        sys.exit(f"dd failed: {result.stdout}{result.stderr}")
    return float(m.group(1))


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"))
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--streams", type=int, default=4, help="also measure this many dd processes at once (1: only one)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one under /var/tmp)")
    ap.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    ap.add_argument("--tls", action="store_true", help="TLS on the APIs and warpfs (section warpfs-tls)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark creates network namespaces and drops the page cache")
    if not os.access(a.binary, os.X_OK):
        sys.exit(f"{a.binary} not found: run scripts/install-deps first")
    for tool in ("ip", "nsenter", "setpriv", "dd"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found")
    binary = os.path.abspath(a.binary)
    work = a.dir or tempfile.mkdtemp(prefix="spillway-warpfs-bench-", dir="/var/tmp")
    os.chmod(work, 0o755)
    raw = os.path.join(work, "raw")
    os.makedirs(raw)
    os.chown(raw, NOBODY, NOBODY)
    c = Cluster(binary, work, a.tls)
    count = a.size_mib
    try:
        c.netns()
        c.configs(capacity_gib=max(4, 2 * (count // 1024 + 1)))
        for name in ("ctl", "hosta", "hostb"):
            c.start(name)
        job = os.path.join(work, "job.sh")
        gib = count // 1024 + 1
        with open(job, "w") as f:
            f.write(f"#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity={gib}GiB\n\0")
        nodes = os.path.join(work, "nodes")
        with open(nodes, "w") as f:
            f.write("hosta\nhostb\n")
        c.wlm("setup", "--token", "1", "--caller", "SLURM", "--user", str(NOBODY), "--groupid", str(NOBODY),
              "--capacity", f"wlm_pool:{gib}GiB", "--job", job)
        pathfile = os.path.join(work, "paths")
        c.wlm("paths", "--token", "1", "--job", job, "--pathfile", pathfile)
        mount = open(pathfile).read().strip().split("=", 1)[1].rstrip("/")
        c.wlm("pre_run", "--token", "1", "--job", job, "--nodehostnamefile", nodes)

        # Each target: where dd runs, and the file.
        targets = {
            "raw": ("hosta", os.path.join(raw, "f")),
            "local": ("hosta", os.path.join(mount, "local")),
            "remote": ("hostb", os.path.join(mount, "remote")),
        }
        modes = [(1, "write"), (1, "read"), (a.streams, "write"), (a.streams, "read")] if a.streams > 1 else \
            [(1, "write"), (1, "read")]
        results = {k: {m: [] for m in modes} for k in targets}

        def once(kind, streams):
            """Writes then reads --size-mib through one path with `streams` dd processes."""
            host, path = targets[kind]
            each = count // streams
            files = [f"{path}.{i}" for i in range(streams)]
            rates = {}
            for op in ("write", "read"):
                drop_caches()
                if op == "write":
                    dds = [f"dd if=/dev/zero of={f} bs=1M count={each} conv=fsync 2>/dev/null &" for f in files]
                else:
                    dds = [f"dd if={f} of=/dev/null bs=1M 2>/dev/null &" for f in files]
                # The shell times the whole: from the first dd's start to the last one's end.
                r = c.on(host, "s=$(date +%s.%N); " + " ".join(dds) + " wait; e=$(date +%s.%N); echo $s $e")
                try:
                    start, end = map(float, r.stdout.split())
                except ValueError:
                    sys.exit(f"dd on {host} ({kind}) failed: {r.stdout}{r.stderr}")
                rates[op] = each * streams * 1048576 / (end - start)
            c.on(host, "rm -f " + " ".join(files))
            return rates

        for kind in targets:  # warm-up
            once(kind, 1)
        kinds = list(targets)
        for run in range(a.runs):
            order = kinds[run % 3:] + kinds[:run % 3]  # turns: no path always first
            for kind in order:
                for streams in sorted({m[0] for m in modes}):
                    rates = once(kind, streams)
                    for op, rate in rates.items():
                        results[kind][(streams, op)].append(rate)
                    print(f"run {run + 1}: {kind:6s} {streams} stream(s): write {rates['write'] / 1e6:6.0f} MB/s"
                          f"  read {rates['read'] / 1e6:6.0f} MB/s", flush=True)
        c.wlm("post_run", "--token", "1", "--job", job)
        c.wlm("teardown", "--token", "1", "--job", job)
    finally:
        c.close()
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)

    med = {k: {m: statistics.median(v) for m, v in r.items()} for k, r in results.items()}
    rows = [
        ("(c) raw: dd on the storage node's file system", "raw"),
        ("(a) local mount on the storage node (in-process server)", "local"),
        ("(b) remote mount: compute node → TLS over TCP (veth) → storage node" if a.tls
         else "(b) remote mount: compute node → TCP (veth) → storage node", "remote"),
    ]
    header = "| path |"
    rule = "|---|"
    for streams, op in modes:
        header += f" {op} MB/s, {streams} stream{'s' if streams > 1 else ''} | ratio |"
        rule += "---:|---:|"
    lines = [header, rule]
    for label, k in rows:
        line = f"| {label} |"
        for m in modes:
            line += f" {med[k][m] / 1e6:.0f} | {med[k][m] / med['raw'][m]:.2f} |"
        lines.append(line)
    table = "\n".join(lines)
    print()
    print(table)
    if a.no_write:
        return
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = "## Data path: local and remote mounts (warpfs)\n\n"
    if a.tls:
        title = ("## Data path over TLS (warpfs.tls, `--tls`)\n\n"
                 "The same measurement with TLS on the APIs and on warpfs: compare the remote row's ratio with "
                 "the plain run's above (the local mount never uses TLS).\n\n")
    section = (
        title +
        f"Measured {when} on {os.cpu_count()} cores, Linux {platform.release()}, with "
        f"`sudo python3 bench/warpfs_bench.py` (dd, 1 MiB blocks, {count} MiB in all: one file, or "
        f"{a.streams} files of {count // max(a.streams, 1)} MiB written and read by as many dd processes at once; "
        f"medians of {a.runs} runs after a warm-up, the three paths in turns; the storage node's SSD path and the "
        f"raw directory on the same file system, {os.path.dirname(work)}).\n\n"
        f"{table}\n\n"
        "Write = `dd conv=fsync` (buffered, flushed at the end); read = `dd` after dropping the page cache, "
        "so from the disk; the page cache is dropped before every measurement. Ratio = the path's throughput / raw's (1.00 = as fast as the file system itself). "
        "The remote mount runs the job's process on hostb and the data on hosta, each in its own network "
        "namespace, over a veth pair and a bridge: FUSE on hostb, one TCP stream, the storage agent's "
        "server on hosta. On 2 cores that path is CPU-bound (FUSE + TCP + server ≈ 2.5–3.5 core-seconds "
        "per GB, see the machine's specification), hence a ceiling near 0.55–0.8 GB/s whatever the disk; one stream waits for each 1 MiB request in "
        "turn, several streams keep both cores busy. On this shared VM the figures of one path vary by ±30 % "
        "from run to run: compare the ratios.\n"
        )
    write_section("warpfs-tls" if a.tls else "warpfs", section)

if __name__ == "__main__":
    main()
