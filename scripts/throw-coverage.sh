#!/usr/bin/env bash
# Which error paths in src/ and tools/ does the test suite reach? Builds ferry with gcc's
# coverage instrumentation (build-cov/, Debug, -O1), runs the plain suite without the long
# labels, and lists every source line holding a `throw` or returning a failed Status
# (`Status::make_failed`) with how often it ran: reached, never reached, or compiled out of
# this build (no code for the line). Writes throws.tsv and summary.txt to
# results/throw-coverage-<time>/ (or --out DIR). 10–15 minutes on 2 cores.
#   scripts/throw-coverage.sh [--out DIR] [--exclude-labels REGEX]
set -euo pipefail
cd "$(dirname "$0")/.."
out="results/throw-coverage-$(date +%Y%m%d-%H%M%S)"
exclude="tsan_only|large|soak|lock_model"
while (($#)); do
  case "$1" in
    --out) out=${2:?--out takes a directory}; shift 2 ;;
    --exclude-labels) exclude=${2:?--exclude-labels takes a regex}; shift 2 ;;
    *) echo "throw-coverage.sh: unknown argument '$1'; valid: --out DIR, --exclude-labels REGEX" >&2; exit 2 ;;
  esac
done
scripts/deps.sh
cmake -S . -B build-cov -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="--coverage -O1" -DCMAKE_C_FLAGS="--coverage -O1" \
  -DCMAKE_EXE_LINKER_FLAGS=--coverage -DCMAKE_SHARED_LINKER_FLAGS=--coverage -DFERRY_BUILD_BENCH=OFF \
  >build-cov.configure.log 2>&1 || { cat build-cov.configure.log; exit 1; }
cmake --build build-cov -j"$(nproc)"
find build-cov -name '*.gcda' -delete
mkdir -p "$out"
# Failures are reported, not fatal: a throw is counted whether or not every test passed.
ctest --test-dir build-cov -j"$(nproc)" --timeout 600 -LE "$exclude" >"$out/ctest.log" 2>&1 || true
grep -E "tests passed|tests failed" "$out/ctest.log" | tail -1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
find "$PWD/build-cov" -name '*.gcda' >"$work/gcda"
(cd "$work" && xargs -a "$work/gcda" -n 50 gcov --json-format -p >/dev/null 2>&1 || true)
/usr/bin/python3 - "$work" "$PWD" "$out" <<'PY'
import gzip, json, os, re, sys
work, root, out = sys.argv[1:4]
counts = {}  # (file, line) -> max count over translation units; present = the line has code
for name in os.listdir(work):
    if not name.endswith('.gcov.json.gz'):
        continue
    with gzip.open(os.path.join(work, name)) as f:
        data = json.load(f)
    for fe in data.get('files', []):
        path = os.path.realpath(os.path.join(data.get('current_working_directory', root), fe['file']))
        rel = os.path.relpath(path, root)
        if not (rel.startswith('src/') or rel.startswith('tools/')):
            continue
        for ln in fe.get('lines', []):
            key = (rel, ln['line_number'])
            counts[key] = max(counts.get(key, 0), ln['count'])
rows = []
for top in ('src', 'tools'):
    for d, _, files in os.walk(os.path.join(root, top)):
        for fn in sorted(files):
            if not fn.endswith(('.cpp', '.hpp')):
                continue
            rel = os.path.relpath(os.path.join(d, fn), root)
            with open(os.path.join(d, fn)) as f:
                for i, text in enumerate(f, 1):
                    code = text.split('//', 1)[0]
                    if re.search(r'\bthrow\b', code) and not re.search(r'\bnoexcept\b|throw\(\)', code):
                        kind = 'throw'
                    elif 'Status::make_failed(' in code:
                        kind = 'failed_status'
                    else:
                        continue
                    if (rel, i) not in counts:
                        state = 'compiled_out'
                    else:
                        state = 'reached' if counts[(rel, i)] > 0 else 'unreached'
                    rows.append((rel, i, kind, state, counts.get((rel, i), ''), text.strip()))
with open(os.path.join(out, 'throws.tsv'), 'w') as f:
    f.write('file\tline\tkind\tstate\tcount\tsource\n')
    for r in sorted(rows):
        f.write('\t'.join(str(x) for x in r) + '\n')
summary = ''
for kind in ('throw', 'failed_status'):
    mine = [r for r in rows if r[2] == kind]
    tally = {s: sum(1 for r in mine if r[3] == s) for s in ('reached', 'unreached', 'compiled_out')}
    summary += (f"{kind} lines in src/ and tools/: {len(mine)}; reached {tally['reached']}, "
                f"never reached {tally['unreached']}, compiled out {tally['compiled_out']}\n")
with open(os.path.join(out, 'summary.txt'), 'w') as f:
    f.write(summary)
    for r in sorted(rows):
        if r[3] == 'unreached':
            f.write(f"{r[0]}:{r[1]}: [{r[2]}] {r[5]}\n")
print(summary, end='')
print(f"details: {out}/throws.tsv, {out}/summary.txt")
PY
