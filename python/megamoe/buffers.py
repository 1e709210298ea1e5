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

DeepGEMM's own MegaMoE buffer (one symmetric allocation holding the kernel's workspace,
its inputs and its scratch) is laid out by :func:`deepgemm_layout` (the library's
``megamoe::deepgemm::buffer_layout``, docs/BUFFERS.md) and allocated, with DeepGEMM's views,
by :func:`alloc_deepgemm_buffer`; ``prepare_megamoe_inputs(h, w, ids,
**buf.outputs(num_tokens))`` then stages straight into its input views.

Importing this module needs neither torch nor NumPy; each allocator imports what it uses.
A size no allocator can serve is the documented ValueError naming its bytes.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from . import _C
from ._args import allocate, optional_int
from ._ops import ITEMSIZE as _ITEMSIZE
from ._ops import TensorSpec, _numpy_dtype, output_shapes
from ._scheme import FP8_FP32_G128, MXFP8, NVFP4_STATIC

__all__ = [
    "StagingField",
    "StagingLayout",
    "StagingBuffers",
    "staging_layout",
    "alloc_staging_buffers",
    "FIELDS",
    "DeepGEMMRegion",
    "DeepGEMMLayout",
    "DeepGEMMBuffer",
    "deepgemm_layout",
    "deepgemm_block_m",
    "alloc_deepgemm_buffer",
    "deepgemm_views",
    "DEEPGEMM_VARIANTS",
    "DEEPGEMM_MMA_TYPES",
]

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
        storage = _peer_storage(self.handle, rank, self.layout.nbytes, "these buffers are", "them")
        return self._replace(**_symmetric_views(self.handle, r, self.layout), storage=storage, rank=r)


def _peer_storage(handle: Any, rank: Any, nbytes: int, what: str, it: str) -> Any:
    """All ``nbytes`` of another rank's symmetric allocation (``handle.get_buffer``), after
    the checks peer() makes: symmetric memory (``what`` / ``it`` name the allocation in the
    message) and a rank of the group."""
    r = optional_int(rank, "rank")
    if handle is None:
        raise ValueError(
            f"megamoe.buffers: peer({rank}): {what} not symmetric memory "
            f"(allocate {it} with allocator='symmetric' to read another rank's)"
        )
    if r is None or not 0 <= r < handle.world_size:
        raise ValueError(f"megamoe.buffers: peer({rank}): expected a rank in [0, {handle.world_size})")
    import torch

    return handle.get_buffer(r, (nbytes,), torch.uint8, _handle_offset(handle))


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


def _allocator(allocator: Optional[str], device: Any) -> tuple:
    """(allocator, torch module or None, torch device or None) of an allocator argument:
    None is "torch" when torch is installed, else "numpy"; NumPy allocates on the CPU
    only, symmetric memory on CUDA only."""
    torch = None
    if allocator is None:
        torch = _torch_or_none()
        if torch is None and str(device) != "cpu":
            raise ValueError(
                f"megamoe.buffers: device {device!r} needs torch, which is not installed "
                "(without torch, allocator=None allocates with NumPy, on the CPU only)"
            )
        allocator = "numpy" if torch is None else "torch"
    if allocator == "numpy":
        if str(device) != "cpu":
            raise ValueError(f"megamoe.buffers: allocator='numpy' allocates on the CPU, got device {device!r}")
        return allocator, None, None
    if allocator not in ("torch", "symmetric"):
        raise ValueError(f"megamoe.buffers: allocator: expected 'torch', 'numpy' or 'symmetric', got {allocator!r}")
    if torch is None:
        import torch
    dev = torch.device(device)
    if allocator == "symmetric" and dev.type != "cuda":
        raise ValueError(f"megamoe.buffers: allocator='symmetric' needs a CUDA device, got {dev}")
    return allocator, torch, dev


def _allocate_bytes(allocator: str, torch: Any, dev: Any, what: str, nbytes: int, zero: bool) -> Any:
    """``nbytes`` bytes (1-D uint8) of NumPy (``allocator`` "numpy") or torch on ``dev``."""
    if allocator == "numpy":
        import numpy as np

        make = np.zeros if zero else np.empty
        return allocate("megamoe.buffers", what + " on the CPU (NumPy)", nbytes, lambda: make(nbytes, np.uint8))
    make = torch.zeros if zero else torch.empty
    return allocate("megamoe.buffers", f"{what} on {dev}", nbytes, lambda: make(nbytes, dtype=torch.uint8, device=dev))


