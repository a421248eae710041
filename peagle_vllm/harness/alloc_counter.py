"""Peak bytes of tensor storage allocated inside a block, counted op by op: exact and deterministic on CPU,
and under FakeTensorMode (shapes and dtypes, no data) at GPU sizes no CPU here could hold, e.g. a sampler's
[33 * 1024, 128256] logits, so a memory budget can be checked in a unit test.

Counted: the storage of every tensor an aten op returns that is neither an argument's storage nor one already
counted (a view or an in-place result adds nothing), from the op's return until the storage is freed (seen at
the next op). Not counted: storages made before the block (its inputs), and a kernel's own workspace.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _storages(tree) -> list[torch.UntypedStorage]:
    return [leaf.untyped_storage() for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


class AllocCounter(TorchDispatchMode):
    """`with AllocCounter() as c: ...` -> c.peak, the most bytes live at once, and c.live, the bytes still
    live now; enter it inside a FakeTensorMode to count without allocating."""

    def __init__(self) -> None:
        super().__init__()
        self._tracked: dict[int, tuple[StorageWeakRef, int]] = {}  # storage id -> (weak ref, bytes)
        self.live = 0
        self.peak = 0

    def _sweep(self) -> None:
        for key in [key for key, (ref, _) in self._tracked.items() if ref.expired()]:
            self.live -= self._tracked.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._sweep()
        kwargs = kwargs or {}
        inputs = {s._cdata for s in _storages((args, kwargs))}
        out = func(*args, **kwargs)
        for storage in _storages(out):
            key, size = storage._cdata, storage.nbytes()
            if key in self._tracked:  # an in-place op may have resized it (out= arguments)
                self.live += size - self._tracked[key][1]
                self._tracked[key] = (self._tracked[key][0], size)
            elif key not in inputs:
                self._tracked[key] = (StorageWeakRef(storage), size)
                self.live += size
        self.peak = max(self.peak, self.live)
        return out

    def __exit__(self, *exc) -> None:
        self._sweep()
        return super().__exit__(*exc)
