#!/usr/bin/env bash
# A real single-node SLURM on this machine, for tests and trials of the cluster profile (profiles/slurm/):
#
#   scripts/slurm-local.sh start    install the Debian packages if missing, write /etc/slurm/slurm.conf,
#                                   start munged, slurmctld and slurmd by hand (no systemd), wait until
#                                   the node is idle; does nothing when its daemons already run
#   scripts/slurm-local.sh stop     stop the daemons this script started (their pid files) and remove the
#                                   slurm.conf it wrote, nothing else
#   scripts/slurm-local.sh status   say which of them run; exit 0 when all three do, 1 otherwise
#
# Root only (daemons, /etc/slurm, apt-get). Everything but the config lives in $LLMBUILD_SLURM_STATE
# (default /var/lib/llmbuild-slurm): the munge key, pid files, logs, slurmctld's state and the finished
# jobs' record that `sacct -c` reads. The cluster listens on 127.0.0.1 only.
set -euo pipefail

STATE=${LLMBUILD_SLURM_STATE:-/var/lib/llmbuild-slurm}
CONF=/etc/slurm/slurm.conf  # fixed: the jobstep plugin strips SLURM_CONF inside jobs, so jobs read this path
MARKER="# Written by llmbuild's scripts/slurm-local.sh"  # the config's first line: how stop knows it is ours
NODE=localhost
PACKAGES=(munge slurmctld slurmd slurm-client)
# munged's default socket: slurm's auth/munge plugin and the munge/unmunge tools find it without settings.
MUNGE_SOCKET=/run/munge/munge.socket.2

die() { echo "slurm-local.sh: $*" >&2; exit 1; }

# The pid in FILE if that process is alive and is the daemon NAME (a stale file whose pid was reused by
# another program must never lead to killing that program).
live_pid() {
    local file=$1 name=$2 pid
    [ -s "$file" ] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$name" ] || return 1
    echo "$pid"
}

require_root() {
    [ "$(id -u)" = 0 ] || die "must run as root (it starts daemons and writes /etc/slurm); you are $(id -un)"
}

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} = 0 ] && return 0
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
    echo "slurm-local.sh: installing ${missing[*]}" >&2
    # Debian's postinst scripts try to start the daemons through init; policy-rc.d (exit 101) forbids it,
    # so that only the daemons this script starts, with its configuration, ever run.
    local policy=/usr/sbin/policy-rc.d had_policy=0
    [ -e "$policy" ] && had_policy=1
    if [ $had_policy = 0 ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
    fi
    local log="$STATE/apt.log" rc=0
    mkdir -p "$STATE"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
        || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
             apt-get install -y -q --no-install-recommends "${missing[@]}"; }; } >"$log" 2>&1 || rc=$?
    [ $had_policy = 1 ] || rm -f "$policy"
    [ $rc = 0 ] || die "apt-get install ${missing[*]} failed (exit $rc; see $log: $(tail -n 1 "$log"))"
}

write_config() {
    # The node as this machine is: all its CPUs, and its memory less 10% for the OS and page cache
    # (slurmd marks a node invalid when RealMemory exceeds what it finds).
    local cpus mem_mb def_mem
    cpus=$(nproc)
    mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    # Without DefMemPerCPU a job that asks for no memory is given the whole node, so jobs run one at a time.
    def_mem=$((mem_mb / cpus))
    mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d"
    local tmp
    tmp=$(mktemp /etc/slurm/.slurm.conf.XXXXXX)
    cat >"$tmp" <<EOF
$MARKER: a single-node cluster on 127.0.0.1 for tests and trials.
ClusterName=llmbuild-local
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# No cgroups inside a container: track job processes through /proc, bind no tasks to cores.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# Jobs share the node by cores and memory (several small build steps at once).
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$def_mem
SchedulerType=sched/backfill
# No accounting database: Snakemake polls with squeue (--slurm-status-command squeue), which sees a job
# only while slurmctld keeps it, so keep finished jobs 10 minutes; jobcomp/filetxt records every finished
# job for \`sacct -c\`.
AccountingStorageType=accounting_storage/none
MinJobAge=600
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.txt
# A restarted slurmd brings its node back without an administrator.
ReturnToService=2
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
# Two partitions on the one node: \`main\` for every step, \`large\` for the steps a real cluster sends to
# bigger nodes (profiles/slurm/ sends quantize there), so the profile runs here unchanged.
PartitionName=main Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=large Nodes=$NODE Default=NO MaxTime=INFINITE State=UP
EOF
    chmod 644 "$tmp"
    mv -f "$tmp" "$CONF"
}

