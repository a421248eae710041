"""Run a function on fake tensors (shapes and dtypes, no data): any read of tensor data on the host raises,
which is how the tests prove a per-step path free of device syncs."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

HOST_READS = (DataDependentOutputException, DynamicOutputShapeException)  # what a host read raises there


def on_fake(fn, *args, mode: FakeTensorMode | None = None, **kwargs):
    """fn(*args, **kwargs) with each tensor argument replaced by a fake copy, under `mode` (a new one if None)."""
    mode = mode or FakeTensorMode()

    def fake(x):
        return mode.from_tensor(x) if isinstance(x, torch.Tensor) else x

    with mode:
        return fn(*map(fake, args), **{key: fake(value) for key, value in kwargs.items()})
