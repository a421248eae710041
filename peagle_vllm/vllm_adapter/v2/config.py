"""`PEagleSpeculatorConfig`: how vLLM 0.34's SpeculativeConfig is set up for `method="p_eagle"`.

Registered with `register_speculative_method("p_eagle", ...)` (see `v2.install`). Like every speculator config
module it is imported in every process and must not import the speculator (`v2.speculator`).

Rules:
- p_eagle's own keys (verify, adaptive, min_k, acceptance_warn_below, ...) go in `speculator_options`, the field
  vLLM 0.34 gives custom speculators; they are validated by the core's `split_p_eagle_config`, and an error
  names the field as the user wrote it, e.g. `speculative_config['speculator_options']['verify']`.
- vLLM fields that conflict with p_eagle are refused with one line naming the field and the fix
  (`REFUSED_FIELDS`); p_eagle sets `draft_sample_method="probabilistic"` (sampled drafts keep their draft
  distribution, so verification at temperature > 0 stays lossless) and `rejection_sample_method` from `verify`
  ("block" -> "block", else "standard").
- the draft checkpoint is read by our config parser (`hf_config.CONFIG_FORMAT`; vLLM 0.34 refuses P-EAGLE
  checkpoints itself) and checked against the target by the core (`validate_weights`, `check_head_fits_target`).
- `base_method = "eagle3"`: vLLM then treats p_eagle as an EAGLE-style drafter (draft KV cache, target
  auxiliary hidden states, and the prefix-cache trailing-block drop, since a context row's draft KV depends on
  the next token); `parallel_drafting = True` tells code outside the speculator that all K drafts come from one
  forward.
- prompt and corpus lookup (prompt_lookup_max/min, lookup_corpus) run on the device, in the speculator
  (`batch_lookup`, `corpus_table`), and ask vLLM for the requests' token history in device memory rather than host
  memory mapped for the device (`prefer_dense_token_history`), as vLLM's own n-gram drafting does.
- refused: lossy acceptance (verifier_accept_k > 1 with accept_tolerance > 0: vLLM's own rejection sampler
  verifies here), head_depth (V2 gives every request of a step the same K, so the depths past the head's could
  not be left undrafted), data parallelism, and draft decode context parallelism.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm.v1.worker.gpu.spec_decode.speculator_config import DraftModelSpeculatorConfig

from peagle_vllm.checkpoint import read_head_config, read_tensors, validate_weights
from peagle_vllm.config import (METHOD, OWN_KEYS, PEagleConfigError, PEagleOptions, check_head_fits_target,
                                split_p_eagle_config)
from peagle_vllm.corpus_lookup import CorpusError, read_answers
from peagle_vllm.head import HeadConfig
from peagle_vllm.vllm_adapter.log import LOGGER_NAME
from peagle_vllm.vllm_adapter.v2.hf_config import CONFIG_FORMAT, head_of

if TYPE_CHECKING:
    from vllm.config import SpeculativeConfig

logger = logging.getLogger(LOGGER_NAME)
SPECULATOR_CLASS = "peagle_vllm.vllm_adapter.v2.speculator.PEagleSpeculator"
# vLLM 0.34 SpeculativeConfig fields p_eagle refuses when set away from their defaults.
REFUSED_FIELDS: dict[str, tuple[Any, str]] = {
    "parallel_drafting": (None, "p_eagle always drafts in parallel; drop the key"),
    "enable_adaptive_verification": (False, "it is DSpark's; p_eagle verifies every draft (see 'verify')"),
    "use_local_argmax_reduction": (False, "p_eagle samples its drafts from the full draft distribution; drop it"),
    "synthetic_acceptance_rates": (None, "synthetic acceptance replaces verification; drop it"),
    "synthetic_acceptance_length": (None, "synthetic acceptance replaces verification; drop it"),
    "fly_window_size": (None, "FLy is lossy; p_eagle verification is lossless; drop it"),
}
REJECTION_METHOD = {"auto": "standard", "standard": "standard", "block": "block"}


def _field(name: str, own: bool = False) -> str:
    return f"speculative_config['speculator_options'][{name!r}]" if own else f"speculative_config[{name!r}]"


def options_of(spec: SpeculativeConfig) -> PEagleOptions:
    """Our options from a p_eagle SpeculativeConfig (pure: the speculator calls it again in the worker)."""
    raw = spec.speculator_options or {}
    if not isinstance(raw, dict):
        raise PEagleConfigError(f"{_field('speculator_options')} must be a dict of p_eagle options "
                                f"({', '.join(OWN_KEYS)}), got {type(raw).__name__}")
    for key in raw:
        if key.replace("-", "_") not in OWN_KEYS:
            raise PEagleConfigError(f"{_field(key, own=True)} is not a p_eagle option: p_eagle takes "
                                    f"{', '.join(OWN_KEYS)} there; vLLM's own fields go at the top level")
    user = {**raw, "method": METHOD, "model": spec.model, "num_speculative_tokens": spec.num_speculative_tokens}
    try:
        options, _ = split_p_eagle_config(user)
    except PEagleConfigError as exc:  # name the field where the user wrote it
        message = str(exc)
        for key in raw:
            message = message.replace(_field(key.replace("-", "_")), _field(key, own=True))
        raise PEagleConfigError(message) from None
    return options


def refuse_conflicting_fields(spec: SpeculativeConfig, options: PEagleOptions) -> None:
    """One error line naming the first vLLM field that conflicts with p_eagle."""
    for name, (default, fix) in REFUSED_FIELDS.items():
        if getattr(spec, name, default) != default:
            raise PEagleConfigError(f"{_field(name)} cannot be used with p_eagle: {fix}")
    if options.lossy:
        raise PEagleConfigError(f"{_field('accept_tolerance', own=True)} > 0 with verifier_accept_k > 1 (lossy "
                                "acceptance) needs p_eagle's own sampler, which vLLM 0.34's V2 runner does not run: "
                                "drop both keys (or use vLLM 0.32/0.33)")
    if options.head_depth is not None:
        raise PEagleConfigError(f"{_field('head_depth', own=True)} needs each request's K set by p_eagle's scheduler "
                                "hook, which vLLM 0.34's V2 runner does not have (every request of a step verifies "
                                "the same K): drop head_depth, or use vLLM 0.32/0.33")
    method = spec.rejection_sample_method
    if method not in ("standard", REJECTION_METHOD[options.verify]):
        raise PEagleConfigError(f"{_field('rejection_sample_method')} is {method!r}: p_eagle verifies losslessly "
                                "and sets it itself; use speculator_options {'verify': 'block'} for block "
                                "verification, or drop the key")
    parallel = spec.target_parallel_config
    if parallel is not None and parallel.pipeline_parallel_size > 1:
        raise PEagleConfigError("p_eagle does not run with pipeline parallelism (the draft head needs the target's "
                                "hidden states on one rank): use --pipeline-parallel-size 1")
    if parallel is not None and parallel.data_parallel_size > 1:
        raise PEagleConfigError("p_eagle on vLLM 0.34 drafts eagerly, without the DP-synchronised CUDA-graph "
                                "dispatch that data parallelism needs: use --data-parallel-size 1")
    if (spec.draft_decode_context_parallel_size or 1) > 1:
        raise PEagleConfigError(f"{_field('draft_decode_context_parallel_size')} must be 1 for p_eagle "
                                "(its draft KV cache is replicated)")


def checked_head(spec: SpeculativeConfig, options: PEagleOptions) -> tuple[HeadConfig, int]:
    """The head's config and K, checked against the target; errors name the field and the fix."""
    path = os.path.abspath(os.path.expanduser(options.model))
    head = read_head_config(path)
    validate_weights(head, read_tensors(path, ("mask_hidden", "d2t")), path)
    k = options.num_speculative_tokens or head.trained_depth
    target = spec.target_model_config
    if target is not None:
        check_head_fits_target(head, path, target.get_hidden_size(), target.get_vocab_size(),
                               target.get_total_num_hidden_layers(), k)
    elif head.variant == "eagle3":
        raise PEagleConfigError(f"draft {path} is a sequential EAGLE-3 head (no mask slots): use "
                                '"method": "eagle3" for it, or a P-EAGLE head with p_eagle')
    if k > head.trained_depth:
        logger.warning("p_eagle: num_speculative_tokens=%d is above the depth %d that %s was trained for; its "
                       "shared mask slot is reused, expect lower acceptance there", k, head.trained_depth, path)
    return head, k


