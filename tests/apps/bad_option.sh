#!/usr/bin/env bash
# bad_option.sh FERRYRUN PROGRAM (ferry-octree or ferry-bspmm) — a bad option ends the job with exit 2 and a message naming the
# option and its value (each rank prints it: the launcher may stop the job before rank 0 does).
ferryrun=$1 program=$2
fail=0
check() {  # expected-text args...
  local want=$1
  shift
  out=$("$ferryrun" -n 2 --timeout 30 -- "$program" "$@" 2>&1)
  rc=$?
  if [ "$rc" != 2 ]; then echo "FAIL: $* exited $rc, not 2: $out"; fail=1; return; fi
  if ! grep -q -- "$want" <<<"$out"; then echo "FAIL: $*: expected a line with '$want': $out"; fail=1; return; fi
  echo "ok: $* -> $(grep -- "$want" <<<"$out")"
}
case "$(basename "$program")" in
  ferry-octree)
    check "--cells 1 is out of range" --cells 1
    check "--max-level 1 is below --min-level 2" --max-level 1
    check "--steps 0 is out of range" --steps 0
    check "give more than" --min-level 8 --max-level 8
    ;;
  ferry-bspmm)
    check "--stage1-blocks 0 is out of range" --stage1-blocks 0
    check "--stage2-block-size 5000 is out of range" --stage2-block-size 5000
    check "--stage2-density 0.000000 is out of range" --stage2-density 0
    check "--in-flight 0 is out of range" --in-flight 0
    ;;
  *) echo "FAIL: no cases for $program"; exit 1 ;;
esac
check "--parcelport 'nope'" --parcelport nope
check "--threads -1 is out of range" --threads -1
exit $fail
