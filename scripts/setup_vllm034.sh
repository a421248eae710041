#!/usr/bin/env bash
# Creates .venv-vllm034: vLLM 0.34.0 (the V2-runner line) for the V2 adapter's tests (tests/v2) on a machine
# without a GPU. vLLM is installed with --no-deps (its CUDA-only requirements, e.g. flashinfer-python==0.7.3, are
# not installable here), plus torch 2.14 and exactly the packages that vLLM's modules used by
# peagle_vllm/vllm_adapter/v2 and tests/v2 import; then this project, editable, without dependencies.
# No engine can run in it (the wheel's compiled ops, vllm._C, need CUDA). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm034
PY=python3.11
command -v "$PY" >/dev/null 2>&1 || PY=python3
# vLLM 0.34's own pins where it has them (its METADATA), the rest as it requires them.
REQUIREMENTS=(
  "torch==2.14.*"
  "transformers>=5.16.1,<5.23.0" "tokenizers>=0.23.3" "safetensors>=0.6.2"
  "pydantic>=2.12.0" "msgspec" "cloudpickle" "cachetools" "cbor2" "pybase64" "regex" "psutil" "pyzmq>=25.0.0"
  "py-cpuinfo" "prometheus_client>=0.18.0" "requests>=2.33.0" "aiohttp>=3.14.4" "pillow>=13.0.0" "uvloop"
  "llguidance>=1.7.0,<1.8.0" "xgrammar==0.2.8" "einops" "numpy" "packaging" "tqdm"
  "pytest" "pytest-timeout"
)
VLLM_VERSION=0.34.0
STAMP="$VENV/.peagle-vllm034-ready"
WANT="vllm==$VLLM_VERSION ${REQUIREMENTS[*]}"
CHECK="import torch, vllm, peagle_vllm
import vllm.v1.worker.gpu.spec_decode.speculator_config, vllm.v1.worker.gpu.spec_decode.speculator
import vllm.v1.worker.gpu.spec_decode.dflash.speculator, peagle_vllm.vllm_adapter.v2.speculator
assert vllm.__version__ == '$VLLM_VERSION', vllm.__version__
print(f'.venv-vllm034 ready: vllm {vllm.__version__}, torch {torch.__version__} (no engine: vllm._C is CUDA-only)')"

check() {  # prints the one "ready" line; vLLM's import-time warnings are shown only if the check fails
  local log
  log=$(mktemp)
  if PEAGLE_VLLM_DISABLE=1 "$VENV/bin/python" -c "$CHECK" 2>"$log" | tail -1; then rm -f "$log"; return 0; fi
  [[ "${1:-}" == quiet ]] || cat "$log" >&2
  rm -f "$log"
  return 1
}
pip_() { "$VENV/bin/python" -m pip "$@" -qq --disable-pip-version-check --no-warn-conflicts; }
READY="import importlib.metadata as m, sys
assert m.version('vllm') == '$VLLM_VERSION' and m.version('peagle-vllm')
print(f'.venv-vllm034 ready: vllm {m.version(\"vllm\")}, torch {m.version(\"torch\")} (checked before; no engine: vllm._C is CUDA-only)')"

# Already built from these requirements: a metadata check only (a full import of vLLM takes ~10 s).
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && "$VENV/bin/python" -c "$READY" 2>/dev/null; then
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
pip_ install --upgrade pip
pip_ install "${REQUIREMENTS[@]}"
pip_ install --no-deps "vllm==$VLLM_VERSION"
pip_ install --no-deps -e .
check
echo "$WANT" > "$STAMP"