def check_corpus(spec: SpeculativeConfig, options: PEagleOptions) -> None:
    """The lookup corpus is read once here, so that a bad one is one line before any worker starts."""
    if options.lookup_corpus is None:
        return
    target = spec.target_model_config
    try:
        read_answers(Path(options.lookup_corpus), target.get_vocab_size() if target is not None else None)
    except CorpusError as exc:
        raise PEagleConfigError(f"{_field('lookup_corpus', own=True)}: {exc}") from None


class PEagleSpeculatorConfig(DraftModelSpeculatorConfig):
    """p_eagle on vLLM 0.34's V2 model runner (see the module docstring for the rules)."""

    base_method = "eagle3"
    speculator_class = SPECULATOR_CLASS
    supported_options = frozenset({"speculator_options"})
    uses_target_hidden_states = True
    parallel_drafting = True
    adaptive_verification_uses_draft_logits = True

    @classmethod
    def default_model(cls, spec: SpeculativeConfig) -> str | None:
        """No default head: refused with the core's message naming `model`."""
        options_of(spec)
        return spec.model

    @classmethod
    def configure(cls, spec: SpeculativeConfig) -> None:
        """Validates options and checkpoint, then sets up the draft ModelConfig through our config parser."""
        from vllm.config import ModelConfig, SpeculativeConfig

        options = options_of(spec)
        refuse_conflicting_fields(spec, options)
        head, k = checked_head(spec, options)
        check_corpus(spec, options)
        spec.model = os.path.abspath(os.path.expanduser(options.model))
        spec.num_speculative_tokens = k
        spec.prompt_lookup_max = spec.prompt_lookup_min = 0
        spec.draft_sample_method = "probabilistic"
        spec.rejection_sample_method = REJECTION_METHOD[options.verify]
        if options.adaptive and not spec.uses_dynamic_speculative_decoding():
            logger.info("p_eagle: adaptive depth needs per-request K, which vLLM 0.34's V2 runner cannot "
                        "schedule; K stays fixed at %d, or follows vLLM's num_speculative_tokens_per_batch_size "
                        "when given (see docs/vllm-0.34.md)", k)
        target = spec.target_model_config
        spec.draft_model_config = ModelConfig(
            model=spec.model, runner="draft", tokenizer=target.tokenizer, tokenizer_mode=target.tokenizer_mode,
            trust_remote_code=target.trust_remote_code, dtype=target.dtype, seed=target.seed,
            revision=spec.revision, code_revision=spec.code_revision, max_model_len=spec.max_model_len,
            spec_target_max_model_len=target.max_model_len, quantization=spec.quantization,
            enforce_eager=target.enforce_eager, max_logprobs=target.max_logprobs, config_format=CONFIG_FORMAT)
        SpeculativeConfig._maybe_override_draft_max_position_embeddings(
            spec.draft_model_config.hf_config, target.max_model_len)
        spec.draft_tensor_parallel_size = SpeculativeConfig._verify_and_get_draft_tp(
            spec.target_parallel_config, spec.draft_tensor_parallel_size)
        spec.draft_decode_context_parallel_size = 1
        spec.draft_model_config.max_model_len = SpeculativeConfig._maybe_override_draft_max_model_len(
            spec.max_model_len, spec.draft_model_config.max_model_len, target.max_model_len)
        spec.draft_parallel_config = SpeculativeConfig.create_draft_parallel_config(
            spec.target_parallel_config, spec.draft_tensor_parallel_size, draft_model_config=spec.draft_model_config)

    @property
    def head(self) -> HeadConfig:
        return head_of(self.spec_config.draft_model_config.hf_config)

    @property
    def uses_aux_hidden_states(self) -> bool:
        """The head reads three auxiliary hidden states of the target."""
        return True

    @property
    def prefer_dense_token_history(self) -> bool:
        """Prompt and corpus lookup read the requests' tokens every step: vLLM keeps them in device memory then."""
        return options_of(self.spec_config).looks_up

    @property
    def num_lookahead_tokens(self) -> int:
        """Draft KV slots past the last verified token: the query rows sit at P..P+K-1 (P already has one)."""
        return self.num_speculative_tokens

    def max_num_draft_seqs(self, max_num_batched_tokens: int) -> int:
        """The draft query pass has K rows per request."""
        return max_num_batched_tokens // self.num_speculative_tokens

    def hash_factors(self) -> list[Any]:
        return [METHOD, self.num_speculative_tokens]
