#!/usr/bin/env bash
# The factor study of [AMT-LCI] §5 (Figures 6-9) over ferry's design space: installs the Debian
# packages ferry needs, builds ferry-chains and ferryrun (Release), then runs
# bench/chains/factor_study.py with every argument given here.
#   scripts/factor-study.sh --quick                     # a few variants, under 2 minutes
#   scripts/factor-study.sh                             # every family, 3 reps (about 20 minutes on 2 cores)
#   scripts/factor-study.sh --families multithreading,oversubscribed --reps 5 --out results/mine
# FERRY_BUILD_DIR (default build) picks the build tree. factor_study.py --help lists every knob,
# --list every variant with its settings.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FERRY_BUILD_DIR:-build}"

scripts/deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
# Only what the study runs: a broken target elsewhere in the tree must not block it.
cmake --build "$build" -j "$(nproc)" --target ferry-chains ferry-c2c ferryrun

# Debian's python3-matplotlib is only visible to the system interpreter, not to a python3
# that may come first on PATH (pyenv, venv).
exec /usr/bin/python3 bench/chains/factor_study.py --bin-dir "$build/bin" "$@"
