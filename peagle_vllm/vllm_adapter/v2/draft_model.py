"""The P-EAGLE head built from vLLM 0.34 layers: the serving twin of `peagle_vllm.head.PEagleHead` (same
config, same weight names, equal outputs on the same weights and inputs; `tests/v2` holds them equal).

Layers: VocabParallelEmbedding, ReplicatedLinear fc (+ per-chunk RMSNorm for `fc_norm` heads),
QKVParallelLinear / RowParallelLinear / get_rope / Attention for the decoder layer's attention,
LlamaMLP, RMSNorm, ParallelLMHead + LogitsProcessor. The attention is split so that everything
around the paged-attention kernel is reachable on its own (`attention_inputs`, `forward(attend=...)`,
`context_kv`): the speculator stores context K/V without running attention, and tests on CPU run
every layer but the kernel.

Rules:
- Any number of decoder layers. A 1-layer head's context K/V come from the layer's input alone (`context_kv`,
  no attention); a deeper head's from a forward over the context rows (the speculator runs it).
- Layer 0 attends over [norm(embedding) ; norm(hidden)] (2H wide), as EAGLE-3.
- `compute_logits` returns target-vocabulary logits, -inf outside the draft vocabulary (vLLM's EAGLE-3
  convention, which its rejection sampler reads); `draft_logits` the draft-vocabulary ones.
- Weights load from either layout (speculators names, or vLLM's `midlayer.*` / `model.*`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import QKVParallelLinear, ReplicatedLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama import LlamaMLP

from peagle_vllm.head import HeadConfig
from peagle_vllm.vllm_adapter.v2.hf_config import head_of

_STACKED = {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
            ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (layer index, q, k, v) -> out


def checkpoint_name(name: str) -> str:
    """A checkpoint tensor name (either layout) -> this module's parameter name (before qkv/gate-up stacking)."""
    name = name.replace("midlayer.", "layers.0.").removeprefix("model.")
    return name if name.startswith("lm_head") or name in ("d2t", "t2d", "mask_hidden") else f"model.{name}"


