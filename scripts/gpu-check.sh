#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA (CUDA) GPU: the tests marked `gpu`, the GPU
# benchmark section, and the whole demo with its tasks on cuda. CI has no GPU and skips them.
#   scripts/gpu-check.sh            from the project root, with gpuflex installed in python3
# On this project's lent GPU machines, after ../shared/device/pack.sh here:
#   source .device/env.sh && scripts/gpu-check.sh
# Results land in ${OUT:-gpu-check}/ (the pytest log, bench JSON and the demo's summary).
set -uo pipefail
out=${OUT:-gpu-check}
mkdir -p "$out"
py=${PYTHON:-python3}
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "no CUDA device visible to $py: nothing to check here" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null | tee "$out/gpu.txt"
status=0
# the CUDA runtime pack (docs/runtime-packs.md): built from PyPI's wheels unless one is named;
# tests/desktop/test_runtime_gpu.py trains through it (it skips, saying so, without one)
if [ -z "${GPUFLEX_CUDA_PACK:-}" ]; then
  PYTHON="$py" scripts/build-runtime-pack.sh cuda13 --out "$out/pack" 2>&1 | tee "$out/pack.log" \
    && GPUFLEX_CUDA_PACK=$(ls "$out"/pack/cuda13-*.tar.gz 2>/dev/null | head -1) && export GPUFLEX_CUDA_PACK
fi
"$py" -m pytest -p no:cacheprovider -m gpu -rs tests 2>&1 | tee "$out/pytest-gpu.log" || status=1
"$py" -m bench.run --only gpu 2>&1 | tee "$out/bench-gpu.log" || status=1
cp bench/results/*.json bench/results/*.md "$out/" 2>/dev/null
timeout 900 "$py" -m marketplace.cli demo --json --data-dir "$out/demo" \
  >"$out/demo.json" 2>"$out/demo.log" || status=1
"$py" - "$out/demo.json" <<'PY' || status=1
import json, sys
s = json.loads(open(sys.argv[1]).read())
devices = sorted({d for n in s["nodes"] for d in n.get("devices", [])})
print(f"demo: {s['status']}, accuracy {s['final_accuracy']}, {s['rounds']} rounds, "
      f"{s['wall_s']} s, task devices {devices}")
sys.exit(0 if s["reached_target"] and any(d.startswith("cuda") for d in devices) else 1)
PY
exit $status