def _symmetric_group(group: Any) -> Any:
    """The group of a symmetric allocation: ``group``, or the world group."""
    if group is not None:
        return group
    import torch.distributed as dist

    return dist.group.WORLD


def _allocate_symmetric(torch: Any, dev: Any, group: Any, what: str, nbytes: int) -> tuple:
    """(storage, handle): ``nbytes`` bytes of symmetric memory on ``dev``, rendezvoused over
    ``group`` (a ProcessGroup or a group name). A collective."""
    import torch.distributed._symmetric_memory as symm_mem

    name = group if isinstance(group, str) else group.group_name
    # Before 2.11 rendezvous finds a group's store only once the group was registered;
    # 2.11 resolves it itself and deprecates the registration.
    if _version(torch.__version__) < (2, 11):
        symm_mem.enable_symm_mem_for_group(name)
    storage = allocate("megamoe.buffers", f"{what} in symmetric memory on {dev}", nbytes,
                       lambda: symm_mem.empty(nbytes, dtype=torch.uint8, device=dev))  # fmt: skip
    return storage, symm_mem.rendezvous(storage, name)


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
    allocator, torch, dev = _allocator(allocator, device)
    what = f"the staging buffers of {layout.max_tokens} tokens"
    if allocator != "symmetric":
        storage = _allocate_bytes(allocator, torch, dev, what, layout.nbytes, zero=False)
        return StagingBuffers(**_views(storage, layout, torch), storage=storage, layout=layout)
    storage, handle = _allocate_symmetric(torch, dev, _symmetric_group(group), what, layout.nbytes)
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


# ---------------------------------------------------------------------------------------
# DeepGEMM's MegaMoE buffer

#: DeepGEMM's MegaMoE buffers: Hopper FP8 (``get_symm_buffer_for_sm90_mega_moe``),
#: Blackwell (``get_symm_buffer_for_mega_moe``, shared experts, the ring sized from the SM
#: count) and the earlier Blackwell ring layout (a caller-chosen ring, no shared experts).
DEEPGEMM_VARIANTS = ("sm90_fp8", "sm100", "sm100_ring")
#: DeepGEMM's ``mma_type`` values (activations x weights).
DEEPGEMM_MMA_TYPES = ("fp8xfp4", "fp8xfp8", "bf16xbf16", "fp4xfp4")

#: The views DeepGEMM's buffer objects hand out, in their order (SymmBuffer's twelve;
#: SM90SymmBuffer has those without ``shared_``).
DEEPGEMM_VIEWS = (
    "x", "x_sf", "topk_idx", "topk_weights",
    "shared_l1_acts", "shared_l1_acts_sf", "shared_l2_acts", "shared_l2_acts_sf",
    "l1_acts", "l1_acts_sf", "l2_acts", "l2_acts_sf",
)  # fmt: skip

# DeepGEMM's SM90 pre-dispatch (and SGLang's) floors amax at 1e-10 (docs/CONTRACT.md).
_SM90_SCHEME = FP8_FP32_G128.with_amax_floor(1e-10)


class DeepGEMMRegion(NamedTuple):
    """One region of DeepGEMM's buffer: its view's dtype name, shape and element strides
    ((1, rows) for the MN-major scale views), ``role`` "input" (staging fills it) or
    "scratch" (the kernel's), and whether DeepGEMM's buffer object hands out its tensor
    (``sliced``; not the workspace, the combine buffer and the top-k weight side buffers)."""

    name: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple
    strides: tuple
    role: str
    sliced: bool


