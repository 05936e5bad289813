#!/usr/bin/env bash
# Build Hone's wheel from a source checkout into OUT_DIR and print its path.
#
# It builds from a copy of the files git knows (tracked, or new and not ignored): setuptools reuses a build/ folder
# it finds, and an old one could carry modules deleted since into the wheel. Without git, from a copy of the tree.
# Uses uv when given one (`UV=path`), else python3's pip.
#
# usage: installers/build_wheel.sh OUT_DIR
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:?usage: build_wheel.sh OUT_DIR}"
mkdir -p "$OUT"
source="$(mktemp -d)"
trap 'rm -rf "$source"' EXIT
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
        | (cd "$ROOT" && tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$source"
else
    (cd "$ROOT" && tar --exclude=./build --exclude='*.egg-info' --exclude=./dist -cf - .) | tar -xf - -C "$source"
fi
if [ -n "${UV:-}" ]; then
    "$UV" build --quiet --wheel --out-dir "$OUT" "$source" >&2
else
    python3 -m pip wheel --no-deps --quiet -w "$OUT" "$source" >&2
fi
ls -t "$OUT"/hone_studio-*.whl | head -n 1
