#!/usr/bin/env bash
# Runs a job of 4 ranks on two "hosts" made of network namespaces: ranks 0-1 in one, 2-3 in the
# other, each namespace with a hostname of its own (unshare --uts) and one end of a veth pair,
# so FERRY_TRANSPORT=auto finds two hosts by their names and libfabric's tcp provider really
# crosses a network link between them (shared memory inside each pair).
#   netns_hosts.sh FERRYRUN PROGRAM [ARGS...]
# Exits 77 (ctest's skip) when namespaces cannot be made here (no ip, no CAP_NET_ADMIN); the
# hybrid tests through split_hosts.sh (FERRY_HOST) cover that case. Removes its namespaces on
# every exit path. FERRY_NETNS_NAME: the namespaces' name prefix (default ferrytest<pid>).
# FERRY_NETNS_CUT_DIR=<dir>: once every rank has created <dir>/flooding.<rank>, takes the
# link down (the first host's end) and creates <dir>/cut (see link_cut.cpp).
set -u
if [ "${1:-}" = "--rank" ]; then
  # Inside ferryrun: enter this rank's namespace with a hostname of its own.
  shift
  h=$(( ${PMI_RANK:?netns_hosts.sh --rank runs under ferryrun} / 2 ))
  exec ip netns exec "${FERRY_NETNS_PREFIX:?}-$h" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' \
    "ferry-netns-host$h" "$@"
fi

ferryrun=${1:?usage: netns_hosts.sh FERRYRUN PROGRAM [ARGS...]}
shift
prefix=${FERRY_NETNS_NAME:-ferrytest$$}
veth="fy$$"  # interface names hold at most 15 characters
export FERRY_NETNS_PREFIX=$prefix

cutter=""
cleanup() {
  [ -n "$cutter" ] && kill "$cutter" 2>/dev/null && wait "$cutter" 2>/dev/null
  ip netns del "$prefix-0" 2>/dev/null
  ip netns del "$prefix-1" 2>/dev/null
}
trap cleanup EXIT

if ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
  echo "netns_hosts.sh: ip or unshare is missing: skipped"
  exit 77
fi
if ! ip netns add "$prefix-0" 2>/dev/null || ! ip netns add "$prefix-1" 2>/dev/null; then
  echo "netns_hosts.sh: cannot create network namespaces here (needs root and CAP_NET_ADMIN): skipped"
  exit 77
fi
# One veth pair, an end in each namespace under the same name, so one FI_TCP_IFACE names both.
link() {
  ip link add "${veth}a" type veth peer name "${veth}b" &&
    ip link set "${veth}a" netns "$prefix-0" &&
    ip link set "${veth}b" netns "$prefix-1" || return 1
  for h in 0 1; do
    end=$([ $h = 0 ] && echo "${veth}a" || echo "${veth}b")
    ip -n "$prefix-$h" link set "$end" name ferry0 &&
      ip -n "$prefix-$h" addr add "10.231.7.$((h + 1))/24" dev ferry0 &&
      ip -n "$prefix-$h" link set ferry0 up &&
      ip -n "$prefix-$h" link set lo up || return 1
  done
}
if ! link; then
  echo "netns_hosts.sh: cannot link the namespaces with a veth pair here: skipped"
  exit 77
fi
if [ -n "${FERRY_NETNS_CUT_DIR:-}" ]; then
  (
    for _ in $(seq 1200); do  # a minute at most; the ranks fail on their own deadline after it
      [ "$(ls "$FERRY_NETNS_CUT_DIR" | grep -c '^flooding\.')" -ge 4 ] && break
      sleep 0.05
    done
    ip -n "$prefix-0" link set ferry0 down
    touch "$FERRY_NETNS_CUT_DIR/cut"
    echo "netns_hosts.sh: the link between the hosts is down"
  ) &
  cutter=$!
fi
FI_TCP_IFACE=ferry0 FI_SOCKETS_IFACE=ferry0 "$ferryrun" -n 4 --timeout "${FERRY_NETNS_TIMEOUT:-240}" -- \
  bash "$0" --rank "$@"