class DeepGEMMLayout(NamedTuple):
    """DeepGEMM's MegaMoE symmetric buffer for one configuration (:func:`deepgemm_layout`):
    the arguments, the aligned token count and pool / ring sizes, and every region in
    DeepGEMM's order, tiling ``[0, nbytes)``."""

    variant: str
    num_ranks: int
    num_experts: int
    num_max_tokens_per_rank: int
    num_topk: int
    hidden: int
    intermediate_hidden: int
    num_shared_experts: int
    mma_type: str
    activation: str
    num_sms: Optional[int]
    token_alignment: int
    num_max_tokens: int
    """T: ``num_max_tokens_per_rank`` aligned up, the rows of every input view."""
    num_max_pool_tokens: int
    num_ring_tokens: int
    num_sf_ring_tokens: int
    num_shared_sf_tokens: int
    workspace_bytes: int
    nbytes: int
    regions: tuple

    def region(self, name: str) -> Optional[DeepGEMMRegion]:
        for r in self.regions:
            if r.name == name:
                return r
        return None

    def inputs(self) -> tuple:
        """The regions staging fills."""
        return tuple(r for r in self.regions if r.role == "input")

    @property
    def scheme(self) -> Any:
        """The QuantScheme whose outputs are this buffer's ``x`` / ``x_sf`` layout: SM90 FP8
        ``FP8_FP32_G128`` with DeepGEMM's SM90 pre-dispatch floor 1e-10 (DeepGEMM's own SM90
        test casts with 1e-4: ``megamoe.FP8_FP32_G128``), fp8xfp4 / fp8xfp8 MXFP8, fp4xfp4
        NVFP4 static (pass ``global_scale=``); None for bf16xbf16, whose ``x`` is no
        quantization (copy the hidden states, stage the routing with
        :meth:`DeepGEMMBuffer.routing_outputs`)."""
        if self.variant == "sm90_fp8":
            return _SM90_SCHEME
        return {"fp8xfp4": MXFP8, "fp8xfp8": MXFP8, "fp4xfp4": NVFP4_STATIC}.get(self.mma_type)

    def block_m(self, num_tokens: int) -> Optional[int]:
        """DeepGEMM's block M for a call of ``num_tokens`` tokens (sm100; None for the
        others): the ``shared_block_m`` of that call's ``shared_l1_acts_sf``."""
        if self.variant != "sm100":
            return None
        return deepgemm_block_m(self.num_ranks, self.num_experts, self.num_max_tokens, num_tokens, self.num_topk,
                                self.mma_type)  # fmt: skip


def _str_arg(value: Any, name: str, choices: tuple) -> str:
    if not isinstance(value, str):
        raise TypeError(f"megamoe.buffers: {name}: expected a str (one of {', '.join(choices)}), got {type(value).__name__}")
    return value


def _int_arg(value: Any, name: str) -> int:
    v = optional_int(value, name)
    if v is None:
        raise TypeError(f"megamoe.buffers: {name}: expected an int, got None")
    return v


def _mma_type(variant: str, mma_type: Optional[str]) -> str:
    """The mma type a variant reads: SM90 FP8 is FP8 x FP8 only (None or 'fp8xfp8')."""
    if variant == "sm90_fp8":
        if mma_type not in (None, "fp8xfp8"):
            raise ValueError(f"megamoe.buffers: mma_type: expected None or 'fp8xfp8' for variant 'sm90_fp8' (FP8 x FP8 only), got {mma_type!r}")
        return "fp8xfp8"
    return _str_arg("fp8xfp4" if mma_type is None else mma_type, "mma_type", DEEPGEMM_MMA_TYPES)


def deepgemm_layout(
    variant: str,
    num_experts: int,
    num_max_tokens_per_rank: int,
    num_topk: int,
    hidden: int,
    intermediate_hidden: int,
    *,
    num_ranks: int = 1,
    num_shared_experts: int = 0,
    mma_type: Optional[str] = None,
    activation: str = "swiglu",
    num_sms: Optional[int] = None,
    num_ring_tokens: Optional[int] = None,
) -> DeepGEMMLayout:
    """DeepGEMM's MegaMoE symmetric buffer (``megamoe::deepgemm::buffer_layout``): the
    arguments of DeepGEMM's ``get_symm_buffer_for_mega_moe`` /
    ``get_symm_buffer_for_sm90_mega_moe`` (``num_ranks`` for its group's size) and the
    variant (:data:`DEEPGEMM_VARIANTS`).

    ``mma_type`` (:data:`DEEPGEMM_MMA_TYPES`; default ``'fp8xfp4'``): sm100 takes all four,
    sm100_ring fp8xfp4 or bf16xbf16, sm90_fp8 none (it is FP8 x FP8). ``num_sms`` (sm100,
    required): the SM count DeepGEMM's kernel runs on, from which it sizes the ring.
    ``num_ring_tokens`` (sm100_ring): the ring, default the one DeepGEMM's Python picks.
    ``num_shared_experts``: sm100 only.

    Raises:
        ValueError: every precondition DeepGEMM asserts, naming the argument and the rule
            (and a size past its 32-bit integers), an unknown variant / mma_type /
            activation, an int outside int64, num_sms missing for sm100.
        TypeError: a non-int count or non-str name.
    """
    variant = _str_arg(variant, "variant", DEEPGEMM_VARIANTS)
    mma = _mma_type(variant, mma_type)
    act = _str_arg(activation, "activation", ("swiglu", "situ"))
    sms = optional_int(num_sms, "num_sms")
    if variant == "sm100" and sms is None:
        raise ValueError(
            "megamoe.buffers: num_sms: expected the SM count DeepGEMM's kernel runs on for variant 'sm100' "
            "(DeepGEMM sizes the ring from it: the device's, or what deep_gemm.set_num_sms set), got None"
        )
    ring = optional_int(num_ring_tokens, "num_ring_tokens")
    ints = [_int_arg(v, n) for v, n in (
        (num_ranks, "num_ranks"), (num_experts, "num_experts"), (num_max_tokens_per_rank, "num_max_tokens_per_rank"),
        (num_topk, "num_topk"), (hidden, "hidden"), (intermediate_hidden, "intermediate_hidden"),
        (num_shared_experts, "num_shared_experts"),
    )]  # fmt: skip
    d = _C.deepgemm_buffer_layout(variant, *ints, "fp8xfp4" if variant == "sm90_fp8" else mma, act,
                                  0 if sms is None else sms, 0 if ring is None else ring)  # fmt: skip
    regions = tuple(DeepGEMMRegion(*r) for r in d.pop("regions"))
    R, E, T, K, H, IH, S = ints
    return DeepGEMMLayout(variant, R, E, T, K, H, IH, S, mma, act, sms, regions=regions, **d)


