#!/usr/bin/env bash
# A real Slurm 22.05 cluster on this machine (munged, slurmctld, N slurmd nodes, and slurmrestd, the
# Slurm REST API, with JWT authentication), so that the unmodified slurm/*.slurm scripts run here exactly
# as on the AWS cluster: for development, CI (tests/slurm) and `make demo`. No systemd needed; every
# command is idempotent.
#
#   scripts/local-slurm.sh start            install what is missing, start what is not running
#   scripts/local-slurm.sh status           daemons and nodes; exit 0 when the cluster is up
#   scripts/local-slurm.sh token [SECONDS]  a JWT for the REST API (`scontrol token`): prints SLURM_JWT=...
#   scripts/local-slurm.sh stop [--purge]   stop the daemons this script started (by PID file);
#                                           --purge also removes namespaces, bridge, hosts block, state
#   scripts/local-slurm.sh kill-node NODE   lose a node as if its instance vanished (netns mode): every
#                                           process on it ends at once (SIGKILL), then it is marked down
#                                           as ParallelCluster does; `start` brings it back
#
# Settings (environment):
#   SLURM_LOCAL_MODE         netns: each node in its own network namespace with its own host name and
#                            address, like real hosts (default); loopback: `slurmd -N` on 127.0.0.1.
#                            netns falls back to loopback where namespaces cannot be created.
#   SLURM_LOCAL_NODES        number of nodes (2)
#   SLURM_LOCAL_CPUS         CPUs each node offers; default: a node of slurm/env.sh's instance type
#                            (GPUs x CPUs per GPU), so the scripts' resource requests fit unchanged
#                            (slurmd is told to trust slurm.conf over the real core count)
#   SCDINO_CLUSTER_ENV       a cluster's site file (slurm/env.sh): the local cluster gets its partitions,
#                            the first the default, and the default preset's CPUs, and
#                            .local-slurm/scdino-env.sh names it for the jobs; without one,
#                            slurm/env.sh's default partition alone
#   SLURM_LOCAL_PARTITIONS   extra partition names, after those
#   SLURM_LOCAL_CRED_EXPIRE  seconds; a requeued job becomes eligible this + 1 s later (10)
#   SLURM_LOCAL_MIN_JOB_AGE  seconds the controller keeps a finished job (600); after that only the job
#                            completion log knows it (`sacct --completion`). A short one rehearses a slow
#                            machine or a busy cluster; a change is applied without a restart
#   SLURM_LOCAL_BASE         state, logs, PID files and slurm.conf (<repo>/.local-slurm)
#   SLURM_LOCAL_SUBNET       first three octets of the nodes' network in netns mode (10.99.0)
#   SLURM_LOCAL_REST_PORT    where slurmrestd listens on 127.0.0.1 (6820, Slurm's usual port). It always
#                            runs: it costs about 8 MB and answers 0.1 s after it starts (measured), and a
#                            setting would restart the cluster whenever two users' settings differ. The
#                            controller takes JWTs signed with <base>/etc/jwt_hs256.key (AuthAltTypes)
# Slurm is root-only here: run as root (CI machines and containers are).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=${SLURM_LOCAL_MODE:-netns}
NODES=${SLURM_LOCAL_NODES:-2}
CPUS=${SLURM_LOCAL_CPUS:-}
CRED_EXPIRE=${SLURM_LOCAL_CRED_EXPIRE:-10}
MIN_JOB_AGE=${SLURM_LOCAL_MIN_JOB_AGE:-600}
SITE_FILE=${SCDINO_CLUSTER_ENV:-}
BASE=${SLURM_LOCAL_BASE:-$REPO/.local-slurm}
SUBNET=${SLURM_LOCAL_SUBNET:-10.99.0}
REST_PORT=${SLURM_LOCAL_REST_PORT:-6820}
# slurmctld's OpenAPI plugins; the dbv* ones need slurmdbd, which this cluster has not.
REST_PLUGINS=openapi/v0.0.36,openapi/v0.0.37,openapi/v0.0.38
# Debian's JWT plugin, in the multiarch folder of this machine (x86_64-linux-gnu, aarch64-linux-gnu).
JWT_PLUGIN=/usr/lib/$(uname -m)-linux-gnu/slurm-wlm/auth_jwt.so
BRIDGE=slurmbr0
CONF_LINK=/etc/slurm/slurm.conf
HOSTS_BEGIN="# BEGIN local-slurm (scripts/local-slurm.sh)"
HOSTS_END="# END local-slurm"
MUNGE_KEY=/etc/munge/munge.key

