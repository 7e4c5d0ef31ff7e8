#!/usr/bin/env bash
# option_edges.sh FERRYRUN HELLO MPTESTS — size options at and past their edges, over the
# transport in the environment: a combination that cannot work is refused at start-up with an
# error naming every setting involved (never a hang); the edge that can work does, data checked.
set -u
ferryrun=$1 hello=$2 mptests=$3
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# refused "ENV=V ..." "text" "text"...: the job fails within its timeout and says each text.
# The program is $program (default: hello).
program=("$hello")
refused() {
  local settings=$1; shift
  local out rc
  out=$(env $settings "$ferryrun" -n 2 --timeout 30 -- "${program[@]}" 2>&1)
  rc=$?
  if [ "$rc" = 0 ]; then fail "$settings was accepted"; return; fi
  if grep -q "timed out\|timeout" <<<"$out"; then fail "$settings hung instead of being refused: $out"; return; fi
  for text in "$@"; do
    grep -qF -- "$text" <<<"$out" || fail "$settings: the error does not say '$text': $out"
  done
  echo "ok: $settings refused: $(grep -m1 -F -- "$1" <<<"$out")"
}

# works "ENV=V ..." PROGRAM ARGS...: the job succeeds.
works() {
  local settings=$1; shift
  local out rc
  out=$(env $settings "$ferryrun" -n 2 --timeout 120 -- "$@" 2>&1)
  rc=$?
  if [ "$rc" != 0 ]; then fail "$settings $*: exit code $rc: $(tail -20 <<<"$out")"; return; fi
  echo "ok: $settings $(basename "$1") ${2:-}"
}

# Receives posted on a transport may not hold every packet: none would be left to send.
refused "FERRY_PACKETS=256" "FERRY_PACKETS=256" "FERRY_PREPOST=256"
refused "FERRY_PACKETS=100" "FERRY_PREPOST=256" "FERRY_PACKETS=100"
refused "FERRY_PACKETS=64 FERRY_PREPOST=64" "FERRY_PACKETS=64" "FERRY_PREPOST=64"
# A provider libfabric does not have is named in the error.
refused "FERRY_TRANSPORT=ofi FERRY_PROVIDER=bogus" "bogus"
# A keepalive timeout too short for the check interval to see its heartbeats.
refused "FERRY_PEER_TIMEOUT_MS=500" "FERRY_PEER_TIMEOUT_MS=500" "FERRY_PEER_CHECK_MS=200"
refused "FERRY_PEER_TIMEOUT_MS=4000 FERRY_PEER_CHECK_MS=1001" "FERRY_PEER_TIMEOUT_MS=4000" "FERRY_PEER_CHECK_MS=1001"
# No lock at all, and progress threads that would call into the devices beside the application.
refused "FERRY_LOCK_MODEL=serialized FERRY_PROGRESS=thread:1" "FERRY_LOCK_MODEL=serialized" "FERRY_PROGRESS=thread:1"
works "FERRY_LOCK_MODEL=serialized" "$hello"
works "FERRY_PEER_TIMEOUT_MS=800" "$hello"
works "FERRY_PEER_TIMEOUT_MS=0" "$hello"
works "FERRY_PACKETS=257" "$hello"
works "FERRY_PACKETS=2 FERRY_PREPOST=1" "$hello"
# Packets smaller than the transport's inject size: fragments are cut to fit a packet, and
# every size of every operation arrives intact (4080..16384 went as oversized fragments).
data="--gtest_filter=ActiveMessage.EverySize*:SendRecv.ExactMatch*:Put.Every*:Get.*"
works "FERRY_PACKET_SIZE=1024" "$mptests" "$data"
works "FERRY_PACKET_SIZE=1040" "$mptests" "$data"
works "FERRY_PACKET_SIZE=64" "$mptests" "$data"

# Ranks that disagree on a setting that shapes the wire are stopped at start-up, by name,
# before one truncates the other's messages: rank 1 alone gets the setting. A backend's row
# that declares itself job-wide too (the ofi provider; not where FERRY_PROVIDER, its old name,
# is set already: rank 1 would then stop on the two names' conflict instead).
job_wide=(FERRY_PACKET_SIZE=1024 FERRY_FRAGMENT=off FERRY_FRAGMENT_MAX=8192 FERRY_DEVICES=2 FERRY_PEER_TIMEOUT_MS=8000)
[ -z "${FERRY_PROVIDER:-}" ] && job_wide+=(FERRY_OFI_PROVIDER=tcp)
for setting in "${job_wide[@]}"; do
  program=(bash -c 'if [ "$PMI_RANK" = 1 ]; then export '"$setting"'; fi; exec "$0"' "$hello")
  refused "FERRY_LOG=warn" "ranks disagree on ${setting%%=*}" "'${setting#*=}'"
done
program=("$hello")

[ "$failures" = 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "ok: every edge works or is refused by name"
