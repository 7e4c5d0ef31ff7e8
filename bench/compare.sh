#!/bin/sh
# Runs bench/compare.py with the system Python on an existing build, from any directory
# (scripts/bench.sh installs and builds first).
#   bench/compare.sh --quick
#   bench/compare.sh --transports ofi:tcp --provider tcp --reps 5
exec /usr/bin/python3 "$(dirname "$0")/compare.py" "$@"
