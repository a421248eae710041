"""PEagleOptions: the `p_eagle` fields of --speculative-config, validated with errors that name the
field and the fix. Pure Python: the adapter calls it before vLLM ever sees the config.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from peagle_vllm.draft_temperature import DraftTemperatureError, checked
from peagle_vllm.head import HeadConfig
from peagle_vllm.lookup import DEFAULT_MIN_N, PromptLookup
from peagle_vllm.matmul_dtype import MATMUL_DTYPES
from peagle_vllm.verify import is_lossy

METHOD = "p_eagle"
MAX_K = 32
VERIFY_MODES = ("auto", "standard", "block")
# Keys that are ours; everything else in the dict is handed to vLLM's SpeculativeConfig.
OWN_KEYS = ("verify", "adaptive", "min_k", "acceptance_warn_below", "verifier_accept_k", "accept_tolerance",
            "head_matmul_dtype", "draft_temperature", "prompt_lookup_max", "prompt_lookup_min",
            "lookup_corpus", "head_depth")
# speculators' lossy acceptance (GreedyTokenProposalConfig), never taken from a checkpoint: lossless defaults.
TOLERANCE_KEYS = ("verifier_accept_k", "accept_tolerance")
# vLLM keys whose meaning conflicts with p_eagle (it sets them itself).
REFUSED_KEYS = {
    "parallel_drafting": "p_eagle always drafts in parallel; drop the key",
    "draft_sample_method": "p_eagle samples its own drafts (and their probabilities); drop the key",
    "rejection_sample_method": "p_eagle verifies with its own sampler; use 'verify' instead",
    "disable_padded_drafter_batch": "p_eagle needs the padded drafter batch; drop the key",
    "speculative_token_tree": "p_eagle drafts one chain, not a tree; drop the key",
    "use_heterogeneous_vocab": "p_eagle maps its draft vocabulary with the head's d2t; drop the key",
    "synthetic_acceptance_rates": "synthetic acceptance replaces verification; benchmark with zeroed heads instead",
    "synthetic_acceptance_length": "synthetic acceptance replaces verification; benchmark with zeroed heads instead",
    "enable_adaptive_verification": "p_eagle chooses its own verification; use 'verify'",
}
# Options of other methods: accepted by vLLM's config but meaningless for p_eagle.
for _key in ("suffix_decoding_max_tree_depth",
             "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob"):
    REFUSED_KEYS[_key] = "it is an option of another speculative method (ngram/suffix); drop it"


class PEagleConfigError(ValueError):
    """Bad `p_eagle` speculative config; the message names the field and the fix."""


@dataclass(frozen=True)
class PEagleOptions:
    """What p_eagle needs beyond vLLM's own speculative fields."""

    model: str
    num_speculative_tokens: int | None
    verify: str = "auto"
    adaptive: bool = True  # per-request K chosen each step (peagle_vllm.depth); False = fixed K
    min_k: int = 0  # lowest K adaptive depth may choose (0 allows falling back to plain decoding)
    acceptance_warn_below: float = 0.75  # warn when the 20-step block acceptance rate falls below this
    verifier_accept_k: int = 1  # greedy drafts among the target's top k may be accepted (1: exact match only)
    accept_tolerance: float = 0.0  # ... when log p_top - log p_draft <= this (0: exact match only)
    head_matmul_dtype: str = "auto"  # the head's matmuls: bfloat16 on a capable CPU, else its dtype (`matmul_dtype`)
    draft_temperature: float | None = None  # sampled drafts at T x this (`draft_temperature`); None: the head's own
    prompt_lookup_max: int | None = None  # requests' drafts from their own text too (`lookup`); None: off
    prompt_lookup_min: int = DEFAULT_MIN_N  # shortest n-gram prompt lookup matches
    lookup_corpus: str | None = None  # answers the target wrote (`corpus_lookup`) drafting where prompt lookup has none
    head_depth: int | None = None  # the most drafts the head gives per step, lookups the rest up to K; None: K

    @property
    def looks_up(self) -> bool:
        """Whether requests' drafts may come from a lookup (prompt or corpus) beside the head."""
        return self.prompt_lookup_max is not None or self.lookup_corpus is not None

    @property
    def prompt_lookup(self) -> PromptLookup | None:
        """Prompt lookup beside the head (`lookup.PromptLookup`), or None where it is off."""
        return None if self.prompt_lookup_max is None else PromptLookup(self.prompt_lookup_min, self.prompt_lookup_max)

    def draft_temperature_for(self, head: HeadConfig) -> float:
        """The factor on a sampled request's T that its drafts are drawn at: this config's, else the head's own."""
        return head.draft_temperature if self.draft_temperature is None else self.draft_temperature

    @property
    def lossy(self) -> bool:
        """Greedy requests may emit a draft that is not the target's argmax (`verify.within_tolerance`)."""
        return is_lossy(self.verifier_accept_k, self.accept_tolerance)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _field(name: str) -> str:
    return f"speculative_config[{name!r}]"


