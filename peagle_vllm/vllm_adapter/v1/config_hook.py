"""Front-end hook on `vllm.engine.arg_utils.EngineArgs.create_speculative_config`.

A `{"method": "p_eagle", ...}` dict is validated (clear errors naming the field), translated to
vLLM's `eagle3` + `parallel_drafting` so the scheduler reserves K lookahead slots and the target
emits its auxiliary hidden states, and the resulting draft config is marked: its architecture
becomes ours and the mark (`carriers.PEagleMark`: the head config and our options) rides on its
hf_config into the engine-core and worker processes. Lossy acceptance (`verifier_accept_k` and
`accept_tolerance`) comes from the speculative config only: a warning when it is on, an info line when
the checkpoint declares other values (ignored).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

from peagle_vllm.checkpoint import CheckpointError, read_head_config, read_tensors, validate_weights
from peagle_vllm.config import (METHOD, TOLERANCE_KEYS, PEagleConfigError, PEagleOptions, check_head_fits_target,
                                split_p_eagle_config)
from peagle_vllm.corpus_lookup import CorpusError, read_answers
from peagle_vllm.head import HeadConfig
from peagle_vllm.vllm_adapter.log import logger
from peagle_vllm.vllm_adapter.model_path import resolve_draft_path
from peagle_vllm.vllm_adapter.v1.carriers import PEagleMark, set_mark


def _vllm_spec_keys() -> set[str]:
    from vllm.config.speculative import SpeculativeConfig

    return {f.name for f in dataclasses.fields(SpeculativeConfig) if f.init}


def log_acceptance(options: PEagleOptions, head: HeadConfig, path: str) -> None:
    """One warning when acceptance is lossy; one info line when the checkpoint declares acceptance settings
    other than those in use (they are never taken from it)."""
    declared = {key: head.extra[key] for key in TOLERANCE_KEYS if key in head.extra}
    if any(value != getattr(options, key) for key, value in declared.items()):
        logger.info("p_eagle: %s declares %s; ignored: p_eagle takes verifier_accept_k and accept_tolerance from "
                    "the speculative config only (in use: %d and %g, lossless unless set there)", path,
                    ", ".join(f"{key}={value!r}" for key, value in declared.items()),
                    options.verifier_accept_k, options.accept_tolerance)
    if options.lossy:
        logger.warning("p_eagle: LOSSY acceptance (verifier_accept_k=%d, accept_tolerance=%g): a greedy "
                       "(temperature 0) request may emit a draft that is not the target's argmax, so its output can "
                       "differ from the target's own; sampled requests stay lossless",
                       options.verifier_accept_k, options.accept_tolerance)


def prepare(user_config: dict, hidden: int, vocab: int, layers: int) -> tuple[dict, PEagleMark]:
    """Validates a p_eagle dict against the draft checkpoint and the target (its hidden size,
    vocabulary and layer count); returns the dict to hand to vLLM and the mark for the draft config."""
    options, passthrough = split_p_eagle_config(user_config, _vllm_spec_keys())
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1":
        raise PEagleConfigError("p_eagle runs on vLLM's V1 model runner, which its hooks patch: unset "
                                "VLLM_USE_V2_MODEL_RUNNER")
    path = resolve_draft_path(options.model)
    head = read_head_config(path)
    validate_weights(head, read_tensors(path, ("mask_hidden", "d2t")), path)
    k = options.num_speculative_tokens or head.trained_depth
    check_head_fits_target(head, path, hidden, vocab, layers, k)
    if options.lookup_corpus is not None:
        try:
            read_answers(Path(options.lookup_corpus), vocab)
        except CorpusError as exc:
            raise PEagleConfigError(f"speculative_config['lookup_corpus']: {exc}") from exc
    log_acceptance(options, head, path)
    if k > head.trained_depth:
        logger.warning("p_eagle: num_speculative_tokens=%d is above the depth %d that %s was trained for; its "
                       "shared mask slot is reused, expect lower acceptance at the extra positions",
                       k, head.trained_depth, path)
    for_vllm = {**passthrough, "model": path, "method": "eagle3", "parallel_drafting": True,
                "num_speculative_tokens": k}
    return for_vllm, PEagleMark(dataclasses.replace(options, model=path, num_speculative_tokens=k), head)


def with_target_positions(mark: PEagleMark, max_model_len: int) -> PEagleMark:
    """The head's rotary table and maximum length follow the target's: drafts run at the target's positions,
    which may lie past the head's own `max_position_embeddings` (a head trained on short windows); the draft's
    `max_model_len` becomes the target's once vLLM has built the speculative config."""
    if mark.head.max_position_embeddings >= max_model_len:
        return mark
    return dataclasses.replace(mark, head=dataclasses.replace(mark.head, max_position_embeddings=max_model_len))


def _refuse_depth_head_in_builtin(user_config: dict) -> None:
    """vLLM's own parallel drafting has one shared mask slot; a depth-aware head would load wrongly."""
    model = user_config.get("model")
    if not (user_config.get("parallel_drafting") and isinstance(model, str) and os.path.isdir(model)):
        return
    try:
        head = read_head_config(model)
    except CheckpointError:
        return
    if head.variant == "depth":
        raise PEagleConfigError(f"draft {model} is a depth-aware P-EAGLE head (one mask slot per depth): only "
                                '"method": "p_eagle" runs it; vLLM\'s built-in parallel drafting needs a "standard" head')


def wrap_create_speculative_config(original):
    @functools.wraps(original)
    def create_speculative_config(self, target_model_config, target_parallel_config):
        user = self.speculative_config
        if not (isinstance(user, dict) and user.get("method") == METHOD):
            if isinstance(user, dict):
                _refuse_depth_head_in_builtin(user)
            return original(self, target_model_config, target_parallel_config)
        if target_parallel_config.pipeline_parallel_size > 1:
            raise PEagleConfigError("p_eagle does not run with pipeline parallelism (the draft head needs the "
                                    "target's hidden states on one rank): use --pipeline-parallel-size 1 "
                                    "(tensor parallelism is fine)")
        for_vllm, mark = prepare(user, target_model_config.get_hidden_size(), target_model_config.get_vocab_size(),
                                 target_model_config.get_total_num_hidden_layers())
        mark = with_target_positions(mark, target_model_config.max_model_len)
        self.speculative_config = for_vllm
        try:
            spec = original(self, target_model_config, target_parallel_config)
        finally:
            self.speculative_config = user
        from peagle_vllm.vllm_adapter.v1.draft_model import ARCHITECTURE

        if user.get("max_model_len") is None:  # the runner stops drafting past the draft's max_model_len
            spec.draft_model_config.max_model_len = target_model_config.max_model_len
        hf = spec.draft_model_config.hf_config
        set_mark(hf, mark)
        hf.architectures = [ARCHITECTURE]
        hf.eagle_aux_hidden_state_layer_ids = list(mark.head.aux_layer_ids)
        spec.update_arch_()
        return spec

    return create_speculative_config
