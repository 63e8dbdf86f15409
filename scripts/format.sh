#!/usr/bin/env bash
# Formats every C and C++ source of the project in place with clang-format (.clang-format).
# Usage: scripts/format.sh          (scripts/check-format.sh only checks)
set -euo pipefail
cd "$(dirname "$0")/.."
"$(dirname "$0")/check-format.sh" --list | xargs -r clang-format -i --style=file
