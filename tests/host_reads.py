"""Counting a computation's reads of tensor values back to the host: on a GPU each one waits for the device (a host
sync), so evaluation must make one per call, never one per batch. Counted on any device: torch's ops that turn a
tensor's values into Python numbers or shapes (`.item()`, `bool()`, `int()`, boolean-mask indexing, `nonzero`,
`unique`, ...) as they pass torch's dispatcher, and `Tensor.tolist` (which does not pass it)."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ops whose result (a number, or a tensor's shape) depends on the values: the host must wait for them
READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive",
         "unique_dim", "equal", "is_nonzero", "item", "repeat_interleave"}


class HostReads(TorchDispatchMode):
    """`with HostReads() as r: ...` then `r.reads`: the value reads made inside, by op name, in order."""

    def __enter__(self):
        self.reads: list[str] = []
        tolist = self._tolist = torch.Tensor.tolist

        def counted(t, *args, **kwargs):
            self.reads.append("tolist")
            return tolist(t, *args, **kwargs)

        torch.Tensor.tolist = counted
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        boolean_index = name == "index" and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (args[1] or []))
        if name in READS or boolean_index:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))
