"""Counting a computation's reads of tensor values back to the host: on a GPU each one waits for the device (a host
sync), so evaluation must make one per call, never one per batch. Counted: torch's ops that turn a tensor's values
into Python numbers or shapes (`.item()`, `bool()`, `int()`, boolean-mask indexing and assignment, `nonzero`,
`unique`, `bincount`, ...) as they pass torch's dispatcher; a copy from another device to the CPU (`.cpu()`, `.to`;
on a CPU there is none to see); and `Tensor.tolist`, `Tensor.numpy` and `np.asarray(tensor)`, which do not pass the
dispatcher. Only in this thread (the dispatch mode's); the three methods are patched on `torch.Tensor` while inside."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ops whose result (a number, or a tensor's shape) depends on the values: the host must wait for them
READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive",
         "unique_dim", "equal", "is_nonzero", "item", "repeat_interleave", "bincount"}
METHODS = ("tolist", "numpy", "__array__")


def boolean(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or [])


class HostReads(TorchDispatchMode):
    """`with HostReads() as r: ...` then `r.reads`: the value reads made inside, by op or method name, in order."""

    def __enter__(self):
        self.reads: list[str] = []
        mode = super().__enter__()
        self._saved = {name: torch.Tensor.__dict__.get(name) for name in METHODS}  # None: inherited
        for name in METHODS:
            setattr(torch.Tensor, name, self._counted(name, getattr(torch.Tensor, name)))
        return mode

    def _counted(self, name, method):
        def counted(t, *args, **kwargs):
            self.reads.append(name)
            return method(t, *args, **kwargs)
        return counted

    def __exit__(self, *exc):
        for name, saved in self._saved.items():
            if saved is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, saved)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name == "_to_copy":  # x.to("cpu"), x.cpu(): from another device
            device = kwargs.get("device")
            to_host = device is not None and torch.device(device).type == "cpu" and args[0].device.type != "cpu"
        elif name == "copy_":  # cpu_tensor.copy_(device_tensor)
            to_host = args[0].device.type == "cpu" and args[1].device.type != "cpu"
        else:
            to_host = False
        if name in READS or to_host or (name in ("index", "index_put", "index_put_") and boolean(args[1])):
            self.reads.append(name)
        return func(*args, **kwargs)
