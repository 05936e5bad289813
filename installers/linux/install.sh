#!/usr/bin/env bash
# Install Hone Studio for this user on Linux x86_64 or aarch64 (DGX Spark), or upgrade it in place, or remove it.
#
#   install.sh [--cpu] [--python PATH] [--wheels DIR]     install, or upgrade (runs and settings are kept)
#   install.sh --uninstall [--purge]                       remove it (--purge: the runs and caches too)
#
# Run from a release archive it installs the wheel beside it; run from a source checkout it builds one. It gets uv
# (the one on PATH, else the uv wheel from PyPI), a Python 3.12 managed by uv (or --python PATH), a venv under
# ~/.local/share/hone-studio, Hone with the PyTorch build this machine needs (`python -m hone.core.install plan`
# tells which: CUDA 13 on DGX Spark, the build the driver supports on x86_64, CPU without an NVIDIA GPU), the
# `hone` and `hone-studio` launchers in ~/.local/bin, and a menu entry. Everything it prints is also in
# ~/.local/share/hone-studio/install.log.
set -euo pipefail

PYTHON_VERSION=3.12
DATA="${XDG_DATA_HOME:-$HOME/.local/share}/hone-studio"
BIN="$HOME/.local/bin"
APPLICATIONS="${XDG_DATA_HOME:-$HOME/.local/share}/applications"
ICONS="${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor/256x256/apps"
VENV="$DATA/venv"
LOG="$DATA/install.log"
PYPI="${HONE_PYPI:-https://pypi.org}"  # where the uv wheel comes from when uv is not on PATH
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

cpu=0 python="" wheels="" uninstall=0 purge=0
usage() { sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) cpu=1 ;;
        --python) python="${2:?--python needs a path}"; shift ;;
        --wheels) wheels="$(cd "${2:?--wheels needs a folder}" && pwd)"; shift ;;
        --uninstall) uninstall=1 ;;
        --purge) purge=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

say() { echo "$*"; [ -d "$DATA" ] && echo "$*" >> "$LOG"; return 0; }
fail() { say "install.sh: $*"; [ -f "$LOG" ] && echo "The full log is $LOG: send it with a bug report." >&2; exit 1; }

if [ "$uninstall" = 1 ]; then
    # The app's own default runs folder (Documents/Hone Studio/runs, as Qt finds Documents), asked before the venv goes
    runs="$(QT_QPA_PLATFORM=offscreen "$VENV/bin/python" -c \
        'from hone.app.settings import default_runs_dir; print(default_runs_dir().parent)' 2>/dev/null \
        || echo "$HOME/Documents/Hone Studio")"
    rm -rf "$DATA"
    rm -f "$BIN/hone" "$BIN/hone-studio" "$APPLICATIONS/hone-studio.desktop" "$ICONS/hone-studio.png"
    command -v update-desktop-database >/dev/null && update-desktop-database -q "$APPLICATIONS" 2>/dev/null || true
    cache="${XDG_CACHE_HOME:-$HOME/.cache}/hone"
    settings="${XDG_CONFIG_HOME:-$HOME/.config}/Hone/Hone Studio.conf"
    if [ "$purge" = 1 ]; then
        rm -rf "$runs" "$cache" "$settings"
        echo "Hone Studio is removed, with its runs ($runs), cache and settings."
    else
        echo "Hone Studio is removed. Kept: your runs in $runs, the cache in $cache and the settings in $settings"
        echo "(install.sh --uninstall --purge removes them too)."
    fi
    exit 0
fi

[ "$(uname -s)" = Linux ] || { echo "install.sh is for Linux; on Windows use HoneStudio-Setup.exe." >&2; exit 1; }
mkdir -p "$DATA" "$BIN"
echo "== install.sh $(date -Is) on $(uname -srm)" >> "$LOG"

# --- uv: the one on PATH, the one a previous run fetched, or the uv wheel from PyPI (hash-checked) -------------
uv="$(command -v uv || true)"
if [ -z "$uv" ] && [ -x "$DATA/bin/uv" ]; then
    uv="$DATA/bin/uv"
fi
if [ -z "$uv" ]; then
    bootstrap="${python:-$(command -v python3 || true)}"
    [ -n "$bootstrap" ] || fail "uv is not installed and there is no python3 to fetch it with: install python3 (or uv) first"
    say "Fetching uv from $PYPI ..."
    "$bootstrap" - "$PYPI" "$DATA/bin" <<'PY' 2>&1 | tee -a "$LOG" \
        || fail "could not fetch uv from PyPI (check the connection; behind a proxy set HTTPS_PROXY)"
import hashlib, io, json, platform, sys, urllib.parse, urllib.request, zipfile
index, target = sys.argv[1], sys.argv[2]
arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}[platform.machine().lower()]
listing = f"{index}/pypi/uv/json"
release = json.load(urllib.request.urlopen(listing, timeout=60))
wheels = [f for f in release["urls"] if f["filename"].endswith(".whl") and "manylinux" in f["filename"]
          and f["filename"].endswith(f"_{arch}.whl")]
