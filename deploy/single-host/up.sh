#!/bin/bash
# Bring up, on this one machine, a real Slurm (Debian packages) driving a Spillway controller
# and agent: everything a burst-buffer job needs, in one throwaway directory.
# deploy/single-host/down.sh stops what this started and removes what it made.
set -euo pipefail

usage() {
	cat <<'EOF'
Usage: deploy/single-host/up.sh [options]

Start, on this machine, a Slurm cluster of one node wired to Spillway:
  - installs slurm-wlm, slurmctld, slurmd, slurm-client and munge if missing, and builds
    Spillway (scripts/install-deps);
  - starts a Spillway controller and one agent (storage and compute roles) as root;
  - starts munged (unless one already answers), slurmctld (as the slurm user) and slurmd,
    with burst_buffer.conf pointing at Spillway's dw_wlm_cli and dwstat;
  - creates an ordinary user to submit jobs as (root cannot use burst buffers in Slurm).
Everything lives under DIR; nothing is written to /etc. It prints how to submit a job.

Options:
  --dir DIR            where everything goes (default /var/tmp/spillway-single-host)
  --plugin NAME        datawarp (burst_buffer/datawarp, default) or lua (burst_buffer/lua
                       with Spillway's burst_buffer.lua)
  --user NAME          the ordinary user to submit as; created if missing (default bbuser)
  --capacity SIZE      storage the agent offers to the pool (default 16GiB)
  --granularity SIZE   the pool's allocation unit (default 1GiB)
  --no-install         do not run apt-get or build; use what is installed
  --spillway PATH      the spillway binary to use (default bin/spillway of this tree)
  --dw-wlm-cli PATH    the small dw_wlm_cli binary Slurm runs, dwstat and dwcli too
                       (default dw_wlm_cli beside the spillway binary)
  -h, --help           this text

Run as root. Stop everything with: deploy/single-host/down.sh --dir DIR
EOF
}

dir=/var/tmp/spillway-single-host
plugin=datawarp
user=bbuser
capacity=16GiB
granularity=1GiB
install=1
binary=
small=
while [ $# -gt 0 ]; do
	case "$1" in
	--dir) dir=$2; shift 2 ;;
	--plugin) plugin=$2; shift 2 ;;
	--user) user=$2; shift 2 ;;
	--capacity) capacity=$2; shift 2 ;;
	--granularity) granularity=$2; shift 2 ;;
	--no-install) install=0; shift ;;
	--spillway) binary=$2; shift 2 ;;
	--dw-wlm-cli) small=$2; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "up.sh: unknown option $1 (see --help)" >&2; exit 64 ;;
	esac