log() { echo "local-slurm: $*" >&2; }
die() { echo "local-slurm: error: $*" >&2; exit 1; }

node_name() { echo "node$1"; }
node_list() { if ((NODES == 1)); then echo node1; else echo "node[1-$NODES]"; fi; }
node_addr() { if [ "$MODE" = netns ]; then echo "$SUBNET.$((10 + $1))"; else echo 127.0.0.1; fi; }
ctld_addr() { if [ "$MODE" = netns ]; then echo "$SUBNET.1"; else echo 127.0.0.1; fi; }

require_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (slurmd, munged and network namespaces need it): sudo $0 $*"
}

ensure_packages() {
  local tool missing=0
  for tool in slurmctld slurmd sbatch munged unmunge ip nsenter slurmrestd; do
    command -v "$tool" >/dev/null || missing=1
  done
  [ -e "$JWT_PLUGIN" ] || missing=1
  if ((missing)); then
    log "installing Slurm and munge packages"
    "$REPO/scripts/install-system-deps.sh"
  fi
}

# --- munge: authentication between all Slurm daemons and clients ---------------------------------

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

ensure_munge() {
  if [ ! -s "$MUNGE_KEY" ]; then
    log "creating $MUNGE_KEY"
    install -d -o munge -g munge -m 0700 /etc/munge
    dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
    chown munge:munge "$MUNGE_KEY"
    chmod 0400 "$MUNGE_KEY"
  fi
  munge_works && return 0
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged --force </dev/null >/dev/null 2>&1
  cp /run/munge/munged.pid "$BASE/run/munged.pid"
  local i
  for i in $(seq 50); do munge_works && return 0; sleep 0.1; done
  die "munged did not start; see /var/log/munge/munged.log"
}

# --- network: a bridge and one namespace per node (netns mode) ------------------------------------

netns_ready() {
  local i
  ip link show "$BRIDGE" >/dev/null 2>&1 || return 1
  for i in $(seq "$NODES"); do
    [ -e "/run/netns/slurm-$(node_name "$i")" ] || return 1
  done
}

create_netns() {
  local i ns
  ip link show "$BRIDGE" >/dev/null 2>&1 || {
    ip link add "$BRIDGE" type bridge
    ip addr add "$SUBNET.1/24" dev "$BRIDGE"
  }
  ip link set "$BRIDGE" up
  for i in $(seq "$NODES"); do
    ns=slurm-$(node_name "$i")
    [ -e "/run/netns/$ns" ] && continue
    ip netns add "$ns"
    ip link add "veth-n$i" type veth peer name eth0 netns "$ns"
    ip link set "veth-n$i" master "$BRIDGE" up
    ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
}

ensure_network() {
  [ "$MODE" = netns ] || return 0
  netns_ready && return 0
  if ! (create_netns) 2>"$BASE/log/netns.err"; then
    log "network namespaces unavailable ($(tail -n1 "$BASE/log/netns.err")); using loopback mode"
    remove_netns
    MODE=loopback
  fi
}

remove_netns() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '/^slurm-node/ {print $1}'); do
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

# Node names must resolve on every node: torchrun's rendezvous and MASTER_ADDR use them.
hosts_block() {
  local i
  echo "$HOSTS_BEGIN"
  for i in $(seq "$NODES"); do echo "$(node_addr "$i") $(node_name "$i")"; done
  echo "$HOSTS_END"
}

write_hosts() {
  local keep=$1 tmp
  tmp=$(mktemp)
  awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0==b{skip=1} !skip{print} $0==e{skip=0}' /etc/hosts >"$tmp"
  [ "$keep" = yes ] && hosts_block >>"$tmp"
  # /etc/hosts may be a bind mount: rewrite it in place rather than rename over it.
  cmp -s "$tmp" /etc/hosts || cat "$tmp" >/etc/hosts
  rm -f "$tmp"
}

