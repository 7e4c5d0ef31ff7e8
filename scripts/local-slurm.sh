#!/usr/bin/env bash
# Brings up a throwaway single-node Slurm (Debian's slurm-wlm + munge) as root, runs ferry's
# multi-process checks under `srun --mpi=pmi2` (ferry's PMI-1 wire client) and
# `srun --mpi=pmix` (ferry's PMIx client), and tears everything down on exit.
#   sudo scripts/local-slurm.sh            # build/ must already hold the binaries
#   FERRY_BUILD=build-asan sudo scripts/local-slurm.sh
# Everything (munge key and socket, slurm.conf, state, logs) lives in $FERRY_SLURM_DIR
# (default /tmp/ferry-local-slurm), which is recreated on each run; nothing is written to
# /etc. Not part of CI: it needs root and installs packages if slurmctld or munged is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="$root/${FERRY_BUILD:-build}/bin"
dir=${FERRY_SLURM_DIR:-/tmp/ferry-local-slurm}

[ "$(id -u)" = 0 ] || { echo "local-slurm.sh: must run as root (slurmd runs jobs as any user)" >&2; exit 2; }
for b in ferry-mp-tests ferry-parcel-test; do
  [ -x "$bin/$b" ] || { echo "local-slurm.sh: $bin/$b is missing; build ferry first" >&2; exit 2; }
done
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge
fi
plugins=/usr/lib/x86_64-linux-gnu/slurm-wlm
for p in mpi_pmi2.so mpi_pmix.so; do
  [ -e "$plugins/$p" ] || { echo "local-slurm.sh: Slurm plugin $plugins/$p is missing" >&2; exit 2; }
done

