#!/bin/sh
# Runs bench/compare.py with the system Python (standard library only), from any directory.
#   bench/compare.sh --provider shm --reps 5
#   FERRY_PROVIDER=tcp bench/compare.sh --quick
exec /usr/bin/python3 "$(dirname "$0")/compare.py" "$@"
