#!/usr/bin/env bash
# Evidence for ferry's lock models and completion queues that a 2-core machine cannot give by
# wall-clock rates: instructions per message under callgrind (every lock model, every queue)
# and oversubscription (2T busy threads on the cores: rate, voluntary and involuntary context
# switches per message). Installs the Debian packages ferry needs (valgrind included), builds
# ferry-bench and ferryrun (Release), then runs bench/lock_evidence.py with every argument
# given here; results in results/lock-evidence-<date>/ (summary.md, CSV).
#   scripts/lock-evidence.sh --quick                   # a smoke test, under a minute
#   scripts/lock-evidence.sh                           # the default sweep, about 8 minutes
#   scripts/lock-evidence.sh --skip callgrind --reps 3 --threads 2,8
# FERRY_BUILD_DIR (default build) picks the build tree. lock_evidence.py --help lists every knob.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FERRY_BUILD_DIR:-build}"

scripts/deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)" --target ferry-bench ferryrun

exec /usr/bin/python3 bench/lock_evidence.py --bin-dir "$build/bin" "$@"