def split_p_eagle_config(user: dict[str, Any], known_vllm_keys: set[str] | None = None) -> tuple[PEagleOptions, dict]:
    """Validates a user's p_eagle dict; returns our options and the dict to hand to vLLM (without
    our keys and without `method`). `known_vllm_keys`, when given, turns unknown keys into errors."""
    cfg = {k.replace("-", "_"): v for k, v in user.items()}
    if cfg.get("method") != METHOD:
        raise PEagleConfigError(f"{_field('method')} must be {METHOD!r} here, got {cfg.get('method')!r}")
    model = cfg.get("model")
    if not model:
        raise PEagleConfigError(f"{_field('model')} is missing: p_eagle needs a trained draft head, e.g. "
                                '{"method": "p_eagle", "model": "models/demo-peagle-depth", "num_speculative_tokens": 8}')
    if not isinstance(model, str):
        raise PEagleConfigError(f"{_field('model')} must be a path string, got {type(model).__name__}")
    k = cfg.get("num_speculative_tokens")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, int):
            raise PEagleConfigError(f"{_field('num_speculative_tokens')} must be an integer from 1 to {MAX_K}, "
                                    f"got {k!r}")
        if not 1 <= k <= MAX_K:
            raise PEagleConfigError(f"{_field('num_speculative_tokens')} is {k}: p_eagle drafts 1 to {MAX_K} tokens "
                                    "per step; pick a value in that range")
    verify = cfg.get("verify", "auto")
    if verify not in VERIFY_MODES:
        raise PEagleConfigError(f"{_field('verify')} is {verify!r}: use one of {', '.join(VERIFY_MODES)} "
                                "(temperature-0 requests are always verified by argmax; auto = standard token-wise for the others)")
    adaptive = cfg.get("adaptive", True)
    if not isinstance(adaptive, bool):
        raise PEagleConfigError(f"{_field('adaptive')} must be true or false, got {adaptive!r}")
    min_k = cfg.get("min_k", 0)
    if isinstance(min_k, bool) or not isinstance(min_k, int) or not 0 <= min_k <= (k or MAX_K):
        raise PEagleConfigError(f"{_field('min_k')} must be an integer from 0 to num_speculative_tokens, got {min_k!r}")
    warn_below = cfg.get("acceptance_warn_below", 0.75)
    if isinstance(warn_below, bool) or not isinstance(warn_below, (int, float)) or not 0 <= warn_below <= 1:
        raise PEagleConfigError(f"{_field('acceptance_warn_below')} must be a rate from 0 to 1, got {warn_below!r}")
    accept_k = cfg.get("verifier_accept_k", 1)
    if isinstance(accept_k, bool) or not isinstance(accept_k, int) or accept_k < 1:
        raise PEagleConfigError(f"{_field('verifier_accept_k')} must be an integer >= 1 (1 = lossless: only the "
                                f"target's argmax is accepted), got {accept_k!r}")
    tolerance = cfg.get("accept_tolerance", 0.0)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < math.inf:
        raise PEagleConfigError(f"{_field('accept_tolerance')} must be a finite number >= 0 (a log-probability gap; "
                                f"0 = lossless), got {tolerance!r}")
    matmul_dtype = cfg.get("head_matmul_dtype", "auto")
    if matmul_dtype not in MATMUL_DTYPES:
        raise PEagleConfigError(f"{_field('head_matmul_dtype')} is {matmul_dtype!r}: use \"auto\" (bfloat16 matmuls on a "
                                "CPU that has them, for a float32 head) or \"model\" (the head's own dtype)")
    draft_temperature = cfg.get("draft_temperature")
    if draft_temperature is not None:
        try:
            draft_temperature = checked(draft_temperature, _field("draft_temperature"))
        except DraftTemperatureError as exc:
            raise PEagleConfigError(str(exc)) from exc
    lookup_max, lookup_min = _prompt_lookup(cfg)
    corpus = cfg.get("lookup_corpus")
    if corpus is not None and (not isinstance(corpus, str) or not Path(corpus).exists()):
        raise PEagleConfigError(f"{_field('lookup_corpus')} is {corpus!r}: give the path of answers the target wrote, "
                                "as `peagle-vllm distill` writes them (a directory of chunk-*.jsonl.gz, or one file)")
    head_depth = cfg.get("head_depth")
    if head_depth is not None:
        if isinstance(head_depth, bool) or not isinstance(head_depth, int) or not 1 <= head_depth <= (k or MAX_K):
            raise PEagleConfigError(f"{_field('head_depth')} must be an integer from 1 to num_speculative_tokens, "
                                    f"got {head_depth!r}")
        if lookup_max is None and corpus is None:
            raise PEagleConfigError(f"{_field('head_depth')} needs prompt_lookup_max or lookup_corpus: past the "
                                    f"head's depth only lookups draft; without them set num_speculative_tokens to "
                                    f"{head_depth} instead")
    for key, fix in REFUSED_KEYS.items():
        if key in cfg:
            raise PEagleConfigError(f"{_field(key)} cannot be used with p_eagle: {fix}")
    passthrough = {key: v for key, v in cfg.items() if key not in OWN_KEYS and key != "method"}
    if known_vllm_keys is not None:
        unknown = sorted(set(passthrough) - known_vllm_keys)
        if unknown:
            raise PEagleConfigError(f"{_field(unknown[0])} is not a speculative-config field: p_eagle takes "
                                    f"{', '.join(OWN_KEYS)} plus vLLM's own fields; check the spelling")
    return PEagleOptions(model=model, num_speculative_tokens=k, verify=verify, adaptive=adaptive, min_k=min_k,
                         acceptance_warn_below=float(warn_below), verifier_accept_k=accept_k,
                         accept_tolerance=float(tolerance), head_matmul_dtype=matmul_dtype,
                         draft_temperature=draft_temperature, prompt_lookup_max=lookup_max,
                         prompt_lookup_min=lookup_min, lookup_corpus=corpus, head_depth=head_depth), passthrough