def deepgemm_block_m(num_ranks: int, num_experts: int, num_max_tokens_per_rank: int, num_tokens: int, num_topk: int,
                     mma_type: str = "fp8xfp4") -> int:  # fmt: skip
    """DeepGEMM's ``get_block_m_for_mega_moe`` (``megamoe::deepgemm::block_m``): the block M
    of a Blackwell MegaMoE call of ``num_tokens`` tokens, which orders the rows of that
    call's ``shared_l1_acts_sf`` (``shared_block_m`` of prepare_megamoe_inputs).

    Raises:
        ValueError: num_ranks or num_experts < 1, a negative count, an argument beyond
            int32, an unknown mma_type.
    """
    args = [_int_arg(v, n) for v, n in (
        (num_ranks, "num_ranks"), (num_experts, "num_experts"), (num_max_tokens_per_rank, "num_max_tokens_per_rank"),
        (num_tokens, "num_tokens"), (num_topk, "num_topk"),
    )]  # fmt: skip
    return _C.deepgemm_block_m(*args, _str_arg(mma_type, "mma_type", DEEPGEMM_MMA_TYPES))


def _region_dtype(torch: Any, name: str) -> Any:
    """A region's element dtype: torch's, or NumPy's (fp8 as uint8 bytes, bf16 as uint16 bits)."""
    if torch is not None:
        return getattr(torch, name)
    import numpy as np

    return {"bfloat16": np.uint16}.get(name) or _numpy_dtype(name)


def _deepgemm_views(storage: Any, layout: DeepGEMMLayout, torch: Any) -> dict:
    """name -> view of ``storage`` (the buffer's bytes, 1-D) for every region."""
    out = {}
    for r in layout.regions:
        flat = storage[r.offset : r.offset + r.nbytes].view(_region_dtype(torch, r.dtype))
        if torch is not None:
            out[r.name] = flat.as_strided(r.shape, r.strides)
        else:
            import numpy as np

            item = flat.dtype.itemsize
            out[r.name] = np.lib.stride_tricks.as_strided(flat, r.shape, tuple(s * item for s in r.strides))
    return out


