#!/usr/bin/env bash
# The layers' include rules, checked over the include graph of src/ (quoted includes only):
#   1. the network layer is below the core: nothing under src/net/ includes core/ or
#      ferry/runtime.hpp (nor ferry/ferry.hpp, which includes it);
#   2. a backend (src/net/<name>/) includes no other backend's headers, and nothing outside a
#      backend's folder includes its headers (but what is listed in EXCEPTIONS below);
#   3. nothing outside src/core/ includes a core header, but src/coll/ (built into libferry
#      above the core) core/extension.hpp, the core's interface to it;
#   4. src/common/ includes only src/common/ and the public headers (ferry/).
# Usage: include_graph.sh SRC_DIR. Prints each breach as FILE: LINE and exits 1 if any.
set -u
src=${1:?usage: include_graph.sh SRC_DIR}
[ -d "$src/net" ] || { echo "include_graph.sh: '$src' has no net/ folder: not ferry's src/" >&2; exit 2; }
# Includes of a backend's header from outside it that stand for a reason (file, header, why).
EXCEPTIONS=(
  "core/tools.cpp net/ofi/tools.hpp the deprecated provider calls of ferry/tools.hpp reach the ofi module's table"
)
bad=0
breach() { echo "$1: $2 ($3)"; bad=1; }
excepted() {
  local e
  for e in "${EXCEPTIONS[@]}"; do
    set -- $e
    [ "$1" = "$file" ] && [ "$2" = "$inc" ] && return 0
  done
  return 1
}
backends=$(cd "$src/net" && for d in */; do d=${d%/}; [ "$d" != util ] && echo "$d"; done)
while IFS= read -r -d '' path; do
  file=${path#"$src"/}
  while IFS= read -r line; do
    inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/' <<<"$line")
    case "$file" in
      net/*)
        case "$inc" in core/* | ferry/runtime.hpp | ferry/ferry.hpp) breach "$file" "$line" "the network layer includes the core" ;; esac ;;
    esac
    case "$file" in
      core/*) ;;
      coll/*) case "$inc" in core/extension.hpp) ;; core/*) breach "$file" "$line" "a core header outside src/core" ;; esac ;;
      *) case "$inc" in core/*) breach "$file" "$line" "a core header outside src/core" ;; esac ;;
    esac
    case "$file" in
      common/*) case "$inc" in common/* | ferry/*) ;; */*) breach "$file" "$line" "common/ includes another layer" ;; esac ;;
    esac
    for b in $backends; do
      case "$inc" in
        net/"$b"/*)
          case "$file" in
            net/"$b"/*) ;;
            *) excepted || breach "$file" "$line" "the $b backend's header outside its folder" ;;
          esac ;;
      esac
    done
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$path")
done < <(find "$src" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \) -print0)
if [ "$bad" -eq 0 ]; then echo "include graph: every rule holds ($(echo $backends | wc -w) backends: $(echo $backends))"; fi
exit "$bad"
