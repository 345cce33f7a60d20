#!/usr/bin/env python3
"""Time to a new leader when the leading controller is killed or cut off (high availability).

Builds hosts out of network namespaces on a private bridge (10.79.0.0/24): a three-member etcd
cluster (Debian's etcd-server), two controllers with ha.enabled (ha.lease_ttl as given, 5 s by
default) and a client host. Each round kills the leader with SIGKILL (or, with --partition,
sets its link down) and measures, from that moment:
  elected: until the other controller logs "elected leader" (its executor runs);
  write:   until a write sent by `dwcli create pool` from the client host, given both
           controllers (client.controller = "A,B"), is accepted.
Then it restarts the killed controller (or heals the link), which follows, and goes again with
the roles swapped. Median and maximum of the rounds go to BENCHMARKS.md between
<!-- failover:begin --> and <!-- failover:end -->.

Usage: python3 bench/failover_bench.py [--binary bin/spillway] [--rounds 10] [--lease-ttl 5s]
       [--partition] [--no-write]
Needs root (network namespaces), and takes /tmp/spillway-netns.lock like the e2e tests.
"""
import argparse
import datetime
import fcntl
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
NET = "10.79.0."
ADDR = {"ctl1": "1", "ctl2": "2", "cli": "4", "e1": "11", "e2": "12", "e3": "13"}


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def elected_at(log):
    """The wall-clock time of the last "elected leader" line of a controller's log, or None."""
    m = re.findall(r'time=(\S+) level=INFO msg="elected leader', open(log).read())
    if not m:
        return None
    return datetime.datetime.fromisoformat(m[-1].replace("Z", "+00:00")).timestamp()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "bin", "spillway"))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--lease-ttl", default="5s")
    ap.add_argument("--partition", action="store_true", help="cut the leader's link instead of killing it")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: network namespaces")
    etcd = shutil.which("etcd") or "/usr/bin/etcd"
    lock = open("/tmp/spillway-netns.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    d = tempfile.mkdtemp(prefix="spillway-failover-bench-", dir="/var/tmp")
    tag = f"spwfb{os.getpid()}"
    spaces, procs = [], {}
    try:
        sw = tag + "-sw"
        sh("ip", "netns", "add", sw)
        spaces.append(sw)
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        for h, n in ADDR.items():
            ns = f"{tag}-{h}"
            sh("ip", "netns", "add", ns)
            spaces.append(ns)
            sh("ip", "link", "add", "v" + h, "netns", sw, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", sw, "link", "set", "v" + h, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", NET + n + "/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

        def start(h, *argv):
            log = open(os.path.join(d, h + ".log"), "a")
            procs[h] = subprocess.Popen(["ip", "netns", "exec", f"{tag}-{h}", *argv], stdout=log, stderr=log,
                                        env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"})

        initial = ",".join(f"{m}=http://{NET}{ADDR[m]}:2380" for m in ("e1", "e2", "e3"))
        for m in ("e1", "e2", "e3"):
            ip = NET + ADDR[m]
            start(m, etcd, "--name", m, "--data-dir", os.path.join(d, m + ".etcd"),
                  "--listen-client-urls", f"http://{ip}:2379", "--advertise-client-urls", f"http://{ip}:2379",
                  "--listen-peer-urls", f"http://{ip}:2380", "--initial-advertise-peer-urls", f"http://{ip}:2380",
                  "--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", tag)
        with open(os.path.join(d, "token"), "w") as f:
            f.write("failover-bench-secret\n")
        os.chmod(os.path.join(d, "token"), 0o600)
        endpoints = ", ".join(f'"http://{NET}{ADDR[m]}:2379"' for m in ("e1", "e2", "e3"))
        controllers = f"http://{NET}1:7700,http://{NET}2:7700"
        common = f'''[store]
engine = "etcd"
etcd_endpoints = [{endpoints}]
[ha]
enabled = true
lease_ttl = "{a.lease_ttl}"
[client]
controller = "{controllers}"
token_file = "{d}/token"
'''
        for h in ("ctl1", "ctl2"):
            with open(os.path.join(d, h + ".toml"), "w") as f:
                f.write(f'''[controller]
state_dir = "{d}/{h}"
socket = "{d}/{h}.sock"
listen = "{NET}{ADDR[h]}:7700"
token_file = "{d}/token"
mount_root = "{d}/mounts"
''' + common.replace("[ha]\n", f'[ha]\nadvertise = "http://{NET}{ADDR[h]}:7700"\n'))
        with open(os.path.join(d, "cli.toml"), "w") as f:
            f.write(common)

        def start_controller(h):
            for _ in range(20):  # the etcd members may still be forming their cluster
                start(h, a.binary, "controller", "--config", os.path.join(d, h + ".toml"))
                time.sleep(1)
                if procs[h].poll() is None:
                    return
            sys.exit(f"{h} does not start; see {d}/{h}.log")

        def write(i):
            r = subprocess.run(["ip", "netns", "exec", f"{tag}-cli", a.binary, "dwcli", "--config", os.path.join(d, "cli.toml"),
                                "create", "pool", "--name", f"p{i}", "--granularity", "1GiB"], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"dwcli create pool: {r.stdout}{r.stderr}")

        start_controller("ctl1")
        while elected_at(os.path.join(d, "ctl1.log")) is None:
            time.sleep(0.1)
        start_controller("ctl2")
        leader, other = "ctl1", "ctl2"
        elected, wrote = [], []
        for i in range(a.rounds):
            write(f"warm{i}")  # the client has found the current leader
            t0 = time.time()
            if a.partition:
                sh("ip", "-n", f"{tag}-{leader}", "link", "set", "eth0", "down")
            else:
                procs[leader].kill()
                procs[leader].wait()
            write(i)
            wrote.append(time.time() - t0)
            log = os.path.join(d, other + ".log")
            while (e := elected_at(log)) is None or e < t0:
                time.sleep(0.05)
            elected.append(e - t0)
            print(f"round {i + 1}: {leader} {'cut off' if a.partition else 'killed'}; {other} led after {elected[-1]:.2f} s, "
                  f"a write was accepted after {wrote[-1]:.2f} s", flush=True)
            if a.partition:
                sh("ip", "-n", f"{tag}-{leader}", "link", "set", "eth0", "up")
            else:
                start_controller(leader)
            time.sleep(2)  # the returned controller is a candidate again
            leader, other = other, leader
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        for ns in reversed(spaces):
            sh("ip", "netns", "del", ns, check=False)
    shutil.rmtree(d, ignore_errors=True)
    how = "cut off (`ip link set eth0 down` in its namespace)" if a.partition else "killed (SIGKILL)"
    title = "Controller failover: the leader cut off" if a.partition else "Controller failover: the leader killed"
    text = f"""## {title} (high availability)

`python3 bench/failover_bench.py --rounds {a.rounds} --lease-ttl {a.lease_ttl}{' --partition' if a.partition else ''}`, {datetime.date.today()}:
three etcd members and two controllers (`ha.lease_ttl = "{a.lease_ttl}"`) in network namespaces on
one machine ({os.cpu_count()} CPUs); the leader {how}, {a.rounds} rounds.

| from the leader's loss to | median | max |
|---|---|---|
| the other controller elected (its executor runs) | {statistics.median(elected):.2f} s | {max(elected):.2f} s |
| a write by `dwcli`, given both controllers, accepted | {statistics.median(wrote):.2f} s | {max(wrote):.2f} s |
"""
    print(text)
    if not a.no_write:
        write_section("failover-partition" if a.partition else "failover", text)


if __name__ == "__main__":
    main()
