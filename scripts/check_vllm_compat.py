#!/usr/bin/env python3
"""Does a vLLM release still have the API our adapter uses? Checked statically, without installing it.

    python scripts/check_vllm_compat.py --vllm 0.34.0

For a V2-line release (0.34 and later; `peagle_vllm.vllm_adapter.version.adapter_line`) it downloads that
release's wheel (`pip download --no-deps --only-binary=:all: vllm==VERSION`, cached under --cache-dir), opens
it as a zip and parses the modules `peagle_vllm/vllm_adapter/v2` relies on with `ast`: the classes, methods
(with the parameter names we call or override, in order where vLLM calls our overrides positionally),
attributes and functions of `V2_API`. Exit 0 and one summary line when all are there; else one line per
problem and exit 1. For a V1-line release (0.32/0.33) the check is the V1 adapter's patch table.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path.home() / ".cache" / "peagle-vllm" / "wheels"
V1_TABLE = "peagle_vllm/vllm_adapter/v1/patches.py"

SPEC_CONFIG = "vllm/v1/worker/gpu/spec_decode/speculator_config.py"
SPECULATOR = "vllm/v1/worker/gpu/spec_decode/speculator.py"
PROPOSE = ("self", "input_batch", "attn_metadata", "slot_mappings", "last_hidden_states", "aux_hidden_states",
           "num_sampled", "num_rejected", "last_sampled", "next_prefill_tokens", "temperature", "seeds",
           "dp_sync_state", "dummy_run", "skip_attn_for_dummy_run", "mm_inputs", "is_profile",
           "num_speculative_tokens")


@dataclass(frozen=True)
class Need:
    """`symbol` ("name" or "Class.member") must exist in the wheel's `module`. `params`: the parameter names
    it must have; `exact`: in exactly this order (vLLM calls our override of it positionally)."""

    module: str
    symbol: str
    params: tuple[str, ...] = ()
    exact: bool = False
    contains: str | None = None  # a string, name or attribute its code must mention (e.g. a supported option)


V2_API: tuple[Need, ...] = (
    # registration and configuration
    Need(SPEC_CONFIG, "register_speculative_method", ("name", "config_cls")),
    Need(SPEC_CONFIG, "registered_speculative_methods"),
    Need(SPEC_CONFIG, "get_custom_speculator_config_class", ("method",)),
    *(Need(SPEC_CONFIG, f"SpeculatorConfig.{a}") for a in (
        "base_method", "speculator_class", "supported_options", "uses_target_hidden_states", "parallel_drafting",
        "adaptive_verification_uses_draft_logits", "spec_config", "num_speculative_tokens")),
    Need(SPEC_CONFIG, "SpeculatorConfig.configure", ("cls", "spec"), exact=True),
    Need(SPEC_CONFIG, "SpeculatorConfig.uses_aux_hidden_states", ("self",), exact=True),
    Need(SPEC_CONFIG, "SpeculatorConfig.num_lookahead_tokens", ("self",), exact=True),
    Need(SPEC_CONFIG, "SpeculatorConfig.max_num_draft_seqs", ("self", "max_num_batched_tokens"), exact=True),
    Need(SPEC_CONFIG, "SpeculatorConfig.hash_factors", ("self",), exact=True),
    Need(SPEC_CONFIG, "DraftModelSpeculatorConfig.configure", ("cls", "spec"), exact=True),
    Need("vllm/config/speculative.py", "_METHOD_SPECIFIC_OPTIONS", contains="speculator_options"),
    Need("vllm/config/speculative.py", "SpeculativeConfig.__post_init__",
         contains="get_custom_speculator_config_class"),
    *(Need("vllm/config/speculative.py", f"SpeculativeConfig.{a}") for a in (
        "speculator_options", "custom_method", "draft_sample_method", "rejection_sample_method", "parallel_drafting",
        "enable_adaptive_verification", "use_local_argmax_reduction", "synthetic_acceptance_rates",
        "synthetic_acceptance_length", "fly_window_size", "draft_decode_context_parallel_size",
        "draft_tensor_parallel_size", "target_model_config", "target_parallel_config", "draft_model_config",
        "draft_parallel_config", "prompt_lookup_max", "prompt_lookup_min", "revision", "code_revision",
        "quantization", "max_model_len", "model", "num_speculative_tokens")),
    Need("vllm/config/speculative.py", "SpeculativeConfig._maybe_override_draft_max_position_embeddings",
         ("draft_hf_config", "target_max_model_len"), exact=True),
    Need("vllm/config/speculative.py", "SpeculativeConfig._verify_and_get_draft_tp",
         ("target_parallel_config", "speculative_draft_tensor_parallel_size"), exact=True),
    Need("vllm/config/speculative.py", "SpeculativeConfig._maybe_override_draft_max_model_len",
         ("speculative_max_model_len", "draft_max_model_len", "target_max_model_len"), exact=True),
    Need("vllm/config/speculative.py", "SpeculativeConfig.create_draft_parallel_config", ("draft_model_config",)),
    Need("vllm/config/speculative.py", "SpeculativeConfig.apply_draft_overrides", ("self", "vllm_config")),
    Need("vllm/config/speculative.py", "RejectionSampleMethod", contains="block"),
    Need("vllm/config/speculative.py", "DraftSampleMethod", contains="probabilistic"),
    *(Need("vllm/config/model.py", f"ModelConfig.{a}") for a in (
        "config_format", "runner", "spec_target_max_model_len", "tokenizer", "tokenizer_mode", "trust_remote_code",
        "dtype", "seed", "enforce_eager", "max_logprobs", "hf_config", "max_model_len")),
    Need("vllm/transformers_utils/config.py", "register_config_parser", ("config_format",)),
    Need("vllm/transformers_utils/config.py", "get_config_parser", ("config_format",)),
    Need("vllm/transformers_utils/config_parser_base.py", "ConfigParserBase.parse",
         ("self", "model", "trust_remote_code", "revision", "code_revision"), exact=True),
    # the speculator
    *(Need(SPECULATOR, f"DraftModelSpeculator.{name}", params, exact=True) for name, params in (
        ("__init__", ("self", "vllm_config", "device")),
        ("load_draft_model", ("self", "target_model", "target_attn_layer_names")),
        ("load_model", ("self", "target_model")),
        ("set_attn", ("self", "model_state", "kv_cache_config", "block_tables", "target_input_buffers",
                      "target_attn_groups")),
        ("init_cudagraph_manager", ("self", "cudagraph_mode")),
        ("capture", ("self",)),
        ("propose", PROPOSE),
        ("observe_verification", ("self", "idx_mapping", "num_sampled", "num_rejected")))),
    Need(SPECULATOR, "DraftModelSpeculator.prepare_propose",
         ("self", "input_batch", "num_sampled", "num_rejected", "sampler"), exact=True),
    Need("vllm/v1/worker/gpu/sample/sampler.py", "Sampler.sampling_states"),
    *(Need("vllm/v1/worker/gpu/sample/states.py", f"SamplingStates.{a}") for a in ("vocab_size", "top_k", "top_p")),
    *(Need("vllm/v1/worker/gpu/buffer_utils.py", f"UvaBackedTensor.{a}") for a in ("np", "gpu")),
    Need(SPECULATOR, "DraftModelSpeculator._build_uniform_attn_metadata",
         ("self", "batch_desc", "num_reqs", "num_query_per_req", "seq_lens_cpu_upper_bound", "step", "causal")),
    Need(SPECULATOR, "DraftModelSpeculator._build_drafter_attn_metadata",
         ("self", "input_batch", "attn_metadata", "slot_mappings")),
    Need("vllm/model_executor/layers/attention/attention.py", "Attention.layer_name"),
    *(Need(SPECULATOR, f"DraftModelSpeculator.{a}") for a in (
        "draft_tokens", "input_buffers", "num_speculative_steps", "draft_model_config", "speculative_config",
        "vllm_config", "dtype", "device", "draft_logits", "draft_max_seq_len", "draft_attn_layer_names", "model",
        "block_tables", "kv_cache_config", "max_model_len", "num_query_per_req")),
    Need("vllm/v1/worker/gpu/spec_decode/draft_logits.py", "DraftLogitsCache.values"),
    Need("vllm/v1/worker/gpu/spec_decode/draft_logits.py", "DraftLogitsCache.__init__",
         ("self", "max_num_reqs", "num_steps", "vocab_size", "dtype", "fill", "device")),
    *(Need("vllm/v1/worker/gpu/block_table.py", f"BlockTables.{a}") for a in (
        "slot_mappings", "input_block_tables", "block_sizes")),
    *(Need("vllm/v1/worker/gpu/input_batch.py", f"InputBatch.{a}") for a in (
        "num_reqs", "num_tokens", "idx_mapping", "input_ids", "positions", "query_start_loc",
        "seq_lens_cpu_upper_bound")),
    *(Need("vllm/v1/worker/gpu/input_batch.py", f"InputBuffers.{a}") for a in (
        "input_ids", "positions", "query_start_loc", "seq_lens")),
    *(Need("vllm/v1/worker/gpu/cudagraph_utils.py", f"BatchExecutionDescriptor.{a}") for a in (
        "cg_mode", "num_tokens", "num_reqs")),
    Need("vllm/v1/worker/gpu/attn_utils.py", "build_slot_mappings_by_layer", ("slot_mappings", "kv_cache_config")),
    Need("vllm/forward_context.py", "set_forward_context",
         ("attn_metadata", "vllm_config", "num_tokens", "cudagraph_runtime_mode", "batch_descriptor", "slot_mapping")),
    Need("vllm/forward_context.py", "BatchDescriptor.num_tokens"),
    Need("vllm/v1/worker/gpu/spec_decode/eagle/utils.py", "maybe_share_target_embed",
         ("draft_model", "draft_inner", "target_inner"), exact=True),
    Need("vllm/v1/worker/gpu/spec_decode/utils.py", "get_pp_safe_draft_load_config", ("load_config",)),
    Need("vllm/model_executor/model_loader/utils.py", "get_draft_load_config", ("vllm_config",)),
    Need("vllm/model_executor/model_loader/__init__.py", "get_model", ("vllm_config", "model_config")),
    # verification: vLLM's own rejection sampler, block verification selected by rejection_sample_method
    Need("vllm/v1/worker/gpu/spec_decode/rejection_sampler.py", "RejectionSampler.__init__",
         ("self", "sampler", "spec_config", "device"), contains="block"),
    Need("vllm/v1/worker/gpu/spec_decode/rejection_sampler.py", "RejectionSampler.__call__",
         ("self", "logits", "input_batch", "draft_logits"), exact=True),
    # the head's layers
    Need("vllm/model_executor/layers/attention/attention.py", "Attention.__init__",
         ("self", "num_heads", "head_size", "scale", "num_kv_heads", "cache_config", "prefix", "attn_backend")),
    Need("vllm/model_executor/layers/attention/attention.py", "Attention.impl"),
    Need("vllm/model_executor/layers/attention/attention.py", "Attention.kv_cache"),
    Need("vllm/v1/attention/backends/flash_attn.py", "FlashAttentionImpl.do_kv_cache_update",
         ("self", "layer", "key", "value", "kv_cache", "slot_mapping"), exact=True),
    Need("vllm/model_executor/layers/linear.py", "QKVParallelLinear.__init__",
         ("self", "hidden_size", "head_size", "total_num_heads", "total_num_kv_heads", "bias", "prefix")),
    Need("vllm/model_executor/layers/linear.py", "RowParallelLinear.__init__",
         ("self", "input_size", "output_size", "bias", "prefix")),
    Need("vllm/model_executor/layers/linear.py", "ReplicatedLinear.__init__",
         ("self", "input_size", "output_size", "bias", "return_bias", "prefix")),
    Need("vllm/model_executor/layers/layernorm.py", "RMSNorm.__init__", ("self", "hidden_size", "eps")),
    Need("vllm/model_executor/layers/rotary_embedding/__init__.py", "get_rope",
         ("head_size", "max_position", "is_neox_style", "rope_parameters")),
    Need("vllm/model_executor/layers/logits_processor.py", "LogitsProcessor.forward",
         ("self", "lm_head", "hidden_states")),
    Need("vllm/model_executor/layers/vocab_parallel_embedding.py", "VocabParallelEmbedding.__init__",
         ("self", "num_embeddings", "embedding_dim", "prefix")),
    Need("vllm/model_executor/layers/vocab_parallel_embedding.py", "ParallelLMHead.__init__",
         ("self", "num_embeddings", "embedding_dim", "prefix")),
    Need("vllm/model_executor/models/llama.py", "LlamaMLP.__init__",
         ("self", "hidden_size", "intermediate_size", "hidden_act", "prefix")),
    Need("vllm/model_executor/model_loader/weight_utils.py", "default_weight_loader", ("param", "loaded_weight")),
)


@dataclass
class ClassInfo:
    bases: list[str]
    members: dict[str, ast.AST] = field(default_factory=dict)  # methods, class attributes, fields, self.X


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    a = fn.args
    return tuple(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs))


def _index(tree: ast.Module) -> tuple[dict[str, ClassInfo], dict[str, ast.AST]]:
    """Top-level classes (with their members) and other top-level names of a module."""
    classes: dict[str, ClassInfo] = {}
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            info = ClassInfo([b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases])
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    info.members.setdefault(item.name, item)
                    for sub in ast.walk(item):  # self.X = ... anywhere in a method
                        targets = sub.targets if isinstance(sub, ast.Assign) else \
                            [sub.target] if isinstance(sub, (ast.AnnAssign, ast.AugAssign)) else []
                        for t in targets:
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                                info.members.setdefault(t.attr, sub)
                elif isinstance(item, ast.Assign):
                    for t in item.targets:
                        if isinstance(t, ast.Name):
                            info.members[t.id] = item
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    info.members[item.target.id] = item
            classes[node.name] = info
            names[node.name] = node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(t, ast.Name):
                    names[t.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
    return classes, names


def _mentions(node: ast.AST, value: str) -> bool:
    """Whether `value` occurs in node's code as a string constant, a name or an attribute."""
    return any((isinstance(n, ast.Constant) and n.value == value) or (isinstance(n, ast.Name) and n.id == value)
               or (isinstance(n, ast.Attribute) and n.attr == value) for n in ast.walk(node))


