"""The P-EAGLE parallel draft head in plain torch (training, export, tests, the standalone GPU benchmark).

One forward drafts all K tokens: depth 0 sees (embedding of the last accepted token, fc(target
hidden states)); depths 1..K-1 see (mask-token embedding, fc(mask_hidden)). Weight names follow the
speculators `peagle` / vLLM EAGLE-3 layout, so `state_dict()` is the checkpoint. The vLLM-layer twin
lives in `vllm_adapter/draft_model.py`; a test holds their outputs equal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

VARIANTS = ("standard", "depth", "eagle3")


@dataclass
class HeadConfig:
    """Shape and behaviour of a draft head; serialised into the checkpoint's config.json."""

    hidden_size: int
    vocab_size: int  # target vocabulary
    draft_vocab_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    aux_layer_ids: list[int]
    mask_token_id: int | None
    target_hidden_size: int | None = None
    num_hidden_layers: int = 1
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    variant: str = "standard"
    trained_depth: int = 8
    fc_norm: bool = False  # one RMSNorm per auxiliary state before fc ("depth" variant)
    norm_output: bool = False  # feed post-norm hidden states onward ("depth" variant)
    norm_before_residual: bool = False
    draft_temperature: float = 1.0  # sampled drafts: T x this (`peagle_vllm.draft_temperature`); a calibration
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    @property
    def num_mask_slots(self) -> int:
        """Learned mask states: one shared (standard), one per depth 1..K-1 (depth), none (eagle3)."""
        if self.variant == "eagle3":
            return 0
        return max(1, self.trained_depth - 1) if self.variant == "depth" else 1

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (Llama's) of x [..., T, heads, head_dim] at positions [..., T]."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    angles = positions.float().unsqueeze(-1) * inv_freq  # [..., T, half]
    cos, sin = angles.cos().unsqueeze(-2), angles.sin().unsqueeze(-2)
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: HeadConfig, input_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(input_size, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(input_size, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(input_size, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        cfg, (b, t, _) = self.cfg, x.shape
        q = rotary(self.q_proj(x).view(b, t, cfg.num_attention_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = rotary(self.k_proj(x).view(b, t, cfg.num_key_value_heads, cfg.head_dim), positions, cfg.rope_theta)
        v = self.v_proj(x).view(b, t, cfg.num_key_value_heads, cfg.head_dim)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        groups = cfg.num_attention_heads // cfg.num_key_value_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1) if mask.dim() == 3 else mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """EAGLE-3 layer: layer 0 attends over [norm(embedding) ; norm(hidden)] (2H wide)."""

    def __init__(self, cfg: HeadConfig, index: int) -> None:
        super().__init__()
        self.index = index
        self.norm_before_residual = cfg.norm_before_residual
        width = 2 * cfg.hidden_size if index == 0 else cfg.hidden_size
        self.self_attn = Attention(cfg, width)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if index == 0:
            self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                positions: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.index == 0:
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        else:
            residual = hidden + residual
            x = self.input_layernorm(residual)
        residual = self.self_attn(x, positions, mask) + residual
        return self.mlp(self.post_attention_layernorm(residual)), residual


class PEagleHead(nn.Module):
    """Parallel draft head. `forward` takes already laid-out slots; `combine_hidden_states` is fc."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(cfg.num_aux))
        self.fc = nn.Linear(cfg.target_hidden_size * cfg.num_aux, h, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        if cfg.num_mask_slots:
            self.mask_hidden = nn.Parameter(torch.zeros(cfg.num_mask_slots, cfg.target_hidden_size * cfg.num_aux))
        # d2t: target id = draft id + d2t[draft id]; t2d: which target ids the draft vocabulary holds.
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool)
                             if cfg.draft_vocab_size == cfg.vocab_size else torch.zeros(cfg.vocab_size, dtype=torch.bool))

    def set_vocab_map(self, draft_to_target: torch.Tensor) -> None:
        """Install the draft vocabulary: `draft_to_target[i]` is the target id of draft id i."""
        draft_to_target = draft_to_target.to(torch.long)
        self.d2t.copy_(draft_to_target - torch.arange(len(draft_to_target), device=draft_to_target.device))
        self.t2d.zero_()
        self.t2d[draft_to_target] = True

    def draft_to_target(self) -> torch.Tensor:
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t

    def combine_hidden_states(self, aux: torch.Tensor) -> torch.Tensor:
        """[..., num_aux*Ht] concatenated target states -> [..., H]."""
        if self.cfg.fc_norm:
            chunks = aux.chunk(self.cfg.num_aux, dim=-1)
            aux = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(aux)

    def mask_states(self, num_depths: int) -> torch.Tensor:
        """fc(mask_hidden) for depths 1..num_depths -> [num_depths, H] (shared slot repeated)."""
        combined = self.combine_hidden_states(self.mask_hidden)
        if self.cfg.variant == "depth":
            if num_depths > combined.shape[0]:
                raise ValueError(f"head was trained for {combined.shape[0] + 1} tokens, asked for {num_depths + 1}")
            return combined[:num_depths]
        return combined.expand(num_depths, -1)

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids/positions [B, T], hidden [B, T, H] (already fc-combined), mask [B, T, T] bool or None
        (causal). Returns (post-norm states for logits, states fed onward) both [B, T, H]."""
        embeds = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(embeds, hidden, residual, positions, mask)
        prenorm = hidden + residual
        normed = self.norm(prenorm)
        return normed, (normed if self.cfg.norm_output else prenorm)

    def draft_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary."""
        return self.lm_head(normed)

    def target_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits scattered into the target vocabulary (-inf outside the draft vocabulary)."""
        logits = self.draft_logits(normed)
        if self.cfg.draft_vocab_size == self.cfg.vocab_size and not self.d2t.any():
            return logits
        out = logits.new_full((*logits.shape[:-1], self.cfg.vocab_size), float("-inf"))
        out[..., self.draft_to_target()] = logits
        return out

    @torch.no_grad()
    def draft_block(self, last_token: torch.Tensor, aux_hidden: torch.Tensor, context_ids: torch.Tensor,
                    context_aux: torch.Tensor, k: int) -> torch.Tensor:
        """Greedy K-token draft for each row from a full context, in ONE forward (no KV cache).

        context_ids [B, T] are the tokens x_1..x_T shifted as EAGLE expects (token j+1 with hidden j),
        context_aux [B, T, num_aux*Ht]; the last real slot is (last_token, aux_hidden). Returns [B, k].
        """
        b, t = context_ids.shape
        ids = torch.cat([context_ids, last_token[:, None]], dim=1)
        hid = self.combine_hidden_states(torch.cat([context_aux, aux_hidden[:, None]], dim=1))
        if k > 1:
            mask_id = self.cfg.mask_token_id
            ids = torch.cat([ids, torch.full((b, k - 1), mask_id, dtype=ids.dtype, device=ids.device)], dim=1)
            hid = torch.cat([hid, self.mask_states(k - 1).unsqueeze(0).expand(b, -1, -1).to(hid.dtype)], dim=1)
        positions = torch.arange(ids.shape[1], device=ids.device).expand(b, -1)
        normed, _ = self(ids, hid, positions)
        return self.target_logits(normed[:, t:]).argmax(-1)
