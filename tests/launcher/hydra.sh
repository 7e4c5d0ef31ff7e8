#!/usr/bin/env bash
# hydra.sh FERRYRUN PROBE MPIEXEC_HYDRA — the probe's PMI-1 client also works under MPICH's
# hydra, i.e. ferryrun's server and hydra speak the same wire protocol.
. "$(dirname "$0")/lib.sh"
hydra=$1

"$hydra" -n 2 "$PROBE" ok >"$TMP/out" 2>"$TMP/err"
RC=$?
expect_rc 0 "mpiexec.hydra -n 2 probe ok"
expect_out '^rank 0 of 2 ok$'
expect_out '^rank 1 of 2 ok$'
echo "PASS: hydra interop"