done
case "$plugin" in
datawarp | lua) ;;
*) echo "up.sh: --plugin must be datawarp or lua, not \"$plugin\"" >&2; exit 64 ;;
esac
case "$dir" in
/*) ;;
*) echo "up.sh: --dir must be an absolute path, not \"$dir\"" >&2; exit 64 ;;
esac
if [ "$(id -u)" != 0 ]; then
	echo "up.sh: run as root (it starts slurmctld, slurmd, munged and Spillway's daemons)" >&2
	exit 1
fi

top=$(cd "$(dirname "$0")/../.." && pwd)
binary=${binary:-$top/bin/spillway}
small=${small:-$(dirname "$binary")/dw_wlm_cli}
say() { printf '[up] %s\n' "$*"; }

# wait_for SECONDS WHAT COMMAND...: retry COMMAND every 0.2 s until it succeeds.
wait_for() {
	local limit=$1 what=$2
	shift 2
	local end=$((SECONDS + limit))
	until "$@" >/dev/null 2>&1; do
		if [ $SECONDS -ge $end ]; then
			echo "up.sh: $what did not happen within ${limit}s; logs are in $dir/log" >&2
			return 1
		fi
		sleep 0.2
	done
}

if [ -e "$dir/up.state" ]; then
	echo "up.sh: $dir already holds a running setup; stop it first: $top/deploy/single-host/down.sh --dir $dir" >&2
	exit 1
fi

# Another Slurm on this machine would answer our commands on its ports.
if command -v ss >/dev/null && ss -Hltn 'sport = :6817 or sport = :6818' | grep -q .; then
	echo "up.sh: something already listens on Slurm's ports 6817/6818 (another slurmctld or slurmd?); stop it first (a setup of up.sh: down.sh --dir ITS_DIR)" >&2
	exit 1
fi

# --- Packages and the Spillway binary.
if [ $install = 1 ]; then
	"$top/scripts/install-deps"
	need=()
	for pkg in slurm-wlm slurmctld slurmd slurm-client munge; do
		dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || need+=("$pkg")
	done
	if [ ${#need[@]} -gt 0 ]; then
		say "apt-get install ${need[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	fi
fi
for prog in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sbatch /usr/sbin/munged "$binary" "$small"; do
	if [ ! -x "$prog" ] || [ -d "$prog" ]; then
		echo "up.sh: $prog is missing (run without --no-install to install it, or name it with --spillway / --dw-wlm-cli)" >&2
		exit 1
	fi
done

host=$(hostname -s)
mkdir -p "$dir"/{bin,etc,log,run,pfs,mounts,spillway/state,spillway/ssd,slurm/state,slurm/spool}
chmod 0755 "$dir" "$dir"/{bin,etc,log,run,pfs,mounts,spillway}
# up.state records what this run started and made, for down.sh.
state="$dir/up.state"
echo "dir=$dir" >"$state"
record() { echo "$1" >>"$state"; }

# The binaries, copied so that the slurm user can reach them whatever the source tree's modes:
# spillway for the daemons, the small dw_wlm_cli for Slurm (dwstat and dwcli link to it; it
# runs the spillway beside it for a one-machine home). A former run's links go first, so that
# nothing is written through them.
rm -f "$dir/bin/spillway" "$dir/bin/dw_wlm_cli" "$dir/bin/dwstat" "$dir/bin/dwcli"
install -m 0755 "$binary" "$dir/bin/spillway"
install -m 0755 "$small" "$dir/bin/dw_wlm_cli"
for name in dwstat dwcli; do ln -s dw_wlm_cli "$dir/bin/$name"; done

# --- The ordinary user.
if ! id "$user" >/dev/null 2>&1; then
	useradd --create-home --user-group --shell /bin/bash "$user"
	record "created_user=$user"
	say "created user $user"
fi
uid=$(id -u "$user")
# The user's "parallel file system" directory, with the Slurm examples and some input.
mkdir -p "$dir/pfs/$user/input"
cp "$top"/examples/slurm/*.sh "$dir/pfs/$user/"
for i in 1 2 3; do seq 1 $((i * 100)) >"$dir/pfs/$user/input/sample$i.txt"; done
chown -R "$user:" "$dir/pfs/$user"

# --- Spillway: controller and one agent with both roles.
spillway_conf="$dir/etc/spillway.toml"
cat >"$spillway_conf" <<EOF
# Spillway for deploy/single-host/up.sh: one controller, one agent (storage + compute).
[controller]
state_dir = "$dir/spillway/state"
socket = "$dir/run/controller.sock"
mount_root = "$dir/mounts"
wlm_users = ["slurm"]

[agent]
name = "$host"
pool = "wlm_pool"
ssd_path = "$dir/spillway/ssd"
capacity = "$capacity"
listen = "unix:$dir/run/agent.sock"
controller = "unix:$dir/run/controller.sock"

[client]
controller = "unix:$dir/run/controller.sock"

[cache]
# Cache instances (#DW jobdw type=cache pfs=...) may front the users' "PFS" directories.
allowed_pfs = ["$dir/pfs"]

[[pool]]
name = "wlm_pool"
granularity = "$granularity"
EOF
chmod 0644 "$spillway_conf"
export SPILLWAY_CONFIG="$spillway_conf"

# start_daemon NAME COMMAND...: run in its own session, output to log/NAME.log, PID recorded.
start_daemon() {
	local name=$1
	shift
	setsid "$@" </dev/null >>"$dir/log/$name.log" 2>&1 &
	echo $! >"$dir/run/$name.pid"
	record "pidfile=$dir/run/$name.pid"
}
start_daemon spillway-controller "$dir/bin/spillway" controller --config "$spillway_conf"
wait_for 20 "the Spillway controller answering" "$dir/bin/dwstat" pools
start_daemon spillway-agent "$dir/bin/spillway" agent --config "$spillway_conf"
pool_ready() { "$dir/bin/dwstat" nodes | grep -q "^ *$host .*online"; }
wait_for 20 "the Spillway agent registering as node $host" pool_ready
say "Spillway controller and agent up (pool wlm_pool, $capacity on $host)"

# --- munge: reuse one that answers, else start our own.
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
	say "munged already running; reusing it"
else
	[ -s /etc/munge/munge.key ] || {
		echo "up.sh: /etc/munge/munge.key is missing (reinstall munge: apt-get install --reinstall munge)" >&2
		exit 1
	}
	mkdir -p /run/munge /var/log/munge /var/lib/munge
	chown munge:munge /run/munge /var/log/munge /var/lib/munge
	runuser -u munge -- /usr/sbin/munged
	record "pidfile=/run/munge/munged.pid"
	wait_for 10 "munged answering" sh -c 'munge -n | unmunge'
	say "munged started"
fi

# --- Slurm.
slurm_conf="$dir/etc/slurm.conf"
cpus=$(nproc)
cat >"$slurm_conf" <<EOF
# Slurm for deploy/single-host/up.sh: one node, burst buffers from Spillway.
ClusterName=spillway
SlurmctldHost=$host(127.0.0.1)
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/slurm/state
SlurmdSpoolDir=$dir/slurm/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=debug
DebugFlags=BurstBuffer
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# Look at pending jobs every 2 s (default 60 s): jobs that only use persistent instances are
# started by the periodic pass, not when their stage-in ends.
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=30
MailProg=/bin/true
BurstBufferType=burst_buffer/$plugin
MessageTimeout=10
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

bb_conf="$dir/etc/burst_buffer.conf"
if [ "$plugin" = datawarp ]; then
	cat >"$bb_conf" <<EOF
# burst_buffer/datawarp driving Spillway (see docs/slurm.md).
GetSysState=$dir/bin/dw_wlm_cli
GetSysStatus=$dir/bin/dwstat
DefaultPool=wlm_pool
Flags=EnablePersistent
ValidateTimeout=5
OtherTimeout=300
StageInTimeout=3600
StageOutTimeout=3600
EOF
else
	cat >"$bb_conf" <<EOF
# burst_buffer/lua driving Spillway through burst_buffer.lua (see docs/slurm.md). The lua
# plugin has no DefaultPool: jobs name pool= with capacity=.
Directive=DW
ValidateTimeout=5
OtherTimeout=300
StageInTimeout=3600
StageOutTimeout=3600
EOF
	install -m 0644 "$top/deploy/slurm/burst_buffer.lua" "$dir/etc/burst_buffer.lua"
fi
chmod 0644 "$slurm_conf" "$bb_conf"
chown slurm: "$dir/slurm/state" "$dir/log" "$dir/run"
chmod 0700 "$dir/slurm/state"
export SLURM_CONF="$slurm_conf"

# slurmctld keeps its environment and hands it to dw_wlm_cli and burst_buffer.lua: that is
# how they find Spillway's configuration and programs. bin/start-slurmctld starts it so
# (run it again to restart slurmctld after stopping it).
cat >"$dir/bin/start-slurmctld" <<EOF
#!/bin/sh
# Start slurmctld with the environment Spillway's dw_wlm_cli and burst_buffer.lua need.
exec env SPILLWAY_CONFIG="$spillway_conf" SPILLWAY_DW_WLM_CLI="$dir/bin/dw_wlm_cli" \\
	SPILLWAY_DWSTAT="$dir/bin/dwstat" PATH="$dir/bin:/usr/sbin:/usr/bin:/sbin:/bin" \\
	/usr/sbin/slurmctld -f "$slurm_conf" "\$@"
EOF
chmod 0755 "$dir/bin/start-slurmctld"
"$dir/bin/start-slurmctld"
record "pidfile=$dir/run/slurmctld.pid"
wait_for 30 "slurmctld answering (scontrol ping)" sh -c 'scontrol ping | grep -q UP'
/usr/sbin/slurmd -f "$slurm_conf"
record "pidfile=$dir/run/slurmd.pid"
node_idle() { sinfo -h -o %T | grep -qx idle; }
wait_for 30 "node $host becoming idle (sinfo)" node_idle
# The burst-buffer plugin has loaded the pools from Spillway when scontrol lists them.
bb_ready() { scontrol show burst | grep -q 'TotalSpace=[1-9]'; }
wait_for 30 "Slurm seeing Spillway's pool (scontrol show burst)" bb_ready
say "Slurm up: slurmctld and slurmd on $host, BurstBufferType=burst_buffer/$plugin"

cat >"$dir/env" <<EOF
# Source this to use the single-host Slurm and Spillway: . $dir/env
export SLURM_CONF=$slurm_conf
export SPILLWAY_CONFIG=$spillway_conf
export PATH=$dir/bin:\$PATH
EOF
chmod 0644 "$dir/env"
record "up=ok"

cat <<EOF

Single-host Slurm + Spillway is up in $dir ($plugin plugin).

Submit a burst-buffer job as $user, from the user's "PFS" directory $dir/pfs/$user
(it holds input/ and the examples of examples/slurm/):
  cd $dir/pfs/$user
  runuser -u $user -- env SLURM_CONF=$slurm_conf sbatch stage-in-out.sh
  (or: su - $user, then: . $dir/env; cd $dir/pfs/$user; sbatch stage-in-out.sh)
Watch it:
  . $dir/env; squeue; scontrol show burst; dwstat most
The result arrives as $dir/pfs/$user/result-<jobid>.txt; logs are in $dir/log.
Stop everything and remove $dir:
  $top/deploy/single-host/down.sh --dir $dir
EOF
