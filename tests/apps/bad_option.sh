#!/usr/bin/env bash
# bad_option.sh FERRYRUN OCTREE — a bad option ends the job with exit 2 and a message naming the
# option and its value (each rank prints it: the launcher may stop the job before rank 0 does).
ferryrun=$1 octree=$2
fail=0
check() {  # expected-text args...
  local want=$1
  shift
  out=$("$ferryrun" -n 2 --timeout 30 -- "$octree" "$@" 2>&1)
  rc=$?
  if [ "$rc" != 2 ]; then echo "FAIL: $* exited $rc, not 2: $out"; fail=1; return; fi
  if ! grep -q -- "$want" <<<"$out"; then echo "FAIL: $*: expected a line with '$want': $out"; fail=1; return; fi
  echo "ok: $* -> $(grep -- "$want" <<<"$out")"
}
check "--cells 1 is out of range" --cells 1
check "--max-level 1 is below --min-level 2" --max-level 1
check "--steps 0 is out of range" --steps 0
check "--parcelport 'nope'" --parcelport nope
check "give more than" --min-level 8 --max-level 8
check "--threads -1 is out of range" --threads -1
exit $fail