# --- slurm.conf ----------------------------------------------------------------------------------

# A value of slurm/env.sh (the site settings the sbatch scripts use), e.g. SCDINO_PARTITION.
site_value() {
  # shellcheck source=slurm/env.sh
  (source "$REPO/slurm/env.sh" && echo "${!1}")
}

real_memory() {
  local mem
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  echo $((mem * 9 / 10 / NODES))
}

node_lines() {
  local i port mem
  mem=$(real_memory)
  for i in $(seq "$NODES"); do
    port=""
    [ "$MODE" = loopback ] && port=" NodeHostname=$(hostname -s) Port=$((17000 + i))"
    echo "NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i")$port CPUs=$CPUS RealMemory=$mem State=UNKNOWN"
  done
}

# The site's partitions (the default first: slurm/env.sh's, else those of its site file), then the extra ones.
partition_lines() {
  local name default=YES seen=" "
  for name in $(site_value SCDINO_PARTITION) $(site_value SCDINO_CLUSTER_PRESETS | awk '{print $2}') \
    ${SLURM_LOCAL_PARTITIONS:-}; do
    [[ "$seen" == *" $name "* ]] && continue
    seen+="$name "
    echo "PartitionName=$name Nodes=$(node_list) Default=$default MaxTime=INFINITE State=UP"
    default=NO
  done
}

render_conf() {
  cat <<EOF
# Written by scripts/local-slurm.sh (mode $MODE); regenerated on every start.
ClusterName=local
SlurmctldHost=$(hostname -s)($(ctld_addr))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire + 1 s before it may run again, and a launch's credential must reach its
# node within cred_expire: 10 s keeps requeues short with room for a busy machine (Slurm: 120 s, at least 5).
AuthInfo=cred_expire=$CRED_EXPIRE
# The REST API's clients (slurmrestd, tokens from scontrol token) sign with this key.
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$BASE/etc/jwt_hs256.key
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$BASE/log/jobcomp.log
# Nodes look like the cluster's instance type even where this machine has fewer cores.
SlurmdParameters=config_overrides
# CPU-only accounting: memory-based selection would give each job a whole node.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
# A finished job stays in scontrol show job this long, then only in the job completion log.
MinJobAge=$MIN_JOB_AGE
KillWait=10
StateSaveLocation=$BASE/state/ctld
SlurmdSpoolDir=$BASE/state/slurmd-%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
$(node_lines)
$(partition_lines)
EOF
}

# Writes the config; prints what its change from the one the daemons run with needs: nothing,
# "reconfigure" (only lines `scontrol reconfigure` applies to running daemons: MinJobAge, partitions)
# or "restart" (anything else: nodes, plugins, addresses).
# An existing /etc/slurm/slurm.conf that another checkout's local cluster wrote (same header) may be
# replaced once that cluster is down; anything else is not ours to overwrite.
check_takeover() {
  local other=$1 other_base
  if ! head -n 1 "$other" 2>/dev/null | grep -q '^# Written by scripts/local-slurm.sh'; then
    die "$CONF_LINK exists and is not a local-slurm cluster's; move it away (it is not ours to overwrite)"
  fi
  other_base=$(dirname "$(dirname "$other")")
  if alive "$other_base/run/slurmctld.pid" slurmctld; then
    die "another local cluster ($other_base) is running: stop it with its own scripts/local-slurm.sh stop"
  fi
  log "taking over $CONF_LINK from the stopped cluster in $other_base"
}

# slurm.conf lines a running controller takes from `scontrol reconfigure` (and comments).
RECONFIGURABLE='^(#|MinJobAge=|PartitionName=)'