class DeepGEMMBuffer:
    """DeepGEMM's MegaMoE buffer, allocated (:func:`alloc_deepgemm_buffer`): ``storage``
    (the bytes, 1-D uint8), ``layout`` and DeepGEMM's views as attributes
    (:data:`DEEPGEMM_VIEWS`; None where DeepGEMM's are undefined: ``x_sf`` of bf16xbf16,
    ``shared_*`` without shared experts or outside sm100, ``shared_l1_acts`` of NVFP4,
    whose shared experts read the caller's ``x_bf16``). ``shared_l1_acts`` is ``x``, as in
    DeepGEMM. ``views`` has every region, the workspace and the combine buffer too.
    """

    def __init__(self, storage: Any, layout: DeepGEMMLayout, torch: Any, handle: Any = None, rank: int = 0) -> None:
        self.storage = storage
        self.layout = layout
        self.handle = handle
        """The symmetric-memory handle for ``allocator="symmetric"``, else None."""
        self.rank = rank
        self._torch = torch
        self.views = _deepgemm_views(storage, layout, torch)
        for name in DEEPGEMM_VIEWS:
            setattr(self, name, self.views.get(name))
        if layout.variant == "sm100" and layout.mma_type != "fp4xfp4":
            self.shared_l1_acts = self.x

    def outputs(self, num_tokens: Optional[int] = None, *, scheme: Any = None) -> dict:
        """prepare_megamoe_inputs' keyword arguments that stage a call of ``num_tokens``
        tokens into this buffer: ``x_fp8`` / ``x_sf`` / ``topk_idx_out`` /
        ``topk_weights_out`` (the input views, every row: ``full_buffer=True``, the top-k
        tail -1 / 0 up to the aligned T), ``hidden_quant`` (``scheme``, default
        ``layout.scheme``) and, with shared experts (sm100 fp8xfp4 / fp8xfp8),
        ``shared_x_sf`` = ``shared_l1_acts_sf`` with ``shared_block_m`` = DeepGEMM's block M
        for ``num_tokens`` (required then). NVFP4 (fp4xfp4) also needs ``global_scale=``.

        Raises:
            ValueError: bf16xbf16 (its ``x`` is a copy, not a quantization: use
                :meth:`routing_outputs`), num_tokens missing where shared experts need it,
                or a scheme with per-token scales (DeepGEMM's buffer has no place for
                ``x_scales``).
        """
        lay = self.layout
        q = lay.scheme if scheme is None else scheme
        if q is None or self.x_sf is None:
            raise ValueError(
                f"megamoe.buffers: mma_type {lay.mma_type!r}: DeepGEMM's x is bf16, a copy of the hidden states "
                "(no quantization to stage): copy them into buf.x and stage the routing with "
                "stage_megamoe_routing(w, ids, **buf.routing_outputs())"
            )
        from ._scheme import as_scheme

        if as_scheme(q).scale2 == _C.Scale2.PER_TOKEN:
            raise ValueError(
                "megamoe.buffers: scheme: NVFP4 per-token writes x_scales, for which DeepGEMM's buffer has no "
                "region (its fp4xfp4 kernel reads x_sf relative to one global scale): use NVFP4 static"
            )
        out = {"x_fp8": self.x, "x_sf": self.x_sf, "topk_idx_out": self.topk_idx, "topk_weights_out": self.topk_weights,
               "hidden_quant": q, "full_buffer": True}  # fmt: skip
        if self.shared_l1_acts_sf is not None:
            n = optional_int(num_tokens, "num_tokens")
            if n is None:
                raise ValueError(
                    "megamoe.buffers: num_tokens: expected the call's token count (the rows of shared_l1_acts_sf "
                    "follow DeepGEMM's block M for it), got None"
                )
            out["shared_x_sf"] = self.shared_l1_acts_sf
            out["shared_block_m"] = lay.block_m(n)
        return out

    def routing_outputs(self) -> dict:
        """stage_megamoe_routing's keyword arguments for this buffer's top-k views
        (``full_buffer=True``)."""
        return {"topk_idx_out": self.topk_idx, "topk_weights_out": self.topk_weights, "full_buffer": True}

    def peer(self, rank: int) -> "DeepGEMMBuffer":
        """The same views of ``rank``'s buffer (symmetric memory; ``peer(self.rank)`` is
        this buffer).

        Raises:
            ValueError: another rank of a buffer that is not symmetric memory, or a rank
                outside the group.
        """
        r = optional_int(rank, "rank")
        if r == self.rank:
            return self
        storage = _peer_storage(self.handle, rank, self.layout.nbytes, "this buffer is", "it")
        import torch  # get_buffer gives a torch tensor

        return DeepGEMMBuffer(storage, self.layout, torch, self.handle, r)


