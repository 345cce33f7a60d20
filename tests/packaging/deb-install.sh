#!/bin/bash
# The packages on a fresh Debian 12: build them with scripts/build-deb, make a fresh Debian 12
# root with mmdebstrap from Debian's mirror (--variant=apt: the Essential packages and apt,
# smaller than any installed Debian, so a dependency the packages forget to declare shows;
# plus passwd for useradd), and in it, as an administrator would:
#   1. apt install ./spillway_*.deb ./libdatawarp0_*.deb ./libdatawarp-dev_*.deb
#      ./python3-spillway-datawarp_*.deb (apt fetches fuse3, python3 ... from the mirror);
#   2. start the controller and the agent with the ExecStart lines of the installed systemd
#      units (there is no systemd here: the test reads the units, so a wrong path in them fails
#      it), after the directory the units' RuntimeDirectory= would make, with their capability
#      bounding sets, NoNewPrivileges= and UMask=; the controller must become spillway;
#   3. as an ordinary user, spillway run --config /etc/spillway/spillway.toml a job script that
#      stages a file in, transforms it in the burst buffer, stages it out with #DW stage_out and
#      another file through libdatawarp (the Python module over libdatawarp.so.0, deferred
#      to the job's end); checks both results on the "PFS" (the user's home);
#   4. upgrade: the same packages repacked as version V+1, installed with apt over an edited
#      /etc/spillway/spillway.toml: the edit is kept without a question, and the services
#      start again on their state;
#   5. apt remove: the binary goes, /etc/spillway/spillway.toml and the state stay;
#      apt purge: /etc/spillway and the controller's state go.
# It takes about 50 s on an idle 2-core machine (the Go build, mmdebstrap and apt's downloads
# of ~25 MiB from the mirror are most of it), 2-3 minutes when the machine is busy.
# Also checks, before any of it: the binary is statically linked, the man pages format
# without warnings, the .debs' fields.
#
# Run as root (mmdebstrap --mode=root, chroot, mount). Everything happens in a mount
# namespace of its own; the root is under $SPILLWAY_PKGTEST_DIR (default a new directory in
# /var/tmp) and removed at the end unless SPILLWAY_PKGTEST_KEEP=1.
# SPILLWAY_DEBIAN_MIRROR overrides http://deb.debian.org/debian.
set -euo pipefail
cd "$(dirname "$0")/../.."
top=$PWD

if [ "$(id -u)" != 0 ]; then
	echo "deb-install.sh: run as root (it builds a Debian root with mmdebstrap and chroots into it)" >&2
	exit 1
fi
# A mount namespace of our own: /proc, /run and the daemons' FUSE mounts in the root vanish
# with it, whatever happens to this script.
if [ -z "${SPILLWAY_PKGTEST_UNSHARED:-}" ]; then
	export SPILLWAY_PKGTEST_UNSHARED=1
	exec unshare --mount --propagation private "$0" "$@"
fi