install_conf() {
  local conf=$BASE/etc/slurm.conf tmp
  if [ -e "$CONF_LINK" ] && [ "$(readlink -f "$CONF_LINK")" != "$(readlink -f "$conf")" ]; then
    check_takeover "$(readlink -f "$CONF_LINK")"
  fi
  tmp=$(mktemp "$BASE/etc/slurm.conf.XXXX")
  render_conf >"$tmp"
  chmod 0644 "$tmp"
  if cmp -s "$tmp" "$conf"; then
    rm -f "$tmp"
  else
    if [ -s "$conf" ] && diff <(grep -vE "$RECONFIGURABLE" "$conf") <(grep -vE "$RECONFIGURABLE" "$tmp") >/dev/null; then
      echo reconfigure
    else
      echo restart
    fi
    mv "$tmp" "$conf"
  fi
  install -d /etc/slurm
  ln -sfn "$conf" "$CONF_LINK"
}

# The overrides of slurm/env.sh for jobs on this cluster: `source .local-slurm/scdino-env.sh`
# before sbatch (sbatch passes the environment into the job). The venv is the repository's own.
# This machine's cores, whatever OMP_NUM_THREADS the caller runs with (nproc would follow it).
cores() { env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc; }

write_job_env() {
  cat >"$BASE/scdino-env.sh.tmp" <<EOF
# Written by scripts/local-slurm.sh: slurm/env.sh overrides for the local cluster.
export SCDINO_HOME=$REPO
export SCDINO_VENV=$REPO/.venv
export SCDINO_SCRATCH=$BASE/scratch
# All nodes share this machine's $(cores) cores: slurm/lib.sh's share_cores divides them among a
# job's processes; anything else runs one thread.
export SCDINO_SHARED_CORES=$(cores)
export OMP_NUM_THREADS=1
EOF
  # The site file this cluster's partitions come from, for the jobs and the submitter alike.
  if [ -n "$SITE_FILE" ]; then
    echo "export SCDINO_CLUSTER_ENV=$(readlink -f "$SITE_FILE")" >>"$BASE/scdino-env.sh.tmp"
  fi
  mv "$BASE/scdino-env.sh.tmp" "$BASE/scdino-env.sh"
}

# The JWT signing key: 32 random bytes, readable by SlurmUser (root here) alone, as Slurm requires.
ensure_jwt_key() {
  local key=$BASE/etc/jwt_hs256.key
  [ -s "$key" ] && return 0
  (umask 077 && dd if=/dev/urandom of="$key.tmp" bs=32 count=1 status=none)
  chown root:root "$key.tmp"
  chmod 0600 "$key.tmp"
  mv "$key.tmp" "$key"
}

# --- daemons -------------------------------------------------------------------------------------

# Alive = the PID file's process exists, is not a zombie (PID 1 may reap lazily) and is that program.
alive() {
  local pidfile=$1 comm=$2 pid state
  [ -s "$pidfile" ] || return 1
  pid=$(cat "$pidfile")
  [ -r "/proc/$pid/stat" ] || return 1
  state=$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [ "$state" != Z ] && [ "$(cat "/proc/$pid/comm")" = "$comm" ]
}

stop_pidfile() {
  local pidfile=$1 comm=$2 i
  alive "$pidfile" "$comm" || { rm -f "$pidfile"; return 0; }
  kill -TERM "$(cat "$pidfile")" 2>/dev/null || true
  for i in $(seq 150); do
    alive "$pidfile" "$comm" || break
    sleep 0.1
    ((i == 150)) && kill -KILL "$(cat "$pidfile")" 2>/dev/null
  done
  rm -f "$pidfile"
}

slurmd_pidfile() { echo "$BASE/run/slurmd-$(node_name "$1").pid"; }

start_slurmd() {
  local i=$1 name
  name=$(node_name "$i")
  alive "$(slurmd_pidfile "$i")" slurmd && return 0
  if [ "$MODE" = netns ]; then
    # nsenter, not `ip netns exec`: the latter remounts /sys, hiding the cgroup tree slurmd needs.
    nsenter --net="/run/netns/slurm-$name" unshare --uts \
      sh -c "hostname $name && exec slurmd -N $name" </dev/null >>"$BASE/log/slurmd-$name.stdout" 2>&1
  else
    slurmd -N "$name" </dev/null >>"$BASE/log/slurmd-$name.stdout" 2>&1
  fi
}

# Any HTTP answer will do: without a token, the API answers 401.
rest_works() {
  [ "$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$REST_PORT/openapi/v3")" != 000 ]
}

