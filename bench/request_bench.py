#!/usr/bin/env python3
"""What one long request costs the controller's write transaction (security issue 19).

Runs the Go benchmarks of internal/controller against a real controller over SQLite, as an
ordinary user (uid 1000) on the Unix socket's path:

- BenchmarkJobStagesRequest/N: one in-job stage request (POST .../job_stages, what
  `dwcli stage` and libdatawarp send) of N paths on a session already holding N in-job stages
  (and those of the iterations before: N, 2N, 3N, ...);
- BenchmarkOtherWriteDuringJobStages: another user's one-row write (POST /dw/v1/run_ids) sent
  50 ms into a request of stage.max_paths_per_request paths, and how long it waited.

Figures go to BENCHMARKS.md between <!-- requests:begin --> and <!-- requests:end -->.

Usage: python3 bench/request_bench.py [--count 3] [--no-write]
"""
import argparse
import datetime
import os
import re
import subprocess
import sys

from benchmarks_md import write_section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = "BenchmarkJobStagesRequest|BenchmarkOtherWriteDuringJobStages"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=3, help="iterations of each benchmark (-benchtime=Nx)")
    ap.add_argument("--no-write", action="store_true", help="print, do not write BENCHMARKS.md")
    args = ap.parse_args()
    cmd = ["go", "test", "-count=1", "-run", "^$", "-bench", BENCH, f"-benchtime={args.count}x", "./internal/controller/"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(out.stdout)
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        sys.exit(1)
    rows = []
    for line in out.stdout.splitlines():
        m = re.match(r"(Benchmark\S+?)(-\d+)?\s+\d+\s+(\d+) ns/op(.*)", line)
        if not m:
            continue
        name, ns, rest = m.group(1), int(m.group(3)), m.group(4)
        metrics = dict((k, float(v)) for v, k in re.findall(r"([\d.]+) (\w+)", rest))
        if name.startswith("BenchmarkJobStagesRequest/"):
            n = int(name.split("/")[1])
            rows.append(f"| job_stages of {n:,} paths, {n:,} to {n * args.count:,} held | {ns / 1e6:,.0f} | — |")
        else:
            rows.append(f"| job_stages of stage.max_paths_per_request paths, and another user's run_ids 50 ms in "
                        f"| {metrics.get('stages_ms', 0):,.0f} | {metrics.get('wait_ms', 0):,.0f} |")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = f"""## One long request and everyone else's writes (security issue 19)

Measured {when} on {os.cpu_count()} cores with `python3 bench/request_bench.py --count {args.count}` (the Go
benchmarks `{BENCH}` in `internal/controller`: a real controller over SQLite, the requests
as an ordinary user; mean of {args.count}). Times in ms.

| request | request ms | the other write waited, ms |
|---|---:|---:|
{chr(10).join(rows)}

Before the fix (commit 7d1eafa, the same benchmarks, 1 iteration): 22,735 ms for 10,000 paths
on 10,000 held; 8,114 ms for 10,000 paths with another user's run_ids waiting 8,061 ms; and a
request of the report's 25,000 paths (3.8 MB) ran until `request_timeout` (30 s) and failed
with a 500. Now it is refused at once with 413, kind `too_large`, naming
`stage.max_paths_per_request`.
"""
    print(text)
    if not args.no_write:
        write_section("requests", text)


if __name__ == "__main__":
    main()
