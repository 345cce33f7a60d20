#!/bin/bash
# Stop what deploy/single-host/up.sh started (by the PIDs it recorded, never by process name)
# and remove what it made.
set -uo pipefail

usage() {
	cat <<'EOF'
Usage: deploy/single-host/down.sh [--dir DIR] [--keep]

Stop the single-host Slurm + Spillway that up.sh started in DIR: cancel its jobs, stop
slurmd, slurmctld, the Spillway agent and controller, and munged if up.sh started it (each
by the PID it recorded), unmount what is left under DIR/mounts, delete the user up.sh
created, and remove DIR.

Options:
  --dir DIR   the directory given to up.sh (default /var/tmp/spillway-single-host)
  --keep      stop everything but keep DIR (logs, state) for a look
  -h, --help  this text
EOF
}

dir=/var/tmp/spillway-single-host
keep=0
while [ $# -gt 0 ]; do
	case "$1" in
	--dir) dir=$2; shift 2 ;;
	--keep) keep=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "down.sh: unknown option $1 (see --help)" >&2; exit 64 ;;
	esac
done
if [ "$(id -u)" != 0 ]; then
	echo "down.sh: run as root" >&2
	exit 1
fi
state="$dir/up.state"
if [ ! -f "$state" ]; then
	echo "down.sh: $dir holds no setup of up.sh (no $state); nothing to do"
	exit 0
fi
say() { printf '[down] %s\n' "$*"; }

# stop_pid PIDFILE: TERM, then KILL after 15 s; only if the PID is still that program.
stop_pid() {
	local file=$1 pid
	[ -s "$file" ] || return 0
	pid=$(cat "$file")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null
	for _ in $(seq 150); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	say "$(basename "$file" .pid) (pid $pid) ignored TERM for 15 s; killing it"
	kill -KILL "$pid" 2>/dev/null
}

# Cancel the jobs while slurmctld still runs, so that their burst buffers are torn down.
if [ -f "$dir/etc/slurm.conf" ] && [ -s "$dir/run/slurmctld.pid" ] && kill -0 "$(cat "$dir/run/slurmctld.pid")" 2>/dev/null; then
	export SLURM_CONF="$dir/etc/slurm.conf"
	if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
		say "cancelling jobs"
		scancel --hurry --full -u "*" 2>/dev/null || scancel --hurry $(squeue -h -o %i) 2>/dev/null
		for _ in $(seq 100); do
			[ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
			sleep 0.2
		done
	fi
fi

# Daemons in the reverse order of their start: slurmd, slurmctld, munged, agent, controller.
mapfile -t pidfiles < <(grep '^pidfile=' "$state" | cut -d= -f2- | tac)
for f in "${pidfiles[@]}"; do
	stop_pid "$f"
done
say "daemons stopped"

# Mounts the agent left (it keeps jobs' mounts across its own restarts).
if [ -d "$dir" ]; then
	while read -r _ mnt _; do
		case "$mnt" in
		"$dir"/*) fusermount3 -uz "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null ;;
		esac
	done </proc/mounts
fi

created_user=$(grep '^created_user=' "$state" | cut -d= -f2-)
if [ -n "$created_user" ] && id "$created_user" >/dev/null 2>&1; then
	# Processes of the user (jobs slurmd left) would stop userdel.
	pkill -KILL -u "$created_user" 2>/dev/null
	userdel --remove "$created_user" 2>/dev/null || userdel "$created_user"
	say "deleted user $created_user"
fi

if [ $keep = 1 ]; then
	rm -f "$state"
	say "kept $dir"
else
	rm -rf "$dir"
	say "removed $dir"
fi