def alloc_deepgemm_buffer(
    variant: str,
    num_experts: int,
    num_max_tokens_per_rank: int,
    num_topk: int,
    hidden: int,
    intermediate_hidden: int,
    *,
    num_ranks: Optional[int] = None,
    num_shared_experts: int = 0,
    mma_type: Optional[str] = None,
    activation: str = "swiglu",
    num_sms: Optional[int] = None,
    num_ring_tokens: Optional[int] = None,
    device: Any = "cpu",
    allocator: Optional[str] = None,
    group: Any = None,
    zero: bool = True,
) -> DeepGEMMBuffer:
    """Allocate DeepGEMM's MegaMoE buffer (:func:`deepgemm_layout`) and return its views,
    zero-filled as DeepGEMM's buffer objects are (the workspace's counters must start at
    zero; ``zero=False`` leaves the bytes as the allocator gives them).

    ``allocator`` as :func:`alloc_staging_buffers`' (``None``: torch when installed, else
    NumPy; ``"symmetric"``: PyTorch symmetric memory over ``group``, a collective, then a
    barrier of the group after the zero fill, as DeepGEMM does). ``num_ranks`` defaults to
    the group's size for symmetric memory, else 1. ``num_sms`` (sm100) defaults to the
    CUDA ``device``'s SM count. Stage a call of T tokens with
    ``prepare_megamoe_inputs(hidden[:T], w, ids, **buf.outputs(T))``.

    Raises:
        ValueError, TypeError: as :func:`deepgemm_layout` and :func:`alloc_staging_buffers`
            (num_sms missing for sm100 off CUDA; num_ranks other than the group's size).
        ModuleNotFoundError: ``allocator="torch"`` or ``"symmetric"`` without torch.
    """
    allocator, torch, dev = _allocator(allocator, device)
    if allocator == "symmetric":
        group = _symmetric_group(group)
        if num_ranks is None:
            if isinstance(group, str):
                raise ValueError("megamoe.buffers: num_ranks: expected the group's size with a group given by name, got None")
            num_ranks = group.size()
    if num_sms is None and variant == "sm100" and dev is not None and dev.type == "cuda":
        num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    layout = deepgemm_layout(
        variant, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
        num_ranks=1 if num_ranks is None else num_ranks, num_shared_experts=num_shared_experts, mma_type=mma_type,
        activation=activation, num_sms=num_sms, num_ring_tokens=num_ring_tokens,
    )  # fmt: skip
    what = f"DeepGEMM's {layout.variant} MegaMoE buffer"
    if allocator != "symmetric":
        return DeepGEMMBuffer(_allocate_bytes(allocator, torch, dev, what, layout.nbytes, zero), layout, torch)
    storage, handle = _allocate_symmetric(torch, dev, group, what, layout.nbytes)
    if handle.world_size != layout.num_ranks:
        raise ValueError(f"megamoe.buffers: num_ranks: expected the group's size {handle.world_size}, got {layout.num_ranks}")
    if zero:
        storage.zero_()
        handle.barrier()  # no peer's kernel touches this buffer before it is zero
        torch.cuda.synchronize(dev)
    return DeepGEMMBuffer(storage, layout, torch, handle, handle.rank)


def deepgemm_views(storage: Any, layout: DeepGEMMLayout, *, handle: Any = None, rank: int = 0) -> DeepGEMMBuffer:
    """DeepGEMM's views of an existing buffer: ``storage`` is its bytes, a 1-D int8 or uint8
    torch tensor or NumPy array of at least ``layout.nbytes`` bytes, e.g. the ``.buffer`` of
    the buffer object DeepGEMM's ``get_symm_buffer_for_mega_moe`` made for the same
    arguments, so that staging writes the inputs its kernel reads. ``handle`` / ``rank``: a
    symmetric-memory handle for :meth:`DeepGEMMBuffer.peer`.

    Raises:
        ValueError: storage that is not 1-D bytes, not contiguous, or smaller than the layout.
        TypeError: storage that is no torch tensor or NumPy array.
    """
    torch = _torch_or_none()
    if torch is not None and isinstance(storage, torch.Tensor):
        ok = storage.dtype in (torch.int8, torch.uint8) and storage.dim() == 1 and storage.is_contiguous()
        what = f"{tuple(storage.shape)} {storage.dtype}"
    else:
        import numpy as np

        if not isinstance(storage, np.ndarray):
            raise TypeError(f"megamoe.buffers: storage: expected a torch tensor or NumPy array, got {type(storage).__name__}")
        ok = storage.dtype.itemsize == 1 and storage.dtype.kind in "iu" and storage.ndim == 1 and storage.flags.c_contiguous
        what = f"{storage.shape} {storage.dtype}"
        torch = None
    if not ok:
        raise ValueError(f"megamoe.buffers: storage: expected contiguous 1-D int8 or uint8 bytes, got {what}")
    n = int(storage.shape[0])
    if n < layout.nbytes:
        raise ValueError(f"megamoe.buffers: storage: expected at least {layout.nbytes} bytes (the layout's), got {n}")
    raw = storage.view(torch.uint8) if torch is not None else storage.view("u1")
    return DeepGEMMBuffer(raw, layout, torch, handle, optional_int(rank, "rank") or 0)
