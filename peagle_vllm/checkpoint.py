"""Draft-head checkpoints: the speculators `peagle`/`eagle3` format (what we write) and vLLM's
EAGLE-3/P-EAGLE layout (`LlamaForCausalLMEagle3`, `midlayer.*`, as the public *-p-eagle heads).

`read_head_config` turns either config.json into a HeadConfig with clear errors naming the field;
`load_head`/`save_head` move weights between disk and `PEagleHead`. Acceptance settings a checkpoint
declares (speculators' `verifier_accept_k` / `accept_tolerance`) are kept raw in `HeadConfig.extra` and
never used: only the speculative config turns lossy acceptance on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from peagle_vllm.config import TOLERANCE_KEYS
from peagle_vllm.draft_temperature import DraftTemperatureError, checked
from peagle_vllm.head import HeadConfig, PEagleHead

MASK_TOKEN_KEYS = ("mask_token_id", "pard_token", "ptd_token_id")
WEIGHTS_FILE = "model.safetensors"
DRAFT_TEMPERATURE_KEY = "draft_temperature"  # ours: written only when calibrated (not 1)


class CheckpointError(ValueError):
    """A draft checkpoint that cannot be used; the message names the field and the fix."""


def _read_json(path: Path) -> dict:
    cfg_path = Path(path) / "config.json"
    if not Path(path).exists():
        raise CheckpointError(f"draft model path {str(path)!r} does not exist: pass the directory of a trained "
                              "head (e.g. models/demo-peagle-depth) as speculative_config['model']")
    if not cfg_path.is_file():
        raise CheckpointError(f"draft model path {str(path)!r} has no config.json: it is not a draft-head checkpoint")
    try:
        return json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_path} is not valid JSON ({exc}): re-export the head") from exc


def is_speculators_config(raw: dict) -> bool:
    return "speculators_model_type" in raw


def read_head_config(path: str | os.PathLike) -> HeadConfig:
    """HeadConfig from a speculators or vLLM-layout config.json."""
    raw = _read_json(Path(path))
    if is_speculators_config(raw):
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise CheckpointError(f"{path}/config.json: 'transformer_layer_config' is missing: "
                                  "a speculators checkpoint needs the draft layer's Llama config there")
        kind = raw["speculators_model_type"]
        if kind not in ("peagle", "eagle3"):
            raise CheckpointError(f"{path}/config.json: speculators_model_type {kind!r} is not a P-EAGLE or "
                                  "EAGLE-3 head; use 'peagle' or 'eagle3'")
        methods = (raw.get("speculators_config") or {}).get("proposal_methods") or [{}]
        depth = int(methods[0].get("speculative_tokens", 8))
        variant = raw.get("peagle_variant", "standard" if kind == "peagle" else "eagle3")
        top, proposal = raw, methods[0]
    else:
        layer, top, proposal = raw, raw, raw
        depth = int(raw.get("trained_depth", raw.get("num_speculative_tokens", 8)))
        variant = raw.get("peagle_variant", "standard")
    declared = {key: proposal[key] for key in TOLERANCE_KEYS if key in proposal}
    mask_id = next((top[k] for k in MASK_TOKEN_KEYS if top.get(k) is not None), None)
    if mask_id is None:
        mask_id = next((layer[k] for k in MASK_TOKEN_KEYS if layer.get(k) is not None), None)
    eagle_cfg = top.get("eagle_config") or {}
    aux = top.get("eagle_aux_hidden_state_layer_ids") or eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
    try:
        hidden = int(layer["hidden_size"])
        heads = int(layer["num_attention_heads"])
        return HeadConfig(
            hidden_size=hidden,
            vocab_size=int(layer["vocab_size"]),
            draft_vocab_size=int(top.get("draft_vocab_size") or layer.get("draft_vocab_size") or layer["vocab_size"]),
            intermediate_size=int(layer["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(layer.get("num_key_value_heads", heads)),
            aux_layer_ids=list(aux) if aux else [],
            mask_token_id=mask_id,
            target_hidden_size=top.get("target_hidden_size") or layer.get("target_hidden_size"),
            num_hidden_layers=int(layer.get("num_hidden_layers", 1)),
            head_dim=layer.get("head_dim"),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float((layer.get("rope_parameters") or {}).get("rope_theta", layer.get("rope_theta", 10000.0))),
            max_position_embeddings=int(layer.get("max_position_embeddings", 2048)),
            variant=variant,
            trained_depth=depth,
            fc_norm=bool(top.get("fc_norm", False)),
            norm_output=bool(top.get("norm_output", False)),
            norm_before_residual=bool(top.get("norm_before_residual", False)),
            draft_temperature=_draft_temperature(top, path),
            extra=declared,
        )
    except KeyError as exc:
        raise CheckpointError(f"{path}/config.json lacks {exc.args[0]!r}: the draft layer's config must give it") from exc


def _draft_temperature(top: dict, path) -> float:
    """The head's calibrated draft temperature (1 when it declares none)."""
    try:
        return checked(top.get(DRAFT_TEMPERATURE_KEY, 1.0), f"{path}/config.json: {DRAFT_TEMPERATURE_KEY!r}")
    except DraftTemperatureError as exc:
        raise CheckpointError(f"{exc}; fix it or remove the key") from exc


def _rename_vllm_layout(name: str) -> str:
    """vLLM EAGLE-3 layout names -> ours (speculators names)."""
    name = name.replace("midlayer.", "layers.0.")
    if name.startswith("model."):
        name = name[len("model."):]
    return name