# slurmrestd on loopback with JWT authentication only; it drops root for nobody before serving requests.
# It answers within 0.1 s on an idle machine; the deadline is for a machine busy with the tests.
start_slurmrestd() {
  local deadline=$((SECONDS + 30))
  alive "$BASE/run/slurmrestd.pid" slurmrestd && return 0
  SLURM_JWT=daemon setsid slurmrestd -a rest_auth/jwt -s "$REST_PLUGINS" -u nobody -g nogroup \
    "127.0.0.1:$REST_PORT" </dev/null >>"$BASE/log/slurmrestd.log" 2>&1 &
  echo $! >"$BASE/run/slurmrestd.pid"
  until rest_works; do
    ((SECONDS < deadline)) || die "slurmrestd did not answer on 127.0.0.1:$REST_PORT after 30 s; see $BASE/log/slurmrestd.log"
    sleep 0.1
  done
}

stop_slurm_daemons() {
  local pidfile
  stop_pidfile "$BASE/run/slurmrestd.pid" slurmrestd
  for pidfile in "$BASE"/run/slurmd-*.pid; do
    [ -e "$pidfile" ] && stop_pidfile "$pidfile" slurmd
  done
  stop_pidfile "$BASE/run/slurmctld.pid" slurmctld
}

start_daemons() {
  local i
  alive "$BASE/run/slurmctld.pid" slurmctld ||
    slurmctld </dev/null >>"$BASE/log/slurmctld.stdout" 2>&1
  for i in $(seq "$NODES"); do start_slurmd "$i"; done
}

node_states() { sinfo -h -N -o '%N %T' 2>/dev/null | sort -u; }

# Waits until every node is usable; resumes nodes left down or drained by an earlier run.
wait_ready() {
  local deadline=$((SECONDS + 60)) states
  while ((SECONDS < deadline)); do
    if scontrol ping >/dev/null 2>&1; then
      states=$(node_states)
      if [ "$(grep -cE ' (idle|mixed|allocated|completing)' <<<"$states")" -eq "$NODES" ]; then
        return 0
      fi
      awk '$2 ~ /down|drain|fail/ {print $1}' <<<"$states" | while read -r node; do
        scontrol update nodename="$node" state=resume 2>/dev/null || true
      done
    fi
    sleep 0.5
  done
  die "nodes not ready after 60 s: $(node_states | tr '\n' ' '); see $BASE/log/"
}

# --- commands ------------------------------------------------------------------------------------

