"""The P-EAGLE head built from vLLM layers (paged KV cache, vLLM attention, TP-aware linears):
the serving twin of `peagle_vllm.head.PEagleHead`, same config and weight names.

Registered as ARCHITECTURE (vLLM's eagle3 path expects a name starting with "Eagle3"). Its
config comes from the mark the config hook put on the draft hf_config (`carriers.mark_of`).
Its matmuls run in `matmul_dtype` (`peagle_vllm.matmul_dtype`): their weights are converted when loaded, before
vLLM packs them; fc, qkv, o_proj, the MLP (whole) and the output layer get their input cast to it and give their
output back in the model's dtype.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from transformers import LlamaConfig
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import QKVParallelLinear, ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama import LlamaAttention, LlamaMLP

from peagle_vllm.head import HeadConfig
from peagle_vllm.matmul_dtype import head_matmul_dtype
from peagle_vllm.vllm_adapter.v1.carriers import mark_of

ARCHITECTURE = "Eagle3PEagleDraftModel"
MATMULS = ("fc", "qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")  # modules run in matmul_dtype
_STACKED = {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
            ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}


def _llama_config(cfg: HeadConfig) -> LlamaConfig:
    return LlamaConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                       num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                       head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, hidden_act="silu",
                       max_position_embeddings=cfg.max_position_embeddings,
                       rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta})


class PEagleDecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, cfg: HeadConfig, index: int, matmul_dtype: torch.dtype,
                 prefix: str) -> None:
        super().__init__()
        llama = _llama_config(cfg)
        h = cfg.hidden_size
        self.index, self.matmul_dtype = index, matmul_dtype
        self.norm_before_residual = cfg.norm_before_residual
        self.self_attn = LlamaAttention(config=llama, hidden_size=h, num_heads=cfg.num_attention_heads,
                                        num_kv_heads=cfg.num_key_value_heads,
                                        max_position_embeddings=cfg.max_position_embeddings,
                                        cache_config=vllm_config.cache_config, prefix=f"{prefix}.self_attn")
        if index == 0:  # layer 0 attends over [embedding ; hidden], 2H wide
            self.self_attn.qkv_proj = QKVParallelLinear(2 * h, cfg.head_dim, cfg.num_attention_heads,
                                                        cfg.num_key_value_heads, bias=False,
                                                        prefix=f"{prefix}.self_attn.qkv_proj")
            self.hidden_norm = RMSNorm(h, eps=cfg.rms_norm_eps)
        self.mlp = LlamaMLP(hidden_size=h, intermediate_size=cfg.intermediate_size, hidden_act="silu",
                            prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(h, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, eps=cfg.rms_norm_eps)

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """rows (last layer only): the token rows whose outputs are read; every token's KV is still written,
        but o_proj, the MLP and what follows run on those rows alone (row-wise ops: same values)."""
        if self.index == 0:
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        else:
            x, residual = self.input_layernorm(hidden, residual)
        attn, dtype, mm = self.self_attn, x.dtype, self.matmul_dtype
        qkv, _ = attn.qkv_proj(x.to(mm))  # LlamaAttention.forward, with the rows picked before o_proj
        q, k, v = qkv.to(dtype).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q, k = attn.rotary_emb(positions, q, k)
        x = attn.attn(q, k, v)
        if rows is not None:
            x, residual = x.index_select(0, rows), residual.index_select(0, rows)
        x, _ = attn.o_proj(x.to(mm))
        x, residual = self.post_attention_layernorm(x.to(dtype), residual)
        return self.mlp(x.to(mm)).to(dtype), residual


class PEagleBody(nn.Module):
    """Embedding, fc over the auxiliary states, decoder layers and final norm (weights 'model.*')."""

    def __init__(self, vllm_config: VllmConfig, cfg: HeadConfig, first_layer_id: int, matmul_dtype: torch.dtype,
                 prefix: str) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, prefix=f"{prefix}.embed_tokens")
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, eps=cfg.rms_norm_eps)
                                         for _ in range(cfg.num_aux))
        self.fc = ReplicatedLinear(cfg.target_hidden_size * cfg.num_aux, cfg.hidden_size, bias=False,
                                   return_bias=False, prefix=f"{prefix}.fc")
        self.layers = nn.ModuleList(
            PEagleDecoderLayer(vllm_config, cfg, i, matmul_dtype, prefix=f"{prefix}.layers.{first_layer_id + i}")
            for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class PEagleDraftModel(nn.Module):
    """What PEagleProposer drives: forward over laid-out slots, fc combine, logits, weights."""

    has_own_embed_tokens = True
    has_own_lm_head = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        spec = vllm_config.speculative_config
        mark = mark_of(spec)
        self.cfg = cfg = mark.head
        self.config = spec.draft_model_config.hf_config
        self.matmul_dtype = head_matmul_dtype(mark.options.head_matmul_dtype, vllm_config.device_config.device,
                                              spec.draft_model_config.dtype)
        self.draft_temperature = mark.options.draft_temperature_for(cfg)  # sampled drafts at the request's T x this
        target_layers = vllm_config.model_config.get_total_num_hidden_layers()
        self.model = PEagleBody(vllm_config, cfg, target_layers, self.matmul_dtype,
                                prefix=f"{prefix}.model" if prefix else "model")
        self.lm_head = ParallelLMHead(cfg.draft_vocab_size, cfg.hidden_size, prefix=f"{prefix}.lm_head")
        self.logits_processor = LogitsProcessor(cfg.draft_vocab_size)
        self.logits_processor.head_dtype = self.matmul_dtype  # (else it casts the output layer's weight every call)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long), persistent=False)
        self.register_buffer("mask_hidden", torch.zeros(max(1, cfg.num_mask_slots), cfg.target_hidden_size * cfg.num_aux),
                             persistent=False)
        self.num_forwards = 0  # counted so tests can hold the proposer to one forward per step

    @property
    def draft_to_target(self) -> torch.Tensor | None:
        """Target id of each draft id, or None when the vocabularies are the same."""
        if self.cfg.draft_vocab_size == self.cfg.vocab_size and not bool(self.d2t.any()):
            return None
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t

    def embed_input_ids(self, input_ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        # The target's embedding, when shared, is LoRA-wrapped under enable_lora: its wrapper indexes the
        # target batch's LoRA mapping, not the draft's slots. Drafts read the base embedding (an adapter's
        # embedding delta only changes what is proposed; verification by the adapted target stays exact).
        embed = self.model.embed_tokens
        return getattr(embed, "base_layer", embed)(input_ids)

    def combine_hidden_states(self, aux: torch.Tensor) -> torch.Tensor:
        """[N, num_aux*Ht] concatenated target states -> [N, H] (fc, per-chunk norms when trained so)."""
        if self.cfg.fc_norm:  # the fc_norm RMSNorms (vLLM's native rms_norm) over all chunks at once
            n, eps = self.cfg.num_aux, self.cfg.rms_norm_eps
            weight = self._fc_norm_weight()
            x = aux.view(*aux.shape[:-1], n, aux.shape[-1] // n).to(torch.float32)
            x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
            aux = (x.to(weight.dtype) * weight).to(aux.dtype).view(aux.shape)
        return self.model.fc(aux.to(self.matmul_dtype)).to(aux.dtype)

    def _fc_norm_weight(self) -> torch.Tensor:
        """The fc_norm weights stacked [num_aux, Ht], built once (dropped when weights are loaded)."""
        weight = self.__dict__.get("_fc_norm_stacked")
        if weight is None:
            weight = self.__dict__["_fc_norm_stacked"] = torch.stack([norm.weight.data for norm in self.model.fc_norm])
        return weight

    def mask_states(self) -> torch.Tensor:
        """fc(mask_hidden): [1, H] shared, or [K_trained-1, H] per depth."""
        return self.combine_hidden_states(self.mask_hidden)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None,
                rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """rows: when given, the outputs are those token rows only ([len(rows), H]; the proposer passes the
        sampled slots): the context tokens' KV is written, the layers after their last attention skip them."""
        self.num_forwards += 1
        embeds = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        hidden, residual = hidden_states, None
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            hidden, residual = layer(positions, embeds, hidden, residual, rows if i == last else None)
        normed, prenorm = self.model.norm(hidden, residual)
        return normed, (normed if self.cfg.norm_output else prenorm)

    def draft_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """[N, H] -> logits over the draft vocabulary [N, Vd], in the dtype of `normed`."""
        return self.logits_processor(self.lm_head, normed.to(self.matmul_dtype)).to(normed.dtype)

    def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits over the target vocabulary (-inf outside the draft vocabulary)."""
        logits = self.draft_logits(normed)
        index = self.draft_to_target
        if index is None:
            return logits
        out = logits.new_full((logits.shape[0], self.cfg.vocab_size), float("-inf"))
        out[:, index] = logits
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        self.__dict__.pop("_fc_norm_stacked", None)
        for name, tensor in weights:
            name = name.replace("midlayer.", "layers.0.").removeprefix("model.")
            if name == "t2d":
                continue
            if name in ("d2t", "mask_hidden"):
                buf = getattr(self, name)
                buf.copy_(tensor.reshape(buf.shape).to(buf.dtype))
                loaded.add(name)
                continue
            full = name if name.startswith("lm_head") else f"model.{name}"
            for part, (stacked, shard) in _STACKED.items():
                if part in full:
                    param = params[full.replace(part, stacked)]
                    param.weight_loader(param, tensor, shard)
                    loaded.add(full.replace(part, stacked))
                    break
            else:
                if full not in params:
                    raise ValueError(f"draft checkpoint has unexpected tensor {name!r}: it is not a P-EAGLE head")
                param = params[full]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
                loaded.add(full)
        if "model.embed_tokens.weight" not in loaded:
            self.has_own_embed_tokens = False  # the proposer then shares the target's embedding
        for name, module in self.named_modules():  # before vLLM packs them for its kernels
            if name.rpartition(".")[2] in MATMULS:
                module.weight.data = module.weight.data.to(self.matmul_dtype)
        return loaded