def _prompt_lookup(cfg: dict[str, Any]) -> tuple[int | None, int]:
    """(prompt_lookup_max, prompt_lookup_min): max turns prompt lookup on, min defaults to `DEFAULT_MIN_N` (at most
    max)."""
    top, low = cfg.get("prompt_lookup_max"), cfg.get("prompt_lookup_min")
    for name, value in (("prompt_lookup_max", top), ("prompt_lookup_min", low)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64):
            raise PEagleConfigError(f"{_field(name)} must be an n-gram length from 1 to 64, got {value!r}")
    if top is None:
        if low is not None:
            raise PEagleConfigError(f"{_field('prompt_lookup_min')} needs {_field('prompt_lookup_max')}, which turns "
                                    "prompt lookup on: add it (e.g. 5) or drop prompt_lookup_min")
        return None, DEFAULT_MIN_N
    low = min(DEFAULT_MIN_N, top) if low is None else low
    if low > top:
        raise PEagleConfigError(f"{_field('prompt_lookup_min')} is {low}, above prompt_lookup_max ({top}): the "
                                "shortest n-gram matched cannot be longer than the longest")
    return top, low


def check_head_fits_target(head: HeadConfig, where: str, target_hidden_size: int, target_vocab_size: int,
                           target_num_layers: int, k: int) -> None:
    """Refuses a head trained for another target, or asked for more tokens than it has mask slots."""
    if head.target_hidden_size != target_hidden_size:
        raise PEagleConfigError(f"draft {where}: target_hidden_size {head.target_hidden_size} does not match the "
                                f"target's hidden size {target_hidden_size}: the head was trained for another target")
    if head.vocab_size != target_vocab_size:
        raise PEagleConfigError(f"draft {where}: vocab_size {head.vocab_size} does not match the target's "
                                f"vocabulary of {target_vocab_size}: the head was trained for another target/tokenizer")
    ids = head.aux_layer_ids
    if len(ids) != 3 or len(set(ids)) != 3 or any(not 0 <= i <= target_num_layers for i in ids):
        raise PEagleConfigError(f"draft {where}: eagle_aux_hidden_state_layer_ids {ids} must be 3 distinct layer "
                                f"ids in 0..{target_num_layers} of the target: the head was trained for another target")
    if head.variant == "eagle3":
        raise PEagleConfigError(f"draft {where} is a sequential EAGLE-3 head (no mask slots): use "
                                '"method": "eagle3" for it, or a P-EAGLE head with p_eagle')
    if head.variant == "depth" and k > head.trained_depth:
        raise PEagleConfigError(f"{_field('num_speculative_tokens')} is {k} but draft {where} has depth-aware mask "
                                f"slots for {head.trained_depth} tokens only: use at most {head.trained_depth}")
