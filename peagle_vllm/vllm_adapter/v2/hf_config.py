"""The draft head's hf_config for vLLM 0.34+, read by our own config parser.

vLLM 0.34 refuses P-EAGLE checkpoints when it reads them (its speculators loader raises "P-EAGLE (parallel
drafting EAGLE-3) is not supported." for `speculators_model_type: peagle`), so p_eagle's draft ModelConfig
is built with `config_format=CONFIG_FORMAT`, which vLLM resolves to `PEagleConfigParser` (registered by
`v2.install()` through vLLM's public `register_config_parser`). The parser reads both layouts through
`peagle_vllm.checkpoint.read_head_config` (speculators `peagle`, and vLLM's EAGLE-3/P-EAGLE layout) and
returns a plain `LlamaConfig` for the draft layer, carrying:

- `architectures = [ARCHITECTURE]` (our `v2.draft_model.PEagleDraftModel`);
- `peagle`: the HeadConfig as a dict (the draft model is built from it, in every process);
- the fields vLLM itself reads from a draft config: `eagle_aux_hidden_state_layer_ids` (the target then
  outputs those auxiliary hidden states), `mask_token_id`, `draft_vocab_size`, `target_hidden_size`.
"""

from __future__ import annotations

import json
from pathlib import Path

from peagle_vllm.checkpoint import read_head_config
from peagle_vllm.head import HeadConfig

CONFIG_FORMAT = "peagle"
ARCHITECTURE = "PEagleV2DraftModel"
HEAD_ATTR = "peagle"  # the HeadConfig dict on the hf_config


def draft_hf_config(head: HeadConfig):
    """A transformers LlamaConfig describing the draft layer of `head`, marked as above."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=head.vocab_size, hidden_size=head.hidden_size, intermediate_size=head.intermediate_size,
        num_hidden_layers=head.num_hidden_layers, num_attention_heads=head.num_attention_heads,
        num_key_value_heads=head.num_key_value_heads, head_dim=head.head_dim, rms_norm_eps=head.rms_norm_eps,
        max_position_embeddings=head.max_position_embeddings, hidden_act="silu", tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": head.rope_theta})
    config.architectures = [ARCHITECTURE]
    setattr(config, HEAD_ATTR, head.to_dict())
    config.eagle_aux_hidden_state_layer_ids = list(head.aux_layer_ids)
    config.mask_token_id = head.mask_token_id
    config.draft_vocab_size = head.draft_vocab_size
    config.target_hidden_size = head.target_hidden_size
    return config


def head_of(hf_config) -> HeadConfig:
    """The HeadConfig a p_eagle draft hf_config carries; a clear error for any other config."""
    raw = getattr(hf_config, HEAD_ATTR, None)
    if not isinstance(raw, dict):
        raise TypeError(f"draft config {type(hf_config).__name__} was not made by p_eagle's config parser "
                        f"(no {HEAD_ATTR!r} field): build it with config_format={CONFIG_FORMAT!r}")
    return HeadConfig(**raw)


def _parser_base():
    from vllm.transformers_utils.config_parser_base import ConfigParserBase

    return ConfigParserBase


class PEagleConfigParser(_parser_base()):
    """vLLM config parser for p_eagle draft heads (either checkpoint layout)."""

    def parse(self, model: str | Path, trust_remote_code: bool, revision: str | None = None,
              code_revision: str | None = None, **kwargs) -> tuple[dict, object]:
        """Returns (config.json as a dict, the marked LlamaConfig); raises CheckpointError naming the field."""
        head = read_head_config(model)
        raw = json.loads((Path(model) / "config.json").read_text())
        return raw, draft_hf_config(head)
