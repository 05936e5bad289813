#!/usr/bin/env bash
# Build the Linux release archive, hone-studio-<version>-linux.tar.gz: install.sh, Hone's wheel and constraints.txt
# in one folder. Users unpack it and run ./install.sh (x86_64 and aarch64 alike: the wheel is pure Python, and
# install.sh picks PyTorch's build on the machine).
#
# usage: installers/linux/build.sh [--out DIR]     (default DIR: dist/ at the repository root)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="$ROOT/dist"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
        -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
VERSION="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/core/version.py")"
[ -n "$VERSION" ] || { echo "build.sh: no __version__ = \"...\" line in core/version.py" >&2; exit 1; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
folder="$WORK/hone-studio-$VERSION"
mkdir -p "$folder" "$OUT"
"$ROOT/installers/build_wheel.sh" "$folder" >/dev/null
cp "$HERE/install.sh" "$ROOT/installers/constraints.txt" "$folder/"
archive="$OUT/hone-studio-$VERSION-linux.tar.gz"
tar -C "$WORK" -czf "$archive" "hone-studio-$VERSION"
echo "$archive ($(du -h "$archive" | cut -f1))"
