"""The per-step verify / draft / rollback functions never read a tensor's data back to the host (on a GPU each
such read is a device sync): they run to the end on FakeTensorMode tensors, which have shapes and dtypes but
no data, so `.item()`, `bool(t)`, `.tolist()`, `int(t)` and data-dependent output shapes (`t[mask]`,
`nonzero`) raise.

Seeded requests are left out: FakeTensorMode cannot draw with a torch.Generator ("generator is not supported
in refs"), so the tests run the unseeded path; the seeded one differs only by per-row draws from each
request's generator in a host loop over the generator dict (host data), with no read of tensor data.
Host-to-device copies of host data are not caught here (fake tensors all live on one device)."""

from __future__ import annotations

import pytest
import torch
from peagle_vllm.harness.fake_tensors import HOST_READS, on_fake
from peagle_vllm.proposer import sample_drafts
from peagle_vllm.rollback import beyond_capacity
from peagle_vllm.verify import target_probs, verify

B, K, V, VD = 4, 5, 30, 12


@pytest.mark.parametrize("read", [
    lambda t: bool((t > 0).any()), lambda t: t.sum().item(), lambda t: t.tolist(), lambda t: int(t.argmax()),
    lambda t: t[t > 0], lambda t: t.nonzero(),
    lambda t: t * 2 if bool((t < 1).any()) else t,  # the shape of the branches this file guards against
])
def test_the_harness_raises_on_every_host_read(read) -> None:
    with pytest.raises(HOST_READS):
        on_fake(read, torch.randn(3, 4))
    read(torch.randn(3, 4))  # the same read on real tensors is fine: the harness is what fails it


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K, V, generator=g) * 2
    num = torch.tensor([K, 3, 0, 1])
    drafts = torch.randint(0, V, (B, K), generator=g)
    drafts[torch.arange(K) >= num.unsqueeze(1)] = -1
    return dict(logits=logits, argmax=logits.argmax(-1), drafts=drafts, num=num,
                q=torch.randn(B, K, V, generator=g).softmax(-1), bonus=torch.randint(0, V, (B,), generator=g),
                temperature=torch.tensor([0.0, 0.7, 1.0, 1.3]))


def test_target_probs_with_every_option() -> None:
    n = B * K
    g = torch.Generator().manual_seed(1)
    probs = on_fake(target_probs, torch.randn(n, V, generator=g), torch.rand(n, generator=g),
                    torch.randint(-1, V + 2, (n,), generator=g), torch.rand(n, generator=g) + 0.2,
                    torch.rand(n, generator=g) * 0.2)
    assert probs.shape == (n, V) and probs.dtype == torch.float32


@pytest.mark.parametrize("mode", ["standard", "block"])
@pytest.mark.parametrize("draft_probs", ["sampled", "one-hot"])
def test_verify_mixed_batch(mode: str, draft_probs: str) -> None:
    x = _batch()
    probs = target_probs(x["logits"].view(-1, V), x["temperature"].repeat_interleave(K)).view(B, K, V)
    q = x["q"] if draft_probs == "sampled" else None
    res = on_fake(verify, mode, x["drafts"], x["num"], q, probs, x["argmax"], x["bonus"], x["temperature"] == 0)
    assert res.tokens.shape == (B, K + 1) and res.num_accepted.shape == (B,)


def test_verify_all_greedy_and_lossy() -> None:
    x = _batch()
    greedy = torch.ones(B, dtype=torch.bool)
    assert on_fake(verify, "auto", x["drafts"], x["num"], None, None, x["argmax"], x["bonus"], greedy).tokens.shape \
        == (B, K + 1)
    res = on_fake(verify, "auto", x["drafts"], x["num"], None, None, x["argmax"], x["bonus"], greedy, accept_k=3,
                  accept_tolerance=1.0, target_logits=x["logits"])
    assert res.tokens.shape == (B, K + 1)
    probs = target_probs(x["logits"].view(-1, V), x["temperature"].repeat_interleave(K)).view(B, K, V)
    res = on_fake(verify, "block", x["drafts"], x["num"], x["q"], probs, x["argmax"], x["bonus"],
                  x["temperature"] == 0, accept_k=3, accept_tolerance=1.0, target_logits=x["logits"])
    assert res.tokens.shape == (B, K + 1)


@pytest.mark.parametrize("sampled", [False, True])
def test_sample_drafts(sampled: bool) -> None:
    logits = torch.randn(B, K, VD, generator=torch.Generator().manual_seed(2))
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3]) if sampled else None
    top_k, top_p = (torch.tensor([VD, 3, 0, VD]), torch.tensor([1.0, 0.9, 0.5, 1.0])) if sampled else (None, None)
    ids, q = on_fake(sample_drafts, logits, torch.randperm(V)[:VD], temperature, None, V, top_k, top_p)
    assert ids.shape == (B, K) and (q is None) != sampled and (q is None or q.shape == (B, K, V))


def test_beyond_capacity() -> None:
    out = on_fake(beyond_capacity, torch.arange(12), torch.tensor([3, 4, 5]), torch.tensor([2, 8, 4]))
    assert out.shape == (12,) and out.dtype == torch.bool