chosen = sorted(wheels, key=lambda f: f["filename"])[0]
data = urllib.request.urlopen(urllib.parse.urljoin(listing, chosen["url"]), timeout=300).read()  # may be relative
if hashlib.sha256(data).hexdigest() != chosen["digests"]["sha256"]:
    sys.exit(f"{chosen['filename']}: the download does not match PyPI's sha256")
import os, stat
os.makedirs(target, exist_ok=True)
with zipfile.ZipFile(io.BytesIO(data)) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".data/scripts/uv"))
    with open(os.path.join(target, "uv"), "wb") as out:
        out.write(wheel.read(name))
os.chmod(os.path.join(target, "uv"), 0o755)
print(f"uv {release['info']['version']} from {chosen['filename']}")
PY
    uv="$DATA/bin/uv"
fi
export UV_PYTHON_INSTALL_DIR="$DATA/python" UV_NO_CONFIG=1
say "uv: $uv ($("$uv" --version))"

# --- Hone's wheel: beside this script (a release archive), or built from the checkout ---------------------------
wheel="$(ls "$HERE"/hone_studio-*.whl 2>/dev/null | sort -V | tail -n 1 || true)"
constraints="$HERE/constraints.txt"
if [ -z "$wheel" ]; then
    root="$(cd "$HERE/../.." && pwd)"
    [ -f "$root/pyproject.toml" ] || fail "no hone_studio-*.whl beside install.sh and no source checkout around it"
    say "Building Hone's wheel from $root ..."
    build="$(mktemp -d)"
    trap 'rm -rf "$build"' EXIT
    wheel="$(UV="$uv" "$root/installers/build_wheel.sh" "$build" 2>> "$LOG")" \
        || fail "building the wheel failed (see the log)"
    constraints="$root/installers/constraints.txt"
fi
say "Hone: $(basename "$wheel")"

# --- Python 3.12 and the venv (reused when it exists: an upgrade keeps it) -------------------------------------
if [ -n "$python" ]; then
    interpreter="$python"
else
    say "Getting Python $PYTHON_VERSION (managed by uv, in $DATA/python) ..."
    "$uv" python install "$PYTHON_VERSION" 2>&1 | tee -a "$LOG" || fail "could not download Python $PYTHON_VERSION"
    interpreter="$PYTHON_VERSION"
fi
"$uv" venv --quiet --allow-existing --python "$interpreter" "$VENV" 2>&1 | tee -a "$LOG" \
    || fail "could not create the venv $VENV with Python $interpreter"

# Hone's own installer step is stdlib-only: put the wheel in without its dependencies, then let it plan and install
# the rest (it picks PyTorch's build for this machine and refuses machines it cannot serve, with the reason).
"$uv" pip install --quiet --python "$VENV/bin/python" --no-deps --reinstall-package hone-studio "$wheel" \
    2>&1 | tee -a "$LOG" || fail "could not put Hone's wheel into the venv"
apply=(--uv "$uv" --venv "$VENV" --wheel "$wheel" --constraints "$constraints")
[ "$cpu" = 1 ] && apply+=(--cpu)
[ -n "$wheels" ] && apply+=(--wheels "$wheels")
status=0
"$VENV/bin/python" -m hone.core.install apply "${apply[@]}" --log "$LOG" || status=$?
case "$status" in
    0) ;;
    3) echo "Nothing was installed: this machine is not supported (the reason is above)." >&2; exit 3 ;;
    *) fail "the install did not finish (exit $status, the reason is above)" ;;
esac

# --- launchers, menu entry, icon ---------------------------------------------------------------------------------
ln -sf "$VENV/bin/hone" "$BIN/hone"
ln -sf "$VENV/bin/hone-studio" "$BIN/hone-studio"
mkdir -p "$APPLICATIONS" "$ICONS"
"$VENV/bin/python" - "$ICONS/hone-studio.png" <<'PY'
import shutil, sys
from hone.core.resources import resource_path
shutil.copyfile(resource_path("icons/hone.png"), sys.argv[1])
PY
cat > "$APPLICATIONS/hone-studio.desktop" <<EOF
[Desktop Entry]
Type=Application
Name=Hone Studio
GenericName=LLM fine-tuning
Comment=Fine-tune LLMs and vision-language models on your NVIDIA GPU
Exec="$BIN/hone-studio"
Icon=hone-studio
Terminal=false
Categories=Development;
Keywords=LLM;fine-tuning;LoRA;training;
StartupWMClass=hone-studio
EOF
command -v update-desktop-database >/dev/null && update-desktop-database -q "$APPLICATIONS" 2>/dev/null || true

say "Hone Studio $("$BIN/hone" --version | cut -d' ' -f2) is installed: open it from the menu, or run hone-studio."
case ":$PATH:" in
    *":$BIN:"*) ;;
    *) say "Add $BIN to your PATH to run hone and hone-studio from a terminal (e.g. in ~/.profile)." ;;
esac
