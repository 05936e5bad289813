#!/usr/bin/env bash
# Build the Windows installer, HoneStudio-Setup-<version>.exe, on Linux.
#
# It packs Hone's wheel, uv.exe (taken from uv's win_amd64 wheel on PyPI) and constraints.txt (the dependencies
# locked for Windows and Python 3.12 within installers/constraints.txt) into an NSIS installer (hone-studio.nsi).
# Python, torch and the rest are downloaded by uv on the user's machine; the installer carries only these files.
# Needs python3 with pip, network access to PyPI, and makensis (Debian/Ubuntu: apt install nsis).
# Its own files live in a temporary folder; pip's and uv's caches make a second run quicker.
#
# usage: installers/windows/build.sh [--out DIR]     (default DIR: dist/ at the repository root)
set -euo pipefail

UV_VERSION=0.13.9  # the uv that installs Hone on users' machines; the lock is written with the same version

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="$ROOT/dist"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --out=*) OUT="${1#--out=}"; shift ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

command -v makensis >/dev/null || { echo "build.sh: makensis not found; install NSIS (apt install nsis)" >&2; exit 1; }
CONSTRAINTS="$ROOT/installers/constraints.txt"
[[ -f "$CONSTRAINTS" ]] || { echo "build.sh: $CONSTRAINTS is missing (the versions Hone was tested with)" >&2; exit 1; }

start=$SECONDS
VERSION="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/core/version.py")"
[[ -n "$VERSION" ]] || { echo "build.sh: no __version__ = \"...\" line in core/version.py" >&2; exit 1; }
# Windows file versions are four numbers: 0.2.0rc1 -> 0.2.0.0
numeric="$(grep -oE '^[0-9]+(\.[0-9]+){0,3}' <<<"$VERSION")"
FILE_VERSION="$numeric"
while [[ "$(tr -cd . <<<"$FILE_VERSION")" != "..." ]]; do FILE_VERSION+=".0"; done

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PAYLOAD="$WORK/payload"
mkdir -p "$PAYLOAD" "$OUT"

echo "==> Hone $VERSION: building the wheel"
WHEEL="$("$ROOT/installers/build_wheel.sh" "$WORK/wheel")"
cp "$WHEEL" "$PAYLOAD/"

echo "==> uv $UV_VERSION for Windows (uv.exe) and for this machine (to write the lock)"
python3 -m pip download --quiet --no-deps --only-binary=:all: --platform win_amd64 -d "$WORK/windows" "uv==$UV_VERSION"
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$WORK/host" "uv==$UV_VERSION"
python3 -m zipfile -e "$WORK"/windows/uv-"$UV_VERSION"-*.whl "$WORK/uv-windows"
cp "$WORK"/uv-windows/uv-"$UV_VERSION".data/scripts/uv.exe "$PAYLOAD/uv.exe"
python3 -m zipfile -e "$WORK"/host/uv-"$UV_VERSION"-*.whl "$WORK/uv-host"
UV="$WORK/uv-host/uv-$UV_VERSION.data/scripts/uv"
chmod +x "$UV"

echo "==> locking the dependencies for Windows, Python 3.12 (within installers/constraints.txt)"
# The wheel's own Requires-Dist lines are what the installer installs, so they are what is locked: those without an
# extra, and the `gpu` extra's (bitsandbytes, Triton), which a CUDA install adds (hone.core.install.environment).
python3 - "$WHEEL" >"$WORK/requirements.in" <<'EOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    for line in wheel.read(name).decode().splitlines():
        gpu = r"""(\s+and\s+|\s*;\s*)extra\s*==\s*["']gpu["']"""  # the clause setuptools appends to the marker
        if line.startswith("Requires-Dist:") and ("extra ==" not in line or re.search(gpu, line)):
            print(re.sub(gpu, "", line.split(":", 1)[1].strip()))
EOF
# torch is pinned per machine by Hone's install plan (one release for the CUDA builds, one for the CPU build), so the
# lock is resolved with each and keeps the pins both agree on; torch and whatever follows it stay out.
tested_torch() { sed -n "s/^$1 = \"\(.*\)\"\$/\1/p" "$ROOT/core/install/plan.py"; }
TORCH_CUDA="$(tested_torch TESTED_TORCH_CUDA)"
TORCH_CPU="$(tested_torch TESTED_TORCH_CPU)"
[[ -n "$TORCH_CUDA" && -n "$TORCH_CPU" ]] || { echo "build.sh: no TESTED_TORCH_* in core/install/plan.py" >&2; exit 1; }
for torch in "$TORCH_CUDA" "$TORCH_CPU"; do
    echo "torch==$torch" >"$WORK/torch.txt"
    UV_NO_CONFIG=1 UV_PYTHON_DOWNLOADS=never "$UV" pip compile --quiet "$WORK/requirements.in" -c "$CONSTRAINTS" \
        -c "$WORK/torch.txt" --python-platform x86_64-pc-windows-msvc --python-version 3.12 --no-header --no-annotate \
        | sort >"$WORK/lock-$torch.txt"
done
differing="$(comm -3 "$WORK/lock-$TORCH_CUDA.txt" "$WORK/lock-$TORCH_CPU.txt" | tr -d '\t' | cut -d= -f1 | sort -u \
    | paste -sd' ')"
{
    echo "# Hone $VERSION's dependencies for Windows and Python 3.12, written by installers/windows/build.sh within"
    echo "# installers/constraints.txt. Left out (they differ between torch $TORCH_CUDA, for CUDA, and $TORCH_CPU, for"
    echo "# the CPU, which the install plan picks from): ${differing:-nothing}"
    comm -12 "$WORK/lock-$TORCH_CUDA.txt" "$WORK/lock-$TORCH_CPU.txt"
} >"$PAYLOAD/constraints.txt"

echo "==> makensis"
cp "$ROOT/resources/icons/hone.ico" "$PAYLOAD/hone.ico"
INSTALLER="$OUT/HoneStudio-Setup-$VERSION.exe"
makensis -V2 -INPUTCHARSET UTF8 \
    -DVERSION="$VERSION" -DFILE_VERSION="$FILE_VERSION" -DPAYLOAD="$PAYLOAD" \
    -DWHEEL="$(basename "$WHEEL")" -DOUTFILE="$INSTALLER" "$HERE/hone-studio.nsi"

size="$(du -h "$INSTALLER" | cut -f1)"
echo "==> $INSTALLER ($size, built in $((SECONDS - start)) s)"
