"""Worker-side guard on `GPUModelRunner._sample` and `_bookkeeping_sync` (the CPU runner inherits them)
for seeded requests whose generator is a torch CPU generator (`runner_hook`'s `sample_tokens` calls
`restore_saved_generators` when the step is done).

A prompt prefilled in chunks samples a token after every chunk but the last, and vLLM discards it;
`_bookkeeping_sync` then rewinds the request's generator with `set_offset(get_offset() - 4)`, an
offset only Philox (CUDA) generators have. On vLLM's CPU backend that raises, and the engine (the
whole server, every request on it) dies on the first seeded sampled request with a long prompt,
with or without speculation. Here the state of each such CPU generator is saved before sampling,
vLLM's rewind is skipped for it, and the state is put back once the step's sampling and drafting
are done: the rewind vLLM means, and more (a discarded step leaves no trace in the seeded stream,
drafts included, so a seed gives the same tokens however the prompt was chunked). CUDA generators
are left to vLLM.
"""

from __future__ import annotations

import functools

import torch

SAVED_ATTR = "_peagle_discarded_generators"  # runner attribute: row -> (CPU generator, state before sampling)


def _discarded_cpu_generators(runner) -> dict[int, torch.Generator]:
    """Rows whose sampled token this step is discarded and whose generator lives on the CPU."""
    mask = getattr(runner, "discard_request_mask", None)  # vLLM 0.32's name; absent: nothing to guard
    if mask is None:
        return {}
    generators = runner.input_batch.generators
    if not generators:  # no seeded request in the batch (the common case): nothing to look up
        return {}
    rows = mask.np[:runner.input_batch.num_reqs].nonzero()[0].tolist()
    return {i: generators[i] for i in rows if i in generators and generators[i].device.type == "cpu"}


def wrap_sample(original):
    @functools.wraps(original)
    def _sample(self, *args, **kwargs):
        setattr(self, SAVED_ATTR, {i: (g, g.get_state()) for i, g in _discarded_cpu_generators(self).items()})
        return original(self, *args, **kwargs)

    return _sample


def wrap_bookkeeping_sync(original):
    @functools.wraps(original)
    def _bookkeeping_sync(self, *args, **kwargs):
        """vLLM's bookkeeping without its rewind of the saved generators (out of its sight meanwhile)."""
        generators = self.input_batch.generators
        held_back = {i: generators.pop(i) for i in getattr(self, SAVED_ATTR, None) or {} if i in generators}
        try:
            return original(self, *args, **kwargs)
        finally:
            generators.update(held_back)

    return _bookkeeping_sync


def restore_saved_generators(runner) -> None:
    """After the step's sampling and drafting: the saved generators back where they stood."""
    saved = getattr(runner, SAVED_ATTR, None)
    if saved is None:  # the step sampled nothing on the CPU path, or no seeded request was discarded
        return
    for generator, state in saved.values():
        generator.set_state(state)
    setattr(runner, SAVED_ATTR, None)
