"""Staging buffers for expert-parallel MegaMoE: one byte allocation per rank holding every
output of a staging call, as plain memory or as PyTorch symmetric memory.

In expert-parallel MegaMoE each rank stages its own tokens into its buffers and the peers'
kernels read them over NVLink, so the buffers have the symmetric buffer's ``max_tokens``
rows (stage with ``full_buffer=True``) and every rank lays them out identically.
:func:`staging_layout` fixes that layout from :func:`megamoe.output_shapes` (the one shape
rule): each output at an aligned byte offset of one allocation. :func:`alloc_staging_buffers`
allocates it (by default with torch when it is installed, else with NumPy) and returns
this rank's views; with ``allocator="symmetric"``
(``torch.distributed._symmetric_memory.empty`` + ``rendezvous``) ``peer(rank)`` returns the
same views of another rank's buffer (``get_buffer`` at the same offsets), so a peer reads
exactly the bytes the owner staged.

Importing this module needs neither torch nor NumPy; each allocator imports what it uses.
A size no allocator can serve is the documented ValueError naming its bytes.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from ._args import allocate, optional_int
from ._ops import ITEMSIZE as _ITEMSIZE
from ._ops import TensorSpec, _numpy_dtype, output_shapes
from ._scheme import MXFP8

__all__ = ["StagingField", "StagingLayout", "StagingBuffers", "staging_layout", "alloc_staging_buffers", "FIELDS"]

#: The outputs a staging call writes, by their prepare_megamoe_inputs argument names, in
#: layout order (the OutputShapes field of each is the same name).
FIELDS = ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf", "x_scales")


class StagingField(NamedTuple):
    """One output inside the allocation: its name, shape / dtype and byte offset."""

    name: str
    spec: TensorSpec
    offset: int

    @property
    def nbytes(self) -> int:
        n = _ITEMSIZE[self.spec.dtype]
        for d in self.spec.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.spec.dtype]


class StagingLayout(NamedTuple):
    """Where each output of a staging call lives in one byte allocation. Every rank that
    computes the layout from the same arguments gets the same offsets, which is what lets a
    peer reinterpret another rank's bytes."""

    fields: tuple
    """The present outputs (StagingField), in FIELDS order."""
    nbytes: int
    """Size of the allocation (the end of the last field, rounded up to ``align``)."""
    align: int
    max_tokens: int
    shared_block_m: Optional[int]

    def field(self, name: str) -> Optional[StagingField]:
        for f in self.fields:
            if f.name == name:
                return f
        return None