def check_v2(wheel: zipfile.ZipFile) -> list[str]:
    """One line per V2_API item the wheel lacks or has with other parameters; [] when all are there."""
    indexed: dict[str, tuple[dict[str, ClassInfo], dict[str, ast.AST]]] = {}
    present = set(wheel.namelist())
    problems: list[str] = []
    for module in sorted({need.module for need in V2_API}):
        if module not in present:
            continue
        try:
            indexed[module] = _index(ast.parse(wheel.read(module).decode("utf-8"), module))
        except SyntaxError as exc:
            problems.append(f"{module}: does not parse ({exc.msg}, line {exc.lineno})")
    all_classes = {name: info for classes, _ in indexed.values() for name, info in classes.items()}

    def member(cls: str, name: str, seen: frozenset = frozenset()) -> ast.AST | None:
        info = all_classes.get(cls)
        if info is None or cls in seen:
            return None
        if name in info.members:
            return info.members[name]
        return next((m for b in info.bases if (m := member(b, name, seen | {cls})) is not None), None)

    for need in V2_API:
        where = f"{need.module}: {need.symbol}"
        if need.module not in indexed:
            problems.append(f"{need.module}: module missing (needed for {need.symbol})")
            continue
        classes, names = indexed[need.module]
        if "." in need.symbol:
            cls, name = need.symbol.split(".", 1)
            node = member(cls, name) if cls in classes else None
            if cls not in classes:
                problems.append(f"{where}: class {cls} missing")
                continue
        else:
            node = names.get(need.symbol)
        if node is None:
            problems.append(f"{where}: missing")
            continue
        if need.params:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                problems.append(f"{where}: is not a function (expected parameters {', '.join(need.params)})")
                continue
            have = _params(node)
            if need.exact and have[: len(need.params)] != need.params:
                problems.append(f"{where}: parameters ({', '.join(have)}) differ from ({', '.join(need.params)})")
            elif not need.exact and (missing := [p for p in need.params if p not in have]):
                problems.append(f"{where}: no parameter {', '.join(missing)} (has {', '.join(have)})")
        if need.contains is not None and not _mentions(node, need.contains):
            problems.append(f"{where}: no longer mentions {need.contains!r}")
    return problems