class PEagleAttention(nn.Module):
    """Llama attention (qkv_proj, rotary, paged attention, o_proj) with a chosen input width."""

    def __init__(self, vllm_config: VllmConfig, cfg: HeadConfig, input_size: int, layer_index: int, prefix: str,
                 attn_backend: type | None) -> None:
        super().__init__()
        self.layer_index = layer_index
        tp = get_tensor_model_parallel_world_size()
        self.num_heads = cfg.num_attention_heads // tp
        self.num_kv_heads = max(1, cfg.num_key_value_heads // tp)
        self.q_size, self.kv_size = self.num_heads * cfg.head_dim, self.num_kv_heads * cfg.head_dim
        self.qkv_proj = QKVParallelLinear(input_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads,
                                          bias=False, prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False,
                                        prefix=f"{prefix}.o_proj")
        self.rotary_emb = get_rope(cfg.head_dim, max_position=cfg.max_position_embeddings, is_neox_style=True,
                                   rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta})
        self.attn = Attention(self.num_heads, cfg.head_dim, cfg.head_dim ** -0.5, num_kv_heads=self.num_kv_heads,
                              cache_config=vllm_config.cache_config, prefix=f"{prefix}.attn",
                              attn_backend=attn_backend)

    def attention_inputs(self, positions: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """positions [N], x [N, in] -> q [N, heads*hd], k and v [N, kv_heads*hd] (rotary applied)."""
        qkv, _ = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return q, k, v

    def forward(self, positions: torch.Tensor, x: torch.Tensor, attend: Attend | None = None) -> torch.Tensor:
        q, k, v = self.attention_inputs(positions, x)
        out, _ = self.o_proj(attend(self.layer_index, q, k, v) if attend else self.attn(q, k, v))
        return out


class PEagleDecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, cfg: HeadConfig, index: int, prefix: str,
                 attn_backend: type | None) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.index = index
        self.norm_before_residual = cfg.norm_before_residual
        width = 2 * h if index == 0 else h
        self.self_attn = PEagleAttention(vllm_config, cfg, width, index, f"{prefix}.self_attn", attn_backend)
        if index == 0:
            self.hidden_norm = RMSNorm(h, eps=cfg.rms_norm_eps)
        self.mlp = LlamaMLP(hidden_size=h, intermediate_size=cfg.intermediate_size, hidden_act="silu",
                            prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(h, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, eps=cfg.rms_norm_eps)

    def attention_input(self, embeds: torch.Tensor, hidden: torch.Tensor,
                        residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """What the attention reads [N, in] and the residual stream [N, H]."""
        if self.index == 0:
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            return torch.cat([self.input_layernorm(embeds), normed], dim=-1), residual
        return self.input_layernorm(hidden, residual)

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None, attend: Attend | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.attention_input(embeds, hidden, residual)
        x = self.self_attn(positions, x, attend)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class PEagleBody(nn.Module):
    """Embedding, fc over the auxiliary states, decoder layers and final norm (weights 'model.*')."""

    def __init__(self, vllm_config: VllmConfig, cfg: HeadConfig, first_layer_id: int, prefix: str,
                 attn_backend: type | None) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, prefix=f"{prefix}.embed_tokens")
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, eps=cfg.rms_norm_eps)
                                         for _ in range(cfg.num_aux))
        self.fc = ReplicatedLinear(cfg.target_hidden_size * cfg.num_aux, cfg.hidden_size, bias=False,
                                   return_bias=False, prefix=f"{prefix}.fc")
        self.layers = nn.ModuleList(
            PEagleDecoderLayer(vllm_config, cfg, i, f"{prefix}.layers.{first_layer_id + i}", attn_backend)
            for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class PEagleDraftModel(nn.Module):
    """What `v2.speculator.PEagleSpeculator` drives: fc combine, mask states, context K/V, the one forward
    over the K query rows, logits, weights."""

    # None: the platform picks the attention backend, as for vLLM's own layers (a subclass may fix one).
    attn_backend: type | None = None
    has_own_embed_tokens = True
    has_own_lm_head = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        spec = vllm_config.speculative_config
        self.cfg = cfg = head_of(spec.draft_model_config.hf_config)
        self.config = spec.draft_model_config.hf_config
        target_layers = vllm_config.model_config.get_total_num_hidden_layers()
        self.model = PEagleBody(vllm_config, cfg, target_layers, f"{prefix}.model" if prefix else "model",
                                self.attn_backend)
        self.lm_head = ParallelLMHead(cfg.draft_vocab_size, cfg.hidden_size, prefix=f"{prefix}.lm_head")
        self.logits_processor = LogitsProcessor(cfg.draft_vocab_size)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long), persistent=False)
        mask_shape = (max(1, cfg.num_mask_slots), cfg.target_hidden_size * cfg.num_aux)
        self.register_buffer("mask_hidden", torch.zeros(mask_shape), persistent=False)
        self.num_forwards = 0  # counted so tests can hold the speculator to one forward per step

    @property
    def draft_to_target(self) -> torch.Tensor | None:
        """[Vd] target id of each draft id, or None when the vocabularies are the same."""
        if self.cfg.draft_vocab_size == self.cfg.vocab_size and not bool(self.d2t.any()):
            return None
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t

    def embed_input_ids(self, input_ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def combine_hidden_states(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [N, num_aux*Ht] concatenated target states -> [N, H] (fc, per-chunk norms when trained so)."""
        aux = aux.to(self.model.fc.weight.dtype)
        if self.cfg.fc_norm:
            chunks = aux.chunk(self.cfg.num_aux, dim=-1)
            aux = torch.cat([norm(c) for norm, c in zip(self.model.fc_norm, chunks)], dim=-1)
        return self.model.fc(aux)

    def mask_states(self, num_depths: int) -> torch.Tensor:
        """fc(mask_hidden) for depths 1..num_depths -> [num_depths, H] (a shared slot repeated)."""
        combined = self.combine_hidden_states(self.mask_hidden)
        if self.cfg.variant == "depth":
            if num_depths > combined.shape[0]:
                raise ValueError(f"head was trained for {combined.shape[0] + 1} tokens, asked for {num_depths + 1}")
            return combined[:num_depths]
        return combined[:1].expand(num_depths, -1)

    def context_kv(self, input_ids: torch.Tensor, positions: torch.Tensor,
                   hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft layer's K and V of context rows, without attention (a 1-layer head's only layer).
        input_ids/positions [N], hidden_states [N, H] (fc-combined) -> k, v [N, kv_heads*hd]."""
        if len(self.model.layers) != 1:
            raise ValueError("context_kv is for 1-layer heads: a deeper head's context K/V need a forward")
        layer = self.model.layers[0]
        x, _ = layer.attention_input(self.model.embed_tokens(input_ids), hidden_states, None)
        _, k, v = layer.self_attn.attention_inputs(positions, x)
        return k, v

    def store_context_kv(self, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Writes k, v [N, kv_heads*hd] into the draft layer's paged KV cache at slot_mapping [N] (-1: skip)."""
        attn = self.model.layers[0].self_attn.attn
        n = k.shape[0]
        attn.impl.do_kv_cache_update(attn, k.view(n, -1, self.cfg.head_dim), v.view(n, -1, self.cfg.head_dim),
                                     attn.kv_cache, slot_mapping)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None,
                attend: Attend | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids/positions [N], hidden_states [N, H] (fc-combined or mask states) -> (post-norm states
        for logits, states fed onward), both [N, H]. `attend` replaces every layer's paged-attention call (tests)."""
        self.num_forwards += 1
        embeds = inputs_embeds if inputs_embeds is not None else self.model.embed_tokens(input_ids)
        hidden, residual = hidden_states, None
        for layer in self.model.layers:
            hidden, residual = layer(positions, embeds, hidden, residual, attend)
        normed, prenorm = self.model.norm(hidden, residual)
        return normed, (normed if self.cfg.norm_output else prenorm)

    def draft_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """normed [N, H] -> logits over the draft vocabulary [N, Vd]."""
        return self.logits_processor(self.lm_head, normed)

    def to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., Vd] -> target-vocabulary logits [..., V], -inf outside the draft vocabulary."""
        index = self.draft_to_target
        if index is None:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.cfg.vocab_size), float("-inf"))
        out[..., index] = logits
        return out

    def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """normed [N, H] -> target-vocabulary logits [N, V] (vLLM's EAGLE-3 convention)."""
        return self.to_target_vocab(self.draft_logits(normed))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for raw_name, tensor in weights:
            name = checkpoint_name(raw_name)
            if name == "t2d":
                continue
            if name in ("d2t", "mask_hidden"):
                buf = getattr(self, name)
                buf.copy_(tensor.reshape(buf.shape).to(buf.dtype))
                loaded.add(name)
                continue
            for part, (stacked, shard) in _STACKED.items():
                if part in name:
                    param = params[name.replace(part, stacked)]
                    param.weight_loader(param, tensor, shard)
                    loaded.add(name.replace(part, stacked))
                    break
            else:
                if name not in params:
                    raise ValueError(f"draft checkpoint has unexpected tensor {raw_name!r}: it is not a P-EAGLE head")
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
                loaded.add(name)
        if "model.embed_tokens.weight" not in loaded:
            # a head saved without embeddings reads the target's: the speculator shares them after loading
            # (vLLM's maybe_share_target_embed); counted as loaded, so vLLM's loader does not refuse the head
            self.has_own_embed_tokens = False
            loaded.add("model.embed_tokens.weight")
        return loaded