def staging_layout(max_tokens: int, hidden: int, top_k: int, scheme: Any = MXFP8,
                   shared_block_m: Optional[int] = None, *, align: int = 256) -> StagingLayout:  # fmt: skip
    """The layout of every output of staging up to ``max_tokens`` tokens of hidden size
    ``hidden`` with top-``top_k`` routing under ``scheme``: shapes and dtypes from
    :func:`megamoe.output_shapes` (``T = max_tokens``, the full-buffer row count; the
    shared-expert scale copy for ``shared_block_m`` when given), each at a byte offset that
    is a multiple of ``align`` (a power of two, at least 8: every element is then aligned,
    whatever its dtype, and so are the kernels' vector accesses).

    Raises:
        ValueError: as output_shapes (an int argument outside int64 included: the message
            names it), or ``align`` not a power of two >= 8.
        TypeError: as output_shapes.
    """
    a = optional_int(align, "align")
    if a is None or a < 8 or a & (a - 1):
        raise ValueError(f"megamoe.buffers: align: expected a power of two >= 8, got {align!r}")
    M = optional_int(max_tokens, "max_tokens")
    if M is None:
        raise TypeError("megamoe.buffers: max_tokens: expected an int, got None")
    # Named as this function names them (output_shapes would say H and K).
    shapes = output_shapes(M, optional_int(hidden, "hidden"), optional_int(top_k, "top_k"), scheme,
                           optional_int(shared_block_m, "shared_block_m"))  # fmt: skip
    fields, offset = [], 0
    for name in FIELDS:
        spec = getattr(shapes, name)
        if spec is None:
            continue
        f = StagingField(name, spec, offset)
        fields.append(f)
        offset += -(-f.nbytes // a) * a
    return StagingLayout(tuple(fields), max(offset, a), a, M, optional_int(shared_block_m, "shared_block_m"))


class StagingBuffers(NamedTuple):
    """This rank's staging outputs (views of one allocation, laid out by ``layout``), named
    as prepare_megamoe_inputs names them; absent ones are None. ``outputs()`` gives them as
    that call's keyword arguments."""

    x_fp8: Any
    x_sf: Any
    topk_idx_out: Any
    topk_weights_out: Any
    shared_x_sf: Any
    x_scales: Any
    storage: Any
    """The allocation: a 1-D uint8 tensor (or NumPy array) of ``layout.nbytes`` bytes."""
    layout: StagingLayout
    handle: Any = None
    """The symmetric-memory handle (``rendezvous``'s result) for ``allocator="symmetric"``,
    else None."""
    rank: int = 0

    def outputs(self) -> dict:
        """The outputs as prepare_megamoe_inputs keyword arguments (``shared_block_m`` with
        ``shared_x_sf``; no full_buffer: pass ``full_buffer=True`` yourself)."""
        out = {f.name: getattr(self, f.name) for f in self.layout.fields}
        if self.shared_x_sf is not None:
            out["shared_block_m"] = self.layout.shared_block_m
        return out

    def tensors(self) -> dict:
        """name -> view of every present output."""
        return {f.name: getattr(self, f.name) for f in self.layout.fields}

    def peer(self, rank: int) -> "StagingBuffers":
        """The same views of ``rank``'s buffers: for symmetric memory, tensors on this
        rank's device whose memory is ``rank``'s (``handle.get_buffer`` at this layout's
        offsets, no copy), ``storage`` included (all of ``rank``'s bytes);
        ``peer(self.rank)`` is this buffer set.

        Raises:
            ValueError: another rank's buffers of an allocation that is not symmetric
                memory, or a rank outside the group.
        """
        r = optional_int(rank, "rank")
        if r == self.rank:
            return self
        if self.handle is None:
            raise ValueError(
                f"megamoe.buffers: peer({rank}): these buffers are not symmetric memory "
                "(allocate them with allocator='symmetric' to read another rank's)"
            )
        if r is None or not 0 <= r < self.handle.world_size:
            raise ValueError(f"megamoe.buffers: peer({rank}): expected a rank in [0, {self.handle.world_size})")
        import torch

        storage = self.handle.get_buffer(r, (self.layout.nbytes,), torch.uint8, _handle_offset(self.handle))
        return self._replace(**_symmetric_views(self.handle, r, self.layout), storage=storage, rank=r)


def _torch_or_none() -> Any:
    """The torch module, or None when torch is not installed (``allocator=None`` then
    allocates with NumPy). A torch that is installed but fails to import raises: falling
    back to NumPy would hide it."""
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        return None
    return torch


def _dtype(torch: Any, name: str) -> Any:
    """The dtype of an output dtype name: torch's (``torch`` the module) or, with ``torch``
    None, NumPy's (fp8 as uint8 bytes), as megamoe.stage allocates them."""
    if torch is None:
        return _numpy_dtype(name)
    from ._torch import _TORCH_DTYPES

    return _TORCH_DTYPES[name]


def _views(storage: Any, layout: StagingLayout, torch: Any) -> dict:
    """name -> view of ``storage`` (1-D bytes) per the layout, None for absent outputs."""
    out = dict.fromkeys(FIELDS)
    for f in layout.fields:
        raw = storage[f.offset : f.offset + f.nbytes].view(_dtype(torch, f.spec.dtype))
        out[f.name] = raw.view(f.spec.shape) if torch is not None else raw.reshape(f.spec.shape)
    return out


def _version(v: str) -> tuple:
    """(major, minor) of a version string such as "2.11.0+cu130"."""
    parts = v.split("+")[0].split(".")
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts[:2])


def _handle_offset(handle: Any) -> int:
    # Byte offset of the rendezvoused tensor inside the symmetric allocation that
    # get_buffer addresses (nonzero when the tensor is not the start of its block, e.g.
    # from the implicit memory pool); builds without the attribute map tensor == block.
    return int(getattr(handle, "offset", 0) or 0)