def read_tensors(path: str | os.PathLike, wanted: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint directory, names normalised to ours: all of them, or only `wanted` (e.g.
    mask_hidden, d2t: cheap even for large heads). Truncated or corrupt files are refused clearly."""
    from safetensors import SafetensorError, safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path} holds no *.safetensors file: export the head with `peagle-vllm train`")
    found: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    name = _rename_vllm_layout(key)
                    if wanted is None or name in wanted:
                        found[name] = fh.get_tensor(key)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{f} is truncated or corrupt ({exc}): re-export or re-copy the head") from exc
    return found


def validate_weights(cfg: HeadConfig, weights: dict[str, torch.Tensor], where: str) -> None:
    """Checks the tensors P-EAGLE needs beyond shapes: mask hidden state, d2t range."""
    if cfg.variant != "eagle3":
        if cfg.mask_token_id is None:
            raise CheckpointError(f"{where}/config.json has no mask token (mask_token_id / pard_token / "
                                  "ptd_token_id): a P-EAGLE head needs the id its mask slots were trained with")
        if "mask_hidden" not in weights:
            raise CheckpointError(f"{where} has no 'mask_hidden' tensor: a P-EAGLE head needs the learned hidden "
                                  "state of its mask slots (train it with `peagle-vllm train`)")
        if not 0 <= cfg.mask_token_id < cfg.vocab_size:
            raise CheckpointError(f"{where}/config.json: mask_token_id {cfg.mask_token_id} is outside the "
                                  f"vocabulary of {cfg.vocab_size} tokens")
    if "d2t" in weights:
        d2t = weights["d2t"].to(torch.long)
        target_ids = torch.arange(len(d2t)) + d2t
        if len(d2t) != cfg.draft_vocab_size:
            raise CheckpointError(f"{where}: d2t has {len(d2t)} entries but draft_vocab_size is "
                                  f"{cfg.draft_vocab_size}: config and weights disagree")
        if len(d2t) and (target_ids.min() < 0 or target_ids.max() >= cfg.vocab_size):
            raise CheckpointError(f"{where}: d2t maps draft ids outside the target vocabulary of {cfg.vocab_size} "
                                  "tokens (target id = i + d2t[i]): the head belongs to another target")


def load_head(path: str | os.PathLike, dtype: torch.dtype = torch.float32,
              target_embeddings: torch.Tensor | None = None) -> PEagleHead:
    """A PEagleHead with the checkpoint's weights. A head saved without `embed_tokens` reads the target's
    `target_embeddings` [V, H], and is refused without them (random embeddings would draft nonsense)."""
    cfg = read_head_config(path)
    weights = read_tensors(path)
    validate_weights(cfg, weights, str(path))
    if "embed_tokens.weight" not in weights:
        if target_embeddings is None:
            raise CheckpointError(f"{path} shares its target's embeddings (no embed_tokens): pass the target's input "
                                  "embeddings as target_embeddings")
        weights["embed_tokens.weight"] = target_embeddings
    head = PEagleHead(cfg)
    if "mask_hidden" in weights:
        weights["mask_hidden"] = weights["mask_hidden"].reshape(-1, head.mask_hidden.shape[-1])
    missing, unexpected = head.load_state_dict(weights, strict=False)
    missing = [m for m in missing if m not in ("embed_tokens.weight", "d2t", "t2d")]
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not match its config (missing {missing}, unexpected {unexpected})")
    return head.to(dtype)


def speculators_config(cfg: HeadConfig, verifier: str, verifier_arch: str = "LlamaForCausalLM") -> dict:
    """config.json in the speculators format, readable by vLLM (peagle/eagle3) and by us."""
    layer = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "num_hidden_layers": cfg.num_hidden_layers,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    kind = "eagle3" if cfg.variant == "eagle3" else "peagle"
    out = {
        "architectures": ["PEagleSpeculator" if kind == "peagle" else "Eagle3Speculator"],
        "speculators_model_type": kind,
        "speculators_version": "0.3.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": cfg.aux_layer_ids,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": False,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        "peagle_variant": cfg.variant,
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.trained_depth}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": [verifier_arch]},
        },
    }
    if kind == "peagle":
        out["mask_token_id"] = cfg.mask_token_id
    if cfg.draft_temperature != 1.0:
        out[DRAFT_TEMPERATURE_KEY] = cfg.draft_temperature
    return out


def save_head(head: PEagleHead, out_dir: str | os.PathLike, verifier: str, dtype: torch.dtype = torch.float16,
              share_embeddings: bool = False) -> None:
    """Writes model.safetensors, then config.json, into `out_dir` (each written to a temporary file and
    renamed into place; other files there are kept). `share_embeddings` leaves `embed_tokens` out: the
    head then reads the target's embeddings, in vLLM as in `load_head(..., target_embeddings=...)`.
    `verifier` names the target (a name, not a machine path)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, value in head.state_dict().items():
        value = value.detach().cpu()
        tensors[name] = value.to(dtype) if value.is_floating_point() else value
    if head.cfg.draft_vocab_size == head.cfg.vocab_size and not tensors["d2t"].any():
        del tensors["d2t"], tensors["t2d"]  # identity map: vLLM's EAGLE-3 loader refuses a d2t it does not need
    if share_embeddings:
        del tensors["embed_tokens.weight"]
    if "mask_hidden" in tensors and head.cfg.variant == "standard":
        tensors["mask_hidden"] = tensors["mask_hidden"].reshape(1, 1, -1)
    weights = out_dir / f".{WEIGHTS_FILE}.tmp"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(weights))
    os.replace(weights, out_dir / WEIGHTS_FILE)
    config = out_dir / ".config.json.tmp"
    config.write_text(json.dumps(speculators_config(head.cfg, verifier), indent=2))
    os.replace(config, out_dir / "config.json")
