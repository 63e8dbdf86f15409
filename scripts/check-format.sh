#!/usr/bin/env bash
# Fails, listing them, when a C or C++ source of the project differs from what clang-format makes
# of it (.clang-format). The ctest `format` runs it; scripts/format.sh fixes what it finds.
# Usage: scripts/check-format.sh [--list]   (--list: print the sources it checks, and stop)
set -euo pipefail
cd "$(dirname "$0")/.."
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.cc' '*.h' '*.c')
else
  mapfile -t files < <(find core torch launcher bench examples tests -name '*.cc' -o -name '*.h' -o -name '*.c')
fi
if [[ "${1:-}" == "--list" ]]; then
  printf '%s\n' "${files[@]}"
  exit 0
fi
command -v clang-format >/dev/null || { echo "check-format: clang-format is not installed (scripts/install-deps.sh)" >&2; exit 1; }
bad=()
for f in "${files[@]}"; do
  [[ -f "$f" ]] || continue
  clang-format --style=file "$f" | cmp -s - "$f" || bad+=("$f")
done
if [[ ${#bad[@]} -gt 0 ]]; then
  echo "check-format: ${#bad[@]} file(s) are not formatted as .clang-format says (run scripts/format.sh):" >&2
  for f in "${bad[@]}"; do
    echo "  $f" >&2
    clang-format --style=file "$f" | diff -u "$f" - | sed -n '3,12p' >&2 || true
  done
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