mirror=${SPILLWAY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
dir=${SPILLWAY_PKGTEST_DIR:-$(mktemp -d /var/tmp/spillway-pkgtest.XXXXXX)}
mkdir -p "$dir"
root=$dir/root
user=bbuser
t0=$SECONDS
say() { printf '[deb-install %3ds] %s\n' $((SECONDS - t0)) "$*"; }
fail() {
	printf 'deb-install.sh: FAIL: %s\n' "$*" >&2
	for f in "$dir"/*.log; do
		[ -e "$f" ] || continue
		printf -- '--- %s (last 30 lines)\n' "$f" >&2
		tail -n 30 "$f" >&2
	done
	exit 1
}
in_root() { chroot "$root" "$@"; }

pids=()
cleanup() {
	local rc=$?
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [ -d "$root" ]; then
		# The jobs' FUSE mounts, /run, /proc: lazily, deepest first.
		findmnt -rn -o TARGET | grep -F "$root/" | sort -r | while read -r m; do
			umount -l "$m" 2>/dev/null || true
		done
	fi
	if [ "${SPILLWAY_PKGTEST_KEEP:-0}" = 1 ]; then
		say "kept $dir"
	elif findmnt -rn -o TARGET | grep -qF "$root/"; then
		echo "deb-install.sh: $root still has mounts; not removing it" >&2
	else
		rm -rf --one-file-system "$dir"
	fi
	exit $rc
}
trap cleanup EXIT

# --- build ---------------------------------------------------------------------------------
say "scripts/build-deb"
scripts/build-deb --out "$dir/packages" >"$dir/build.log" 2>&1 || fail "scripts/build-deb failed"
cd "$dir/packages"
deb=$(ls spillway_*_amd64.deb)
version=$(dpkg-deb -f "$deb" Version)
static=$(ls spillway-*-linux-amd64)
file "$static" | grep -q 'statically linked' || fail "$static is not statically linked: $(file "$static")"
[ "$("./$static" version)" = "spillway $version" ] || fail "$static version: $("./$static" version)"
sha256sum --quiet -c SHA256SUMS || fail "SHA256SUMS does not match the files"
[ "$(dpkg-deb -f "$deb" Depends)" = "fuse3, passwd" ] || fail "spillway Depends: $(dpkg-deb -f "$deb" Depends)"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/spillway/spillway.toml ||
	fail "/etc/spillway/spillway.toml is not a conffile"
# A source tree without git (a release tarball): the packages take VERSION as it is.
if git -C "$top" rev-parse --verify -q HEAD >/dev/null 2>&1; then
	mkdir "$dir/tarball"
	git -C "$top" archive HEAD | tar -x -C "$dir/tarball"
	(cd "$dir/tarball" && scripts/build-deb --out "$dir/tarball-packages") >"$dir/tarball-build.log" 2>&1 ||
		fail "scripts/build-deb in a tree without git failed: $(tail -5 "$dir/tarball-build.log")"
	[ "$(dpkg-deb -f "$dir"/tarball-packages/spillway_*_amd64.deb Version)" = "$(cat "$top/VERSION")" ] ||
		fail "a tree without git built version $(dpkg-deb -f "$dir"/tarball-packages/spillway_*_amd64.deb Version), not VERSION's"
	say "built from a tree without git: version $(cat "$top/VERSION")"
fi
# Man pages: groff formats each without a warning (as lintian's manpage check does).
mkdir -p "$dir/man"
for p in "$deb" libdatawarp-dev_*.deb; do dpkg-deb -x "$p" "$dir/man"; done
n=0
for page in "$dir"/man/usr/share/man/man*/*.gz; do
	if zcat "$page" | grep -q '^\.so '; then continue; fi
	warnings=$(zcat "$page" | LC_ALL=C.UTF-8 groff -t -man -ww -z -Tutf8 2>&1) || fail "groff failed on $page"
	[ -z "$warnings" ] || fail "groff warns about $(basename "$page"): $warnings"
	n=$((n + 1))
done
[ $n -ge 6 ] || fail "only $n man pages in the packages"
cd "$top"
say "built $deb and the others; $n man pages format cleanly"

# --- a fresh Debian 12 ---------------------------------------------------------------------
say "mmdebstrap --variant=apt bookworm ($mirror)"
mmdebstrap --variant=apt --include=passwd --mode=root --aptopt='Acquire::Retries "3"' bookworm "$root" "$mirror" >"$dir/mmdebstrap.log" 2>&1 ||
	fail "mmdebstrap failed"
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=0755 tmpfs "$root/run"
[ -c "$root/dev/fuse" ] || mknod -m 0666 "$root/dev/fuse" c 10 229
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
echo 'Acquire::Retries "3";' >"$root/etc/apt/apt.conf.d/80retries"
mkdir -p "$root/root/debs"
cp "$dir"/packages/*.deb "$root/root/debs/"

say "apt install ./spillway_*.deb ./libdatawarp0_*.deb ./libdatawarp-dev_*.deb ./python3-spillway-datawarp_*.deb"
in_root env DEBIAN_FRONTEND=noninteractive apt-get update >"$dir/apt.log" 2>&1 || fail "apt-get update failed"
in_root sh -c 'cd /root/debs && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ./spillway_*.deb ./libdatawarp0_*.deb ./libdatawarp-dev_*.deb ./python3-spillway-datawarp_*.deb' \
	>>"$dir/apt.log" 2>&1 || fail "apt install of the packages failed"
for p in spillway libdatawarp0 libdatawarp-dev python3-spillway-datawarp fuse3; do
	in_root dpkg-query -W -f='${Status}\n' "$p" | grep -qx 'install ok installed' || fail "$p is not installed"
done
for n in spillway dwstat dwcli dw_wlm_cli spillway-stage-worker; do
	[ -x "$root/usr/bin/$n" ] || fail "/usr/bin/$n missing"
done
# The agent starts the small stage worker beside spillway: a file of its own, not a link.
[ -f "$root/usr/bin/spillway-stage-worker" ] && [ ! -L "$root/usr/bin/spillway-stage-worker" ] || fail "/usr/bin/spillway-stage-worker is not a file of its own"
cmp -s "$root/usr/bin/spillway-stage-worker" "$root/usr/bin/spillway" && fail "/usr/bin/spillway-stage-worker is the full spillway binary"
# dw_wlm_cli is the small binary of DataWarp's commands; dwstat and dwcli are links to it.
[ -f "$root/usr/bin/dw_wlm_cli" ] && [ ! -L "$root/usr/bin/dw_wlm_cli" ] || fail "/usr/bin/dw_wlm_cli is not a file of its own"
cmp -s "$root/usr/bin/dw_wlm_cli" "$root/usr/bin/spillway" && fail "/usr/bin/dw_wlm_cli is the full spillway binary"
for n in dwstat dwcli; do
	[ "$(readlink "$root/usr/bin/$n")" = dw_wlm_cli ] || fail "/usr/bin/$n links to $(readlink "$root/usr/bin/$n"), not dw_wlm_cli"
done
[ "$(in_root spillway version)" = "spillway $version" ] || fail "installed spillway version: $(in_root spillway version)"
[ "$(in_root dwstat --help | head -1)" = "Usage: dwstat [options] [TABLE...]" ] || fail "dwstat is not DataWarp's dwstat"
[ "$(in_root dw_wlm_cli --help | head -1)" = "Usage: dw_wlm_cli --function FUNCTION [options]" ] || fail "dw_wlm_cli --help: $(in_root dw_wlm_cli --help | head -1)"
[ -e "$root/usr/lib/x86_64-linux-gnu/libdatawarp.so.0" ] || fail "libdatawarp.so.0 missing"
in_root ldconfig -p | grep -q 'libdatawarp.so.0 ' || fail "ldconfig does not know libdatawarp.so.0"
grep -qx "libdir=/usr/lib/x86_64-linux-gnu" "$root/usr/lib/x86_64-linux-gnu/pkgconfig/cray-datawarp.pc" ||
	fail "cray-datawarp.pc: $(cat "$root/usr/lib/x86_64-linux-gnu/pkgconfig/cray-datawarp.pc")"
[ -f "$root/usr/include/datawarp.h" ] && [ -f "$root/usr/lib/x86_64-linux-gnu/libdatawarp.a" ] ||
	fail "datawarp.h or libdatawarp.a missing"
say "installed: $(in_root dpkg-query -W -f='${Package} ${Version}, ' spillway libdatawarp0 libdatawarp-dev python3-spillway-datawarp)"

# --- the packaged services -----------------------------------------------------------------
# What systemd would do for the units: RuntimeDirectory=, the capability bounding set, NoNewPrivileges= and UMask= (so the services are seen to work
# with the privileges their units leave them), then ExecStart=, read from the installed unit
# files. (The units' file-system and system-call hardening needs systemd itself.)
start_unit() {
	local unit=/lib/systemd/system/$1.service exec_start caps setpriv umask_value
	exec_start=$(sed -n 's/^ExecStart=//p' "$root$unit")
	[ -n "$exec_start" ] || fail "$unit has no ExecStart"
	case "$exec_start" in /usr/bin/spillway\ *) ;; *) fail "$unit runs $exec_start, not /usr/bin/spillway" ;; esac
	grep -qx 'RuntimeDirectory=spillway' "$root$unit" && install -d -m 0755 "$root/run/spillway"
	setpriv=(setpriv)
	if grep -q '^CapabilityBoundingSet=' "$root$unit"; then
		caps=$(sed -n 's/^CapabilityBoundingSet=//p' "$root$unit" | tr 'A-Z' 'a-z' | sed 's/cap_/+/g; s/ /,/g')
		setpriv+=(--bounding-set "-all${caps:+,$caps}" --inh-caps -all)
	fi
	grep -qx 'NoNewPrivileges=yes' "$root$unit" && setpriv+=(--no-new-privs)
	umask_value=$(sed -n 's/^UMask=//p' "$root$unit")
	say "start $1: ${setpriv[*]} $exec_start${umask_value:+ (umask $umask_value)}"
	# shellcheck disable=SC2086 # the unit's command line, split as systemd splits it (no quotes in it)
	(umask "${umask_value:-0022}" && exec chroot "$root" "${setpriv[@]}" $exec_start) >"$dir/$1.log" 2>&1 &
	pids+=($!)
}
wait_for() { # wait_for SECONDS WHAT COMMAND...
	local end=$((SECONDS + $1)) what=$2
	shift 2
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $end ] || fail "$what did not happen within $((end - SECONDS + $1))s"
		sleep 0.2
	done
}
start_unit spillway-controller
wait_for 30 "the controller's socket /run/spillway/controller.sock" test -S "$root/run/spillway/controller.sock"
controller_uid=$(awk '/^Uid:/ {print $2}' "/proc/${pids[-1]}/status")
[ "$controller_uid" = "$(in_root id -u spillway)" ] || fail "the controller runs as uid $controller_uid, not as spillway"
start_unit spillway-agent
node_online() { in_root dwstat nodes | grep -q online; }
wait_for 60 "the agent's node online in dwstat nodes" node_online
say "dwstat nodes: $(in_root dwstat nodes | tail -1)"
in_root dw_wlm_cli --function pools | grep -q '"wlm_pool"' || fail "dw_wlm_cli --function pools: $(in_root dw_wlm_cli --function pools)"

# --- a job, as an ordinary user ------------------------------------------------------------
in_root useradd -m -s /bin/bash "$user"
cat >"$root/home/$user/job.sh" <<'EOF'
#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_in type=file source=%d/input.txt destination=$DW_JOB_STRIPED/input.txt
#DW stage_out type=file source=$DW_JOB_STRIPED/output.txt destination=%d/output.txt
set -euo pipefail
tr a-z A-Z <"$DW_JOB_STRIPED/input.txt" >"$DW_JOB_STRIPED/output.txt"
echo "checkpoint of job $SPILLWAY_JOB_ID" >"$DW_JOB_STRIPED/ckpt"
# libdatawarp (libdatawarp.so.0 through the Python module): a stage-out at the job's end.
python3 -c 'import os, spillway_datawarp as dw
dw.stage_file_out(os.environ["DW_JOB_STRIPED"] + "ckpt", os.getcwd() + "/ckpt.out", dw.AT_JOB_END)
print("libdatawarp:", dw.query_file_stage(os.environ["DW_JOB_STRIPED"] + "ckpt"))'
EOF
echo "staged in through the packaged burst buffer" >"$root/home/$user/input.txt"
in_root chown "$user:" "/home/$user/job.sh" "/home/$user/input.txt"
say "as $user: spillway run --config /etc/spillway/spillway.toml job.sh"
in_root runuser -l "$user" -c 'spillway run --config /etc/spillway/spillway.toml job.sh' >"$dir/job.log" 2>&1 ||
	fail "the job failed"
sed 's/^/    /' "$dir/job.log"
[ "$(cat "$root/home/$user/output.txt" 2>/dev/null)" = "STAGED IN THROUGH THE PACKAGED BURST BUFFER" ] ||
	fail "output.txt after stage-out: $(cat "$root/home/$user/output.txt" 2>&1)"
grep -qx 'checkpoint of job [0-9]*' "$root/home/$user/ckpt.out" 2>/dev/null ||
	fail "ckpt.out (libdatawarp's stage-out): $(cat "$root/home/$user/ckpt.out" 2>&1)"
[ "$(in_root stat -c %U "/home/$user/output.txt" "/home/$user/ckpt.out" | sort -u)" = "$user" ] || fail "output.txt or ckpt.out is not $user's"
grep -q 'libdatawarp: StageCounts(complete=0, pending=0, deferred=1, failed=0)' "$dir/job.log" ||
	fail "libdatawarp's query in the job did not see its deferred stage"
sessions=$(in_root dwstat --json sessions)
[ "$(echo "$sessions" | tr -d ' \n')" = '{"sessions":[]}' ] || fail "sessions left after the job: $sessions"
say "the job's results were staged out: output.txt and (libdatawarp) ckpt.out, owned by $user"

# --- upgrade -------------------------------------------------------------------------------
# The same packages as version V+1 (repacked): apt upgrades all four, keeps the administrator's
# edit of the conffile without asking, and the services start again on the state they left.
stop_units() {
	for p in "${pids[@]}"; do kill "$p"; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}
stop_units
echo '# edited by the administrator' >>"$root/etc/spillway/spillway.toml"
next="$version+1"
mkdir -p "$root/root/debs-next"
for p in "$dir"/packages/*.deb; do
	rm -rf "$dir/repack"
	dpkg-deb -R "$p" "$dir/repack"
	sed -i -e "s/^Version: .*/Version: $next/" -e "s/(= $version)/(= $next)/g" "$dir/repack/DEBIAN/control"
	dpkg-deb --root-owner-group -Zgzip -b "$dir/repack" "$root/root/debs-next/" >/dev/null
done
rm -rf "$dir/repack"
say "upgrade to $next: apt install ./*.deb"
in_root sh -c 'cd /root/debs-next && DEBIAN_FRONTEND=noninteractive apt-get install -y ./*.deb' >"$dir/upgrade.log" 2>&1 ||
	fail "apt install of the next version failed"
for p in spillway libdatawarp0 libdatawarp-dev python3-spillway-datawarp; do
	[ "$(in_root dpkg-query -W -f='${Version}' "$p")" = "$next" ] || fail "$p was not upgraded to $next"
done
tail -n 1 "$root/etc/spillway/spillway.toml" | grep -qx '# edited by the administrator' ||
	fail "the upgrade replaced the administrator's /etc/spillway/spillway.toml"
[ ! -e "$root/etc/spillway/spillway.toml.dpkg-new" ] || fail "the upgrade left spillway.toml.dpkg-new"
start_unit spillway-controller
wait_for 30 "the controller's socket after the upgrade" test -S "$root/run/spillway/controller.sock"
start_unit spillway-agent
wait_for 60 "the node online after the upgrade" node_online
in_root dwstat --json pools | grep -q '"wlm_pool"' || fail "the pool is gone after the upgrade"
say "upgraded: the edited configuration kept, the services back on their state"

# --- remove and purge ----------------------------------------------------------------------
stop_units
in_root env DEBIAN_FRONTEND=noninteractive apt-get remove -y spillway >"$dir/remove.log" 2>&1 || fail "apt-get remove spillway failed"
[ ! -e "$root/usr/bin/spillway" ] && [ ! -e "$root/usr/bin/dw_wlm_cli" ] && [ ! -L "$root/usr/bin/dwstat" ] && [ ! -e "$root/usr/bin/spillway-stage-worker" ] ||
	fail "apt remove left /usr/bin/spillway, dw_wlm_cli, dwstat or spillway-stage-worker"
[ ! -e "$root/lib/systemd/system/spillway-agent.service" ] || fail "apt remove left the units"
[ -f "$root/etc/spillway/spillway.toml" ] || fail "apt remove removed the configuration"
[ -d "$root/var/lib/spillway/controller" ] || fail "apt remove removed the controller's state"
in_root dpkg-query -W -f='${Status}\n' spillway | grep -qx 'deinstall ok config-files' ||
	fail "spillway after remove: $(in_root dpkg-query -W -f='${Status}' spillway)"
# libdatawarp0 needs the binary (its staging calls run it): apt removed it too.
[ ! -e "$root/usr/lib/x86_64-linux-gnu/libdatawarp.so.0" ] || fail "apt remove spillway left libdatawarp.so.0"
in_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y spillway >>"$dir/remove.log" 2>&1 || fail "apt-get purge spillway failed"
[ ! -e "$root/etc/spillway" ] || fail "apt purge left /etc/spillway: $(ls -A "$root/etc/spillway")"
[ ! -e "$root/var/lib/spillway/controller" ] || fail "apt purge left the controller's state"
if in_root dpkg-query -W spillway >/dev/null 2>&1; then
	st=$(in_root dpkg-query -W -f='${Status}' spillway)
	[ "$st" = "unknown ok not-installed" ] || fail "spillway after purge: $st"
fi
say "apt remove kept the configuration and the state; apt purge removed them"
say "PASS ($((SECONDS - t0))s)"