def _symmetric_views(handle: Any, rank: int, layout: StagingLayout) -> dict:
    import torch

    base = _handle_offset(handle)
    out = dict.fromkeys(FIELDS)
    for f in layout.fields:
        byte = base + f.offset
        if byte % f.itemsize:  # pragma: no cover - align >= 8 and a handle offset of whole words
            raise ValueError(f"megamoe.buffers: {f.name}: byte offset {byte} is not a multiple of {f.itemsize}")
        out[f.name] = handle.get_buffer(rank, f.spec.shape, _dtype(torch, f.spec.dtype), byte // f.itemsize)
    return out


def alloc_staging_buffers(
    max_tokens: int,
    hidden: int,
    top_k: int,
    scheme: Any = MXFP8,
    shared_block_m: Optional[int] = None,
    *,
    device: Any = "cpu",
    allocator: Optional[str] = None,
    group: Any = None,
    align: int = 256,
) -> StagingBuffers:
    """Allocate the outputs of staging up to ``max_tokens`` tokens (see
    :func:`staging_layout`) in one allocation and return this rank's views of it.

    ``allocator``:

    * ``None`` (default): ``"torch"`` when torch is installed, else ``"numpy"`` (so a
      NumPy-only install allocates on the CPU without naming an allocator; another
      ``device`` then needs torch, and the ValueError says so);
    * ``"torch"``: ``torch.empty`` on ``device``;
    * ``"numpy"``: a NumPy array (CPU only; fp8 values as uint8 bytes, as megamoe.stage
      gives them to NumPy);
    * ``"symmetric"``: PyTorch symmetric memory on a CUDA ``device``:
      ``torch.distributed._symmetric_memory.empty`` then ``rendezvous`` over ``group`` (a
      ProcessGroup or a group name; default the world group). A collective: every rank of
      the group calls it with the same arguments. ``peer(rank)`` then returns views of any
      rank's buffers, ``handle`` is the rendezvous handle (``barrier``, ``put_signal``,
      ``wait_signal`` order staging and reading across ranks).

    Nothing is initialised (fill ``storage`` when you need known bytes); stage with
    ``prepare_megamoe_inputs(..., **bufs.outputs(), full_buffer=True)``. An eager-time
    call: allocation and rendezvous synchronise the host (not inside a CUDA graph or a
    torch.compile region).

    Raises:
        ValueError: as :func:`staging_layout`, an unknown allocator, NumPy with a device
            other than the CPU (with ``allocator=None``: a device other than the CPU without
            torch installed), symmetric memory off CUDA, or an allocation that cannot be
            made (the message gives its bytes; the allocator's MemoryError / RuntimeError
            is chained).
        TypeError: as :func:`staging_layout`.
        ModuleNotFoundError: ``allocator="torch"`` or ``"symmetric"`` without torch.
    """
    layout = staging_layout(max_tokens, hidden, top_k, scheme, shared_block_m, align=align)
    torch = None
    if allocator is None:
        torch = _torch_or_none()
        if torch is None and str(device) != "cpu":
            raise ValueError(
                f"megamoe.buffers: device {device!r} needs torch, which is not installed "
                "(without torch, allocator=None allocates with NumPy, on the CPU only)"
            )
        allocator = "numpy" if torch is None else "torch"
    what = f"the staging buffers of {layout.max_tokens} tokens"
    if allocator == "numpy":
        if str(device) != "cpu":
            raise ValueError(f"megamoe.buffers: allocator='numpy' allocates on the CPU, got device {device!r}")
        import numpy as np

        storage = allocate("megamoe.buffers", what + " on the CPU (NumPy)", layout.nbytes,
                           lambda: np.empty(layout.nbytes, np.uint8))  # fmt: skip
        return StagingBuffers(**_views(storage, layout, None), storage=storage, layout=layout)
    if allocator not in ("torch", "symmetric"):
        raise ValueError(f"megamoe.buffers: allocator: expected 'torch', 'numpy' or 'symmetric', got {allocator!r}")
    if torch is None:
        import torch

    dev = torch.device(device)
    if allocator == "torch":
        storage = allocate("megamoe.buffers", f"{what} on {dev}", layout.nbytes,
                           lambda: torch.empty(layout.nbytes, dtype=torch.uint8, device=dev))  # fmt: skip
        return StagingBuffers(**_views(storage, layout, torch), storage=storage, layout=layout)
    if dev.type != "cuda":
        raise ValueError(f"megamoe.buffers: allocator='symmetric' needs a CUDA device, got {dev}")
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    if group is None:
        group = dist.group.WORLD
    name = group if isinstance(group, str) else group.group_name
    # Before 2.11 rendezvous finds a group's store only once the group was registered;
    # 2.11 resolves it itself and deprecates the registration.
    if _version(torch.__version__) < (2, 11):
        symm_mem.enable_symm_mem_for_group(name)
    storage = allocate("megamoe.buffers", f"{what} in symmetric memory on {dev}", layout.nbytes,
                       lambda: symm_mem.empty(layout.nbytes, dtype=torch.uint8, device=dev))  # fmt: skip
    handle = symm_mem.rendezvous(storage, name)
    bufs = StagingBuffers(**_views(storage, layout, torch), storage=storage, layout=layout, handle=handle,
                          rank=handle.rank)  # fmt: skip
    # The peer views assume get_buffer(rank) addresses what `storage` is for this rank; a
    # build where it does not would make every peer read the wrong bytes, so say it now.
    mine = _symmetric_views(handle, handle.rank, layout)
    for f in layout.fields:
        if mine[f.name].data_ptr() != getattr(bufs, f.name).data_ptr():
            raise RuntimeError(
                f"megamoe.buffers: {f.name}: the symmetric handle's view of this rank starts at "
                f"{mine[f.name].data_ptr():#x}, the allocation's at {getattr(bufs, f.name).data_ptr():#x}"
            )
    return bufs
