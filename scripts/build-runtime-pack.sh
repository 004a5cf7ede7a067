#!/usr/bin/env bash
# Build a training-runtime pack (docs/runtime-packs.md) from wheels, into a staging folder,
# never into the dev venv:
#   scripts/build-runtime-pack.sh cpu|cuda12|cuda13|rocm|mps [--out DIR] [--publish PUBDIR]
# cpu:    torch==2.13.0 as `make dev` installs it (pip's own configuration: the CPU wheel)
# cuda12, cuda13: torch==2.13.0 from PyPI itself (RUNTIME_INDEX_URL, default
#         https://pypi.org/simple), with the nvidia-* library wheels: gigabytes. PyPI's own
#         torch 2.13.0 Linux wheels are CUDA 13.0 builds, so there `cuda13` is what builds;
#         `cuda12` needs a CUDA 12 index (https://download.pytorch.org/whl/cu128). The build
#         refuses a pack whose torch is not the plan's CUDA (desktop/runtime/pack.py).
# rocm:   PyPI has no ROCm build of torch (its torch 2.13.0 files are macOS arm64, Windows and
#         manylinux CUDA 13.0 wheels only): set RUNTIME_INDEX_URL to PyTorch's ROCm index
#         (https://download.pytorch.org/whl/rocmX.Y, the ROCm release PyTorch lists for 2.13.0).
# mps:    built HERE, on any machine, from PyPI's own macOS arm64 wheels (torch 2.13.0's needs
#         macOS 14): resolved with uv (`pip install uv`), whose --python-platform also judges
#         the dependencies' markers for macOS; pip's --platform picks macOS wheels but judges
#         torch's `platform_system == "Linux"` dependencies (cuda-bindings, nvidia-*) for this
#         machine, and fails on them. The manifest says macosx_arm64 and cp311, which the
#         build checks against the wheels' tags and torch's compiled extension.
# Writes DIR/<plan>-<sha256>.tar.gz and DIR/<plan>-<sha256>.json (default DIR dist/runtime);
# --publish adds it to the TUF update repository PUBDIR (installers/update_repo.py add-runtime).
# RUNTIME_PIP_ARGS: extra pip arguments (e.g. --find-links to wheels downloaded before).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
plan=${1:?usage: build-runtime-pack.sh cpu|cuda12|cuda13|rocm|mps [--out DIR] [--publish PUBDIR]}
shift
out=$here/dist/runtime
publish=""
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --publish) publish=$(realpath -m "$2"); shift 2 ;;
    *) echo "build-runtime-pack: unknown argument $1" >&2; exit 2 ;;
  esac
done
py=${PYTHON:-$here/.venv/bin/python}
[ -x "$py" ] || py=python3
torch_req=${RUNTIME_TORCH:-torch==2.13.0}
target_args=()
installer=pip
case $plan in
  cpu) pip_cfg=(); extra_args=() ;;
  rocm)
    if [ -z "${RUNTIME_INDEX_URL:-}" ]; then
      echo "build-runtime-pack: PyPI has no ROCm build of torch (its $torch_req wheels are CUDA" \
        "13.0 on Linux): take it from PyTorch's ROCm index, e.g." \
        "RUNTIME_INDEX_URL=https://download.pytorch.org/whl/rocmX.Y $0 rocm" \
        "(the ROCm release PyTorch lists for torch 2.13.0)" >&2
      exit 2
    fi
    pip_cfg=(env PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= PIP_CONSTRAINT=)
    extra_args=(--index-url "$RUNTIME_INDEX_URL") ;;
  mps)
    # macOS arm64 wheels, for CPython 3.11 (the app's interpreter), on this machine
    pyver=${RUNTIME_PYTHON_VERSION:-3.11}
    if [ -n "${UV:-}" ]; then uv=("$UV")
    elif command -v uv >/dev/null; then uv=(uv)
    elif "$py" -m uv --version >/dev/null 2>&1; then uv=("$py" -m uv)
    else
      echo "build-runtime-pack: the mps pack is resolved for macOS with uv, which this machine" \
        "lacks: pip install uv (pip's --platform judges torch's Linux-only dependencies for" \
        "this machine, not macOS)" >&2
      exit 2
    fi
    installer=uv
    # uv reads no pip.conf; --no-config: nor a uv.toml. Only PyPI, as for the cuda plans.
    pip_cfg=(env -u UV_INDEX -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_CONSTRAINT
      MACOSX_DEPLOYMENT_TARGET="${RUNTIME_MACOS:-14.0}")
    extra_args=(--no-config --python "$py" --python-platform aarch64-apple-darwin
      --python-version "$pyver" --index-url "${RUNTIME_INDEX_URL:-https://pypi.org/simple}")
    target_args=(--platform macosx_arm64 --python "cp${pyver/./}") ;;
  cuda12|cuda13)
    # that index only: no local find-links or extra index that holds the +cpu wheel
    pip_cfg=(env PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= PIP_CONSTRAINT=)
    extra_args=(--index-url "${RUNTIME_INDEX_URL:-https://pypi.org/simple}") ;;
  *) echo "build-runtime-pack: unknown plan class $plan (cpu, cuda12, cuda13, rocm, mps)" >&2; exit 2 ;;
esac
stage=$(mktemp -d "${TMPDIR:-/tmp}/gpuflex-runtime-$plan.XXXXXX")
trap 'rm -rf "$stage"' EXIT
echo "installing $torch_req and installers/runtime-requirements.txt into $stage" >&2
if [ "$installer" = uv ]; then
  # shellcheck disable=SC2086
  "${pip_cfg[@]}" "${uv[@]}" pip install --quiet --only-binary :all: \
    --target "$stage/site-packages" "${extra_args[@]}" ${RUNTIME_PIP_ARGS:-} \
    "$torch_req" -r "$here/installers/runtime-requirements.txt"
else
  # shellcheck disable=SC2086
  "${pip_cfg[@]}" "$py" -m pip install --disable-pip-version-check --quiet --only-binary=:all: \
    --target "$stage/site-packages" "${extra_args[@]}" ${RUNTIME_PIP_ARGS:-} \
    "$torch_req" -r "$here/installers/runtime-requirements.txt"
fi
# pip --target leaves its console scripts beside the packages: a pack holds packages only
rm -rf "$stage/site-packages/bin"
manifest=$(cd "$here" && "$py" -m desktop.runtime.pack build --plan "$plan" \
  --site-packages "$stage/site-packages" --out "$out" ${target_args[@]+"${target_args[@]}"})
echo "$manifest"
archive=$(printf '%s' "$manifest" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["path"])')
echo "built $archive ($(du -m "$archive" | cut -f1) MiB packed, $(du -sm "$stage/site-packages" | cut -f1) MiB unpacked)" >&2
if [ -n "$publish" ]; then
  "$py" "$here/installers/update_repo.py" --dir "$publish" add-runtime "$archive"
fi