# adapter line -> its static check over a wheel (a V1 check over the V1 patch table can be added here)
CHECKS = {"v2": check_v2}


def download_wheel(version: str, cache_dir: Path) -> Path:
    """vLLM's wheel for `version` in cache_dir (downloaded once, no install)."""
    cached = sorted(cache_dir.glob(f"vllm-{version}-*.whl"))
    if cached:
        return cached[-1]
    cache_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"vllm=={version}",
                    "-d", str(cache_dir), "-q", "--disable-pip-version-check"], check=True)
    found = sorted(cache_dir.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise SystemExit(f"pip downloaded no vllm-{version} wheel into {cache_dir}")
    return found[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", required=True, metavar="VERSION", help="vLLM release to check, e.g. 0.34.0")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where downloaded wheels are kept")
    parser.add_argument("--wheel", type=Path, help="check this wheel file instead of downloading one")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from peagle_vllm.vllm_adapter.version import UnsupportedVLLMError, adapter_line

    try:
        line = adapter_line(args.vllm)
    except UnsupportedVLLMError as exc:
        print(exc)
        return 2
    check = CHECKS.get(line)
    if check is None:  # the V1 line's table lives with its adapter
        print(f"V1 check: see {V1_TABLE}")
        return 0
    wheel_path = args.wheel or download_wheel(args.vllm, args.cache_dir)
    with zipfile.ZipFile(wheel_path) as wheel:
        problems = check(wheel)
    for problem in problems:
        print(problem)
    if not problems:
        print(f"vllm {args.vllm}: the {line.upper()} API p_eagle uses is all there ({len(V2_API)} items, "
              f"{wheel_path.name})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