start_munge() {
    if live_pid "$STATE/munged.pid" munged >/dev/null; then return 0; fi
    local other
    other=$(pgrep -x munged || true)
    [ -z "$other" ] || die "a munged not started by this script runs (pid $other); stop it or use its cluster"
    # Our own key, made once: never the system's (there may be none, or it may belong to another cluster).
    if [ ! -s "$STATE/munge.key" ]; then
        (umask 077 && dd if=/dev/urandom of="$STATE/munge.key" bs=1024 count=1 status=none)
    fi
    mkdir -p "$(dirname "$MUNGE_SOCKET")" "$STATE/munge"
    chmod 700 "$STATE/munge"
    # --force: munged refuses to start as root, or with a socket left by a killed munged, without it.
    munged --force --key-file="$STATE/munge.key" --socket="$MUNGE_SOCKET" --pid-file="$STATE/munged.pid" \
        --log-file="$STATE/munged.log" --seed-file="$STATE/munge/munged.seed" \
        || die "munged did not start (see $STATE/munged.log)"
    local _
    for _ in $(seq 50); do
        munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "munged does not answer on $MUNGE_SOCKET (see $STATE/munged.log)"
}

start_daemon() {  # NAME ARGS...: slurmctld or slurmd, which daemonize and write their pid files themselves
    local name=$1
    shift
    live_pid "$STATE/$name.pid" "$name" >/dev/null && return 0
    local other
    other=$(pgrep -x "$name" || true)
    [ -z "$other" ] || die "a $name not started by this script runs (pid $other); stop it first"
    "$name" "$@" || die "$name did not start (see $STATE/$name.log)"
    local _
    for _ in $(seq 50); do
        live_pid "$STATE/$name.pid" "$name" >/dev/null && return 0
        sleep 0.1
    done
    die "$name exited at start (see $STATE/$name.log: $(tail -n 1 "$STATE/$name.log" 2>/dev/null))"
}

wait_idle() {
    local _ state=""
    for _ in $(seq 150); do
        state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n 1 || true)
        case "$state" in
            idle*|mixed*|allocated*) return 0 ;;
            down*|drain*|fail*)
                # A node left down by an earlier run: it is ours, bring it back.
                scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
        esac
        sleep 0.2
    done
    die "node $NODE is '${state:-unknown}', not idle, after 30 s (see $STATE/slurmd.log and $STATE/slurmctld.log)"
}

start() {
    require_root
    if status >/dev/null 2>&1; then
        echo "slurm-local.sh: already running ($(sinfo -h -o '%P %D %c %m %T' | tr '\n' ';'))"
        return 0
    fi
    install_packages
    mkdir -p "$STATE"
    chmod 755 "$STATE"
    write_config
    start_munge
    # The saved state is kept across stop/start so that job ids never repeat (the jobcomp record that
    # `sacct -c` reads outlives a restart); -i starts even when it does not fit a changed configuration.
    start_daemon slurmctld -i
    start_daemon slurmd -N "$NODE"
    wait_idle
    echo "slurm-local.sh: running on 127.0.0.1: $(sinfo -h -o 'partition %P: %D node, %c CPUs, %m MB, %T' \
        | tr '\n' ';')"
}

stop_daemon() {  # NAME: TERM the pid in its pid file, wait, KILL after 10 s
    local name=$1 pid _
    pid=$(live_pid "$STATE/$name.pid" "$name") || { rm -f "$STATE/$name.pid"; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
        [ -d "/proc/$pid" ] || { rm -f "$STATE/$name.pid"; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$STATE/$name.pid"
}

stop() {
    require_root
    # slurmd first: it ends the job steps it runs; then the controller, then authentication.
    stop_daemon slurmd
    stop_daemon slurmctld
    stop_daemon munged
    # A config naming a controller that no longer runs makes every `scontrol` wait 9 s for it, and
    # Snakemake's SLURM executor plugin runs `scontrol show config` when it is imported, that is at every
    # `snakemake` start: it would add 9 s to every later build on this machine. Only our own file goes.
    if [ -f "$CONF" ] && head -n 1 "$CONF" | grep -qF "$MARKER"; then
        rm -f "$CONF"
    fi
    echo "slurm-local.sh: stopped"
}

status() {
    local name pid up=0
    for name in munged slurmctld slurmd; do
        if pid=$(live_pid "$STATE/$name.pid" "$name"); then
            echo "$name: running (pid $pid)"
            up=$((up + 1))
        else
            echo "$name: not running"
        fi
    done
    [ $up = 3 ] || return 1
    sinfo -h -o 'partition %P: %D node, %c CPUs, %m MB, %T' 2>/dev/null || true
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: slurm-local.sh start|stop|status" ;;
esac
