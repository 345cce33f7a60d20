#!/bin/bash
# Sequential throughput through a Spillway mount versus the same directory directly, measured
# in the same run (the figures quoted in docs/mounts.md): 1 MiB blocks on a 2 GiB file,
# buffered and O_DIRECT, medians of RUNS runs. Needs root (drop_caches, mount(2)) and fio.
#
#   sudo internal/warpfs/mount/bench_mount.sh [RUNS] [DIR]
#
# RUNS defaults to 3; DIR (default /tmp) holds the namespace directory and the mount. SIZE
# (environment, default 2G) is the file size; LIMITS (environment, JSON of mount.Limits, e.g.
# '{"MaxWrite":131072,"MaxReadahead":131072}') tries other tunables. PASSTHROUGH_WRITES
# (environment) measures the co-located path with writes handed to the kernel: "quota" puts
# the namespace under a project quota first (DIR must be on XFS mounted with -o prjquota, as
# agent.ssd_path should be), "test" hands them over without a quota (the data path alone, on
# kernels without XFS quotas; never what an agent does). The mount is served by the mount
# package's test binary in its helper role, so what is measured is exactly the package's code.
set -euo pipefail

RUNS=${1:-3}
BASE=${2:-/tmp}
SIZE=${SIZE:-2G}
limits_json=${LIMITS:-'{}'}
passthrough_writes=${PASSTHROUGH_WRITES:-}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "$BASE/spillway-bench.XXXXXX")
helper_pid=
cleanup() {
	exec 3>&- 2>/dev/null || true
	if [ -n "$helper_pid" ]; then wait "$helper_pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

command -v fio >/dev/null || { echo "fio is missing: apt-get install fio" >&2; exit 1; }
(cd "$here" && go test -c -o "$work/mount.test" .)
mkdir "$work/src"

# serve RO: mount $work/src at $work/mnt (read-only if RO=true) until fd 3 is closed.
serve() {
	rm -f "$work/ctl" "$work/helper.out"
	mkfifo "$work/ctl"
	SPILLWAY_LOCALFS_TEST_HELPER="{\"MountPath\":\"$work/mnt\",\"SourceDir\":\"$work/src\",\"Capacity\":$((64 << 30)),\"ReadOnly\":$1,\"Limits\":$limits_json,\"PassthroughWrites\":\"$passthrough_writes\"}" \
		"$work/mount.test" <"$work/ctl" >"$work/helper.out" 2>&1 &
	helper_pid=$!
	exec 3>"$work/ctl"
	for _ in $(seq 1 300); do
		if grep -q ready "$work/helper.out" 2>/dev/null; then
			cat "$work/helper.out" >&2
			return 0
		fi
		grep -q error "$work/helper.out" 2>/dev/null && break
		sleep 0.1
	done
	cat "$work/helper.out" >&2
	exit 1
}
unserve() {
	exec 3>&-
	wait "$helper_pid"
	helper_pid=
}

# bw FIO-ARGS...: prints the job's bandwidth in MiB/s (terse format: field 7 read, 48 write KiB/s).
bw() {
	fio --output-format=terse --terse-version=3 --ioengine=psync --bs=1M --size="$SIZE" "$@" |
		awk -F';' '{ kib = ($48 > 0) ? $48 : $7; printf "%d\n", kib / 1024 }'
}
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

declare -A results
record() { results["$1"]+="$2 "; }

# measure KEY FIO-ARGS...: records the bandwidth under KEY and, for mounts, the CPU the
# server spent per GiB moved (core-seconds/GiB: robust when other work shares the machine).
size_gib=$(awk -v b="$(numfmt --from=iec "$SIZE")" 'BEGIN { print b / 1073741824 }')
ticks() { awk '{ print $14 + $15 }' "/proc/$helper_pid/stat"; }
measure() {
	local key=$1
	shift
	local before after
	before=$(ticks)
	record "$key" "$(bw "$@")"
	after=$(ticks)
	case $key in
	mnt* | ro-mnt*) record "$key cpu" "$(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v g="$size_gib" 'BEGIN { printf "%.2f", t / hz / g }')" ;;
	esac
}

echo "kernel $(uname -r), $(nproc) cores, fs.pipe-max-size $(cat /proc/sys/fs/pipe-max-size), load $(cut -d' ' -f1-3 /proc/loadavg)"
serve false
bw --name=warmup --filename="$work/mnt/warmup" --rw=write --size=256M >/dev/null
rm -f "$work/src/warmup"
for run in $(seq 1 "$RUNS"); do
	for target in mnt src; do
		f="$work/$target/file"
		measure "$target buffered-write" --name=w --filename="$f" --rw=write --end_fsync=1
		drop
		measure "$target buffered-read" --name=r --filename="$f" --rw=read
		measure "$target direct-write" --name=dw --filename="$f" --rw=write --direct=1
		measure "$target direct-read" --name=dr --filename="$f" --rw=read --direct=1
		rm -f "$work/src/file"
	done
	echo "run $run done" >&2
done
unserve

# A read-only (loadbalance) mount: reads go through FUSE passthrough when the kernel allows.
bw --name=prep --filename="$work/src/file" --rw=write --end_fsync=1 >/dev/null
serve true
for run in $(seq 1 "$RUNS"); do
	drop
	measure "ro-mnt buffered-read" --name=r --filename="$work/mnt/file" --rw=read --readonly
	measure "ro-mnt direct-read" --name=dr --filename="$work/mnt/file" --rw=read --direct=1 --readonly
done
unserve

med() { echo ${results["$1"]:-} | tr ' ' '\n' | { grep . || true; } | median; }
printf '%-16s %10s %10s %8s %12s %10s %12s\n' "median of $RUNS" "dir MiB/s" "mount" "ratio" "server s/GiB" "ro mount" "server s/GiB"
for figure in buffered-write buffered-read direct-write direct-read; do
	src=$(med "src $figure")
	mnt=$(med "mnt $figure")
	ro=$(med "ro-mnt $figure")
	rocpu=$(med "ro-mnt $figure cpu")
	printf '%-16s %10s %10s %7s%% %12s %10s %12s\n' "$figure" "$src" "$mnt" "$((100 * mnt / src))" \
		"$(med "mnt $figure cpu")" "${ro:--}" "${rocpu:--}"
done
echo "all runs:"
for key in "${!results[@]}"; do echo "  $key: ${results[$key]}"; done | sort