# Cancels every job the controller holds and waits (KillWait and a margin) until they are gone.
cancel_jobs() {
  local why=$1 ids i
  ids=$(squeue -h -o %A 2>/dev/null | sort -u | paste -sd' ') || return 0
  [ -n "$ids" ] || return 0
  # shellcheck disable=SC2086  # one id a word
  scancel $ids 2>/dev/null || true
  for i in $(seq 60); do
    [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break
    sleep 0.5
  done
  log "cancelled $(wc -w <<<"$ids") job(s) $why: $ids"
}

cmd_start() {
  local change restored=0
  require_root start
  ensure_packages
  install -d "$BASE"/{etc,run,log,state/ctld}
  [ -n "$CPUS" ] || CPUS=$(($(site_value SCDINO_GPUS_PER_NODE) * $(site_value SCDINO_CPUS_PER_GPU)))
  [ -s "$BASE/mode" ] && [ "$(cat "$BASE/mode")" != "$MODE" ] && log "switching to $MODE mode"
  ensure_network
  echo "$MODE" >"$BASE/mode"
  ensure_munge
  write_hosts yes
  write_job_env
  ensure_jwt_key
  change=$(install_conf)
  # A controller that was not running restores the jobs of its last run from its state folder; their
  # processes did not outlive it, and the jobs would hold the nodes the next command needs.
  alive "$BASE/run/slurmctld.pid" slurmctld || restored=1
  if [ "$change" = restart ]; then
    log "configuration changed: (re)starting slurmctld and slurmd"
    stop_slurm_daemons
  fi
  start_daemons
  wait_ready
  if [ "$change" = reconfigure ] && ((!restored)); then
    log "configuration changed: scontrol reconfigure"
    scontrol reconfigure
    wait_ready
  fi
  ((restored)) && cancel_jobs "restored from the last run (their processes ended with it)"
  start_slurmrestd
  log "ready ($MODE mode): $(node_states | tr '\n' ' '); REST API on 127.0.0.1:$REST_PORT"
}

cmd_stop() {
  require_root stop
  # Jobs do not outlive the cluster: cancelled now, they cannot come back with the next start.
  alive "$BASE/run/slurmctld.pid" slurmctld && cancel_jobs "still on the cluster"
  [ -d "$BASE/run" ] && stop_slurm_daemons
  [ -e "$BASE/run/munged.pid" ] && stop_pidfile "$BASE/run/munged.pid" munged
  if [ "${1:-}" = --purge ]; then
    remove_netns
    write_hosts no
    [ "$(readlink -f "$CONF_LINK")" = "$(readlink -f "$BASE/etc/slurm.conf")" ] && rm -f "$CONF_LINK"
    rm -rf "$BASE"
  fi
  log "stopped"
}

# What ParallelCluster does when an instance fails its EC2 health check or a Spot instance is
# reclaimed: the instance is gone with everything on it, and clustermgtd sets its Slurm node down,
# which makes Slurm requeue the node's requeueable batch jobs (NODE_FAIL). Without the `scontrol
# update`, slurmctld would notice the silent node only after SlurmdTimeout (300 s by default).
cmd_kill_node() {
  local name=${1:-} pids count i
  require_root kill-node
  MODE=$(cat "$BASE/mode" 2>/dev/null || echo "$MODE")
  if ! [[ $name =~ ^node([0-9]+)$ ]] || ((BASH_REMATCH[1] < 1 || BASH_REMATCH[1] > NODES)); then
    die "usage: $0 kill-node NODE, NODE one of $(node_list) (got '${name}')"
  fi
  [ "$MODE" = netns ] ||
    die "kill-node needs netns mode, where each node's processes are those of its network namespace (mode is $MODE)"
  pids=$(ip netns pids "slurm-$name")
  count=$(wc -w <<<"$pids")
  # shellcheck disable=SC2086  # one PID per word
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  for i in $(seq 50); do
    [ -z "$(ip netns pids "slurm-$name")" ] && break
    sleep 0.1
  done
  scontrol update nodename="$name" state=down reason="instance lost (local-slurm.sh kill-node)"
  log "killed $count process(es) on $name and marked it down; bring it back with: $0 start"
}

# A token for the REST API, valid SECONDS (default 1 h), for the user running this (root here).
cmd_token() {
  local seconds=${1:-3600}
  [[ $seconds =~ ^[1-9][0-9]*$ ]] || die "usage: $0 token [SECONDS], SECONDS a positive number (got '$seconds')"
  scontrol token lifespan="$seconds"
}

cmd_status() {
  local up=0 pidfile
  MODE=$(cat "$BASE/mode" 2>/dev/null || echo "$MODE")
  echo "mode: $MODE    state: $BASE"
  for pidfile in "$BASE/run/munged.pid" "$BASE/run/slurmctld.pid" "$BASE"/run/slurmd-*.pid "$BASE/run/slurmrestd.pid"; do
    [ -e "$pidfile" ] || continue
    if alive "$pidfile" "$(basename "$pidfile" .pid | sed 's/-.*//')"; then
      echo "running: $(basename "$pidfile" .pid) (pid $(cat "$pidfile"))"
    else
      echo "stopped: $(basename "$pidfile" .pid)"
      up=1
    fi
  done
  if alive "$BASE/run/slurmctld.pid" slurmctld && scontrol ping >/dev/null 2>&1; then
    sinfo
  else
    echo "slurmctld: not running (start with: $0 start)"
    up=1
  fi
  return "$up"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop "${2:-}" ;;
  status) cmd_status ;;
  kill-node) cmd_kill_node "${2:-}" ;;
  token) cmd_token "${2:-}" ;;
  *) die "usage: $0 start|stop [--purge]|status|kill-node NODE|token [SECONDS]" ;;
esac