pids=()
# slurmstepd detaches from slurmd, so it is found by the SLURM_CONF it inherited: only the
# step daemons of this instance carry this script's slurm.conf path.
our_stepds() {
  local p
  for p in $(pgrep -x slurmstepd || true); do
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qxF "SLURM_CONF=$1" && echo "$p"
  done
  return 0
}
cleanup() {
  local rc=$? p
  if [ -n "${SLURM_CONF:-}" ] && [ -e "$SLURM_CONF" ]; then
    scancel --quiet --full -u root 2>/dev/null || true
    for _ in $(seq 100); do [ -z "$(our_stepds "$SLURM_CONF")" ] && break; sleep 0.1; done
    for p in $(our_stepds "$SLURM_CONF"); do kill -9 "$p" 2>/dev/null || true; done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A previous run that was killed hard may have left its daemons behind: stop those by the
# pids it recorded, then start from an empty directory.
for f in "$dir"/*.pid; do
  [ -e "$f" ] || continue
  p=$(cat "$f"); c=$(cat "/proc/$p/comm" 2>/dev/null || true)
  case "$c" in munged|slurmctld|slurmd) kill "$p"; sleep 1; kill -9 "$p" 2>/dev/null || true ;; esac
done
for p in $(our_stepds "$dir/slurm.conf"); do kill -9 "$p" 2>/dev/null || true; done
rm -rf "$dir"
mkdir -p "$dir"/{munge,state,spool,log}
chmod 0755 "$dir"
chmod 0700 "$dir/munge"

# munge: a private key and socket, so a system munged (if any) is neither used nor disturbed.
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 0400 "$dir/munge/munge.key"
sock="$dir/munge/munge.socket"
munged --force --foreground --socket="$sock" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
  --seed-file="$dir/munge/munged.seed" >"$dir/log/munged.out" 2>&1 &
pids+=($!); echo $! >"$dir/munged.pid"
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { echo "munged did not start:"; cat "$dir/log/munged.out" "$dir/log/munged.log"; exit 1; }
munge --socket="$sock" -n | unmunge --socket="$sock" >/dev/null

host=$(hostname -s)
export SLURM_CONF="$dir/slurm.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=ferrylocal
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
SlurmctldPort=${FERRY_SLURMCTLD_PORT:-6817}
SlurmdPort=${FERRY_SLURMD_PORT:-6818}
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pidfile
SlurmdPidFile=$dir/slurmd.pidfile
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SwitchType=switch/none
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

slurmctld -D -i -f "$SLURM_CONF" >"$dir/log/slurmctld.out" 2>&1 &
pids+=($!); echo $! >"$dir/slurmctld.pid"
slurmd -D -f "$SLURM_CONF" >"$dir/log/slurmd.out" 2>&1 &
pids+=($!); echo $! >"$dir/slurmd.pid"
state=""
for _ in $(seq 100); do
  state=$(sinfo -h -N -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.2
done
if [ "$state" != idle ]; then
  echo "local-slurm.sh: node did not become idle (state '$state')"
  tail -n 20 "$dir"/log/*
  exit 1
fi
sinfo

pass=0; fail=0; failed=()
check() {  # check NAME ENV... -- SRUN-ARGS...
  local name=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  echo "=== $name: ${envs[*]} srun $*"
  if env "${envs[@]}" timeout 120 srun "$@" >"$dir/log/$name.out" 2>&1; then
    pass=$((pass + 1)); tail -n 3 "$dir/log/$name.out"; echo "--- $name: PASS"
  else
    local rc=$?
    fail=$((fail + 1)); failed+=("$name"); tail -n 30 "$dir/log/$name.out"; echo "--- $name: FAIL (exit $rc)"
  fi
}

echo "=== launch environment under --mpi=pmi2"
timeout 120 srun -n 2 --mpi=pmi2 bash -c 'env | grep -E "^(PMI|PMIX|SLURM_PROCID)" | sort | sed "s/^/rank $SLURM_PROCID: /"' | sort
echo "=== launch environment under --mpi=pmix (PMI/PMIX_RANK/PMIX_NAMESPACE only)"
timeout 120 srun -n 2 --mpi=pmix bash -c 'env | grep -E "^(PMI_|PMIX_RANK|PMIX_NAMESPACE|SLURM_PROCID)" | sort | sed "s/^/rank $SLURM_PROCID: /"' | sort

mp_filter='--gtest_filter=ActiveMessage.*:SendRecv.AnySource'
check mp-pmi2-pmi1  FERRY_BOOTSTRAP=pmi1 -- -n 2 --mpi=pmi2 "$bin/ferry-mp-tests" "$mp_filter"
check mp-pmi2-auto  FERRY_BOOTSTRAP=auto -- -n 2 --mpi=pmi2 "$bin/ferry-mp-tests" "$mp_filter"
check mp-pmix-pmix  FERRY_BOOTSTRAP=pmix -- -n 2 --mpi=pmix "$bin/ferry-mp-tests" "$mp_filter"
check mp-pmix-auto  FERRY_BOOTSTRAP=auto -- -n 2 --mpi=pmix "$bin/ferry-mp-tests" "$mp_filter"
check parcel-pmi2   FERRY_BOOTSTRAP=pmi1 -- -n 2 --mpi=pmi2 "$bin/ferry-parcel-test" --parcels 200
check parcel-pmix   FERRY_BOOTSTRAP=pmix -- -n 2 --mpi=pmix "$bin/ferry-parcel-test" --parcels 200

# The proxies' cluster script, as submitted, on this one node (one rank, small problems): its
# srun launches of ferry-octree, ferry-bspmm and ferry-bspmm-mpi (MPICH's PMI-1 client, so
# --mpi=pmi2) and its results folder.
if [ -x "$bin/ferry-octree" ] && [ -x "$bin/ferry-bspmm" ] && [ -x "$bin/ferry-bspmm-mpi" ]; then
  name=apps-sbatch
  echo "=== $name: sbatch -N 1 apps/slurm-apps.sbatch (one rank)"
  out="$dir/apps-results"
  if FERRY_DIR="$root" FERRY_BUILD_DIR="$root/${FERRY_BUILD:-build}" APPS_PYTHON=/usr/bin/python3 APPS_THREADS=1 \
       APPS_REPS=1 SRUN_MPI=pmi2 APPS_OUT="$out" \
       timeout 300 sbatch --wait -N 1 --exclusive=user -o "$dir/log/$name.out" "$root/apps/slurm-apps.sbatch" \
       --octree-args "--steps 5" --bspmm-args "--stage1-blocks 3 --stage1-block-size 32 --stage2-blocks 6 --stage2-block-size 8" \
       && [ -s "$out/summary.md" ]; then  # sbatch --wait exits with the job's code: apps.py's, 1 on a failed run
    pass=$((pass + 1)); tail -n 5 "$dir/log/$name.out"; echo "--- $name: PASS"
  else
    fail=$((fail + 1)); failed+=("$name"); tail -n 30 "$dir/log/$name.out"; echo "--- $name: FAIL"
  fi
fi

echo "=== local-slurm.sh: $pass passed, $fail failed${failed[*]:+: ${failed[*]}} (logs in $dir/log)"
[ "$fail" = 0 ]
