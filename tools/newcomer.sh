#!/usr/bin/env bash
# Replay README.md as a newcomer would, on a fresh copy of this repository: both set-up
# commands, then every example in order (tools/newcomer.py says how). Exits 1 at the first
# example that fails or prints a traceback. tests/test_newcomer.py runs it in CI.
#
#   bash tools/newcomer.sh [--skip FIRST-LINE-OF-A-BLOCK]...
#
# The copy is what a clone of the working tree would hold: tracked files and new files git
# does not ignore, as they are now (uncommitted edits included), never ignored ones such as
# .venv or build/. NEWCOMER_KEEP=1 keeps it (and its virtual environments) afterwards.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/sordino-newcomer.XXXXXX")"
if [ -n "${NEWCOMER_KEEP:-}" ]; then
    echo "newcomer: working in $work (kept)"
else
    trap 'rm -rf "$work"' EXIT
fi
mkdir "$work/repo"
git -C "$repo" ls-files -z --cached --others --exclude-standard \
    | (cd "$repo" && while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done) \
    | tar -C "$repo" --null -T - -cf - | tar -C "$work/repo" -xf -
python3 "$repo/tools/newcomer.py" "$work" "$@"
