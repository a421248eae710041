"""Random tiny models built in a temp dir for tests that need no meaningful acceptance."""

from __future__ import annotations

from pathlib import Path

import torch

from peagle_vllm.checkpoint import save_head
from peagle_vllm.head import HeadConfig, PEagleHead

TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400))


def build_tiny_target(out: Path, hidden: int = 128, layers: int = 4, vocab: int = 512, seed: int = 0,
                      zero_lm_head: bool = False) -> Path:
    """A random Llama with a small byte-level BPE tokenizer (with a mask token), HF layout."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from peagle_vllm.harness.demo_target import CHAT_TEMPLATE, EOS_TOKEN, MASK_TOKEN, PAD_TOKEN

    torch.manual_seed(seed)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([TEXT], vocab_size=vocab, special_tokens=[EOS_TOKEN, MASK_TOKEN, PAD_TOKEN],
                            show_progress=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN,
                                   pad_token=PAD_TOKEN, mask_token=MASK_TOKEN)
    fast.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=False,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else None
        if zero_lm_head:
            model.lm_head.weight.zero_()
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


def tiny_head_config(target: Path, variant: str = "standard", k: int = 8, draft_vocab: int | None = None,
                     aux: list[int] | None = None, layers: int = 1) -> HeadConfig:
    import json

    t = json.loads((target / "config.json").read_text())
    from transformers import AutoTokenizer

    mask_id = AutoTokenizer.from_pretrained(target).mask_token_id
    return HeadConfig(hidden_size=t["hidden_size"], vocab_size=t["vocab_size"],
                      draft_vocab_size=draft_vocab or t["vocab_size"], intermediate_size=2 * t["hidden_size"],
                      num_attention_heads=2, num_key_value_heads=2, aux_layer_ids=aux or [1, 2, 3],
                      mask_token_id=mask_id, variant=variant, trained_depth=k,
                      fc_norm=variant == "depth", norm_output=variant == "depth", num_hidden_layers=layers)


def build_random_head(target: Path, out: Path, variant: str = "standard", k: int = 8,
                      draft_vocab: int | None = None, seed: int = 1, zero_lm_head: bool = False, layers: int = 1) -> Path:
    torch.manual_seed(seed)
    cfg = tiny_head_config(target, variant, k, draft_vocab, layers=layers)
    head = PEagleHead(cfg)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() > 1 and "norm" not in name:
                p.normal_(0, 0.2)
        if draft_vocab:
            head.set_vocab_map(torch.randperm(cfg.vocab_size)[:draft_vocab].sort().values)
        if zero_lm_head:
            head.lm_head.weight.zero_()
            if draft_vocab:
                head.set_vocab_map(torch.arange(draft_vocab))
    save_head(head, out, verifier=str(target))
    return out
