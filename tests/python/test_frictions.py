"""Frictions at the Python boundary: integers beyond what the native module takes, the
allocator of alloc_staging_buffers without torch, and allocations no memory can hold.

* An int argument outside int64 (``stream`` outside a cudaStream_t) is a ValueError naming
  the argument and the value, raised before anything is written, at every entry point
  (not nanobind's "incompatible function arguments", which names neither).
* ``alloc_staging_buffers``' default allocator is torch when torch is installed, else
  NumPy; torch's absence is simulated (``sys.modules["torch"] = None``), so these run
  with or without torch.
* A size that passes the layout's checks but cannot be allocated is a ValueError giving
  its bytes, the allocator's error chained.

NumPy only; the torch cases skip without torch.
"""

from __future__ import annotations

import inspect
import re
import sys

import numpy as np
import pytest

import megamoe
from megamoe import _args, buffers
from megamoe_testutil import valid_kwargs

OUTPUTS = ("x_fp8", "x_sf", "topk_idx_out", "topk_weights_out")
# Ints just outside int64 on either side, and far outside.
BEYOND_INT64 = [2**63, 2**64, 2**70, -(2**63) - 1, -(2**64), -(2**70)]


def does_not_fit(name: str, value: int, ctype: str = "int64") -> str:
    return f"megamoe: {name}: {value} does not fit in {ctype}"


def unchanged(kw: dict, call) -> None:
    """Run ``call`` (which must raise) and assert that no output of ``kw`` changed."""
    before = {n: kw[n].tobytes() for n in kw if isinstance(kw[n], np.ndarray) and n in OUTPUTS + ("shared_x_sf",)}
    call()
    for n, b in before.items():
        assert kw[n].tobytes() == b, f"a rejected call wrote {n}"


def shared_kwargs(bm) -> dict:
    kw = valid_kwargs()
    kw.update(shared_x_sf=np.full((128, 2), 0x5A5A5A5A, np.int32), shared_block_m=bm)
    return kw


def router_kwargs(T: int = 8, E: int = 16, K: int = 4) -> dict:
    rng = np.random.default_rng(3)
    return dict(
        router_logits=rng.standard_normal((T, E)).astype(np.float32),
        e_score_correction_bias=np.zeros(E, np.float32),
        topk_weights=np.full((T, K), 0x5A5A5A5A, np.int32).view(np.float32),
        topk_ids=np.full((T, K), 0x5A5A5A5A, np.int32),
    )


def route_and_stage_kwargs() -> dict:
    kw = valid_kwargs()
    del kw["topk_weights"], kw["topk_ids"]
    kw.update(router_kwargs())
    return kw


def small_stage_args():
    return (np.ones((4, 128), np.float32), np.ones((4, 2), np.float32), np.zeros((4, 2), np.int32))


# ---------------------------------------------------------------------------------------
# 1. Integers beyond int64


@pytest.mark.parametrize("value", BEYOND_INT64, ids=str)
def test_staging_int_beyond_int64_is_a_value_error_naming_it(value):
    msg = does_not_fit("shared_block_m", value)
    kw = shared_kwargs(value)
    for fn in (megamoe.prepare_megamoe_inputs, megamoe.explain):
        unchanged(kw, lambda: pytest.raises(ValueError, fn, **kw).match(re.escape(msg)))
    # Positionally, as vLLM passes it.
    args = [kw[n] for n in ("hidden_states", "topk_weights", "topk_ids") + OUTPUTS]
    with pytest.raises(ValueError, match=re.escape(msg)):
        megamoe.prepare_megamoe_inputs(*args, None, kw["shared_x_sf"], value)


@pytest.mark.parametrize("value", BEYOND_INT64, ids=str)
def test_router_ints_beyond_int64_are_value_errors_naming_them(value):
    kw = router_kwargs()
    unchanged(kw, lambda: pytest.raises(ValueError, megamoe.route, **kw, top_k=value)
              .match(re.escape(does_not_fit("top_k", value))))  # fmt: skip
    kw = route_and_stage_kwargs()
    for name in ("top_k", "shared_block_m"):
        over = {name: value}
        if name == "shared_block_m":
            over["shared_x_sf"] = np.zeros((128, 2), np.int32)
        unchanged(kw, lambda: pytest.raises(ValueError, megamoe.route_and_stage, **kw, **over)
                  .match(re.escape(does_not_fit(name, value))))  # fmt: skip


@pytest.mark.parametrize("value", BEYOND_INT64, ids=str)
def test_helpers_ints_beyond_int64_are_value_errors_naming_them(value):
    h, w, ids = small_stage_args()
    for name in ("max_tokens", "shared_block_m"):
        with pytest.raises(ValueError, match=re.escape(does_not_fit(name, value))):
            megamoe.stage(h, w, ids, **{name: value})
    for i, name in enumerate(("T", "H", "K")):
        sizes = [4, 128, 2]
        sizes[i] = value
        with pytest.raises(ValueError, match=re.escape(does_not_fit(name, value))):
            megamoe.output_shapes(*sizes)
    with pytest.raises(ValueError, match=re.escape(does_not_fit("shared_block_m", value))):
        megamoe.output_shapes(4, 128, 2, megamoe.MXFP8, value)
    for name, kw in (("max_tokens", dict(max_tokens=value)), ("hidden", dict(hidden=value)),
                     ("top_k", dict(top_k=value)), ("shared_block_m", dict(shared_block_m=value))):  # fmt: skip
        full = dict(max_tokens=16, hidden=256, top_k=4)
        full.update(kw)
        for fn in (buffers.staging_layout, buffers.alloc_staging_buffers):
            with pytest.raises(ValueError, match=re.escape(does_not_fit(name, value))):
                fn(**full)
    with pytest.raises(ValueError, match=re.escape(does_not_fit("align", value))):
        buffers.staging_layout(16, 256, 4, align=value)
    # vLLM's fused router + staging takes shared_block_m too.
    kw = route_and_stage_kwargs()
    with pytest.raises(ValueError, match=re.escape(does_not_fit("shared_block_m", value))):
        megamoe.dsv4_topk_prepare_megamoe(
            kw["hidden_states"], kw["router_logits"], kw["e_score_correction_bias"], 1.5, np.int32,
            kw["x_fp8"], kw["x_sf"], kw["topk_idx_out"], kw["topk_weights_out"],
            None, np.zeros((128, 2), np.int32), value,
        )  # fmt: skip


@pytest.mark.parametrize("value", BEYOND_INT64, ids=str)
def test_scheme_group_sizes_beyond_int64_are_value_errors_naming_them(value):
    for name in ("group_m", "group_k"):
        with pytest.raises(ValueError, match=re.escape(does_not_fit(name, value))):
            megamoe.QuantScheme(**{name: value})
        q = megamoe.QuantScheme()
        with pytest.raises(ValueError, match=re.escape(does_not_fit(name, value))):
            setattr(q, name, value)
        assert q == megamoe.QuantScheme(), "a refused assignment changed the scheme"


def test_scheme_group_sizes_take_index_ints_and_refuse_other_types():
    q = megamoe.QuantScheme(group_m=np.int64(1), group_k=np.int32(128))
    assert (q.group_m, q.group_k) == (1, 128)
    q.group_k = np.uint8(32)
    assert q == megamoe.QuantScheme()
    assert megamoe.QuantScheme(group_k=2**63 - 1).group_k == 2**63 - 1
    assert megamoe.QuantScheme(group_m=-(2**63)).group_m == -(2**63)
    for bad in (1.5, "32", None, True):
        with pytest.raises(TypeError, match="megamoe: group_k: expected an int"):
            megamoe.QuantScheme(group_k=bad)
        with pytest.raises(TypeError, match="megamoe: group_m: expected an int"):
            megamoe.QuantScheme().group_m = bad
    big = 2**200
    with pytest.raises(ValueError, match=re.escape("megamoe: group_k: an int of 201 bits does not fit in int64")):
        megamoe.QuantScheme(group_k=big)
    with pytest.raises(ValueError, match=re.escape("megamoe: group_k: a negative int of 201 bits does not fit")):
        megamoe.QuantScheme(group_k=-big)


def test_int64_bounds_themselves_reach_the_library():
    """-2**63 and 2**63 - 1 are int64s: the library judges them (its own messages), the
    range check does not."""
    with pytest.raises(ValueError, match="negative") as info:
        megamoe.output_shapes(-(2**63), 128, 2)
    assert "does not fit" not in str(info.value)
    with pytest.raises(ValueError) as info:
        megamoe.stage(*small_stage_args(), max_tokens=2**63 - 1)
    assert "does not fit" not in str(info.value)


@pytest.mark.parametrize("value", [-1, -(2**63), 2**64, 2**70], ids=str)
def test_stream_outside_a_cudastream_is_a_value_error(value):
    msg = does_not_fit("stream", value, "a cudaStream_t (0 <= stream < 2**64)")
    kw = valid_kwargs()
    unchanged(kw, lambda: pytest.raises(ValueError, megamoe.prepare_megamoe_inputs, **kw, stream=value)
              .match(re.escape(msg)))  # fmt: skip
    routing = {n: kw[n] for n in ("topk_weights", "topk_ids", "topk_idx_out", "topk_weights_out")}
    unchanged(routing, lambda: pytest.raises(ValueError, megamoe.stage_megamoe_routing, **routing, stream=value)
              .match(re.escape(msg)))  # fmt: skip
    rk = router_kwargs()
    with pytest.raises(ValueError, match=re.escape(msg)):
        megamoe.route(**rk, stream=value)
    with pytest.raises(ValueError, match=re.escape(msg)):
        megamoe.stage(*small_stage_args(), stream=value)
    # The largest cudaStream_t is a stream; on the CPU it is ignored.
    megamoe.stage(*small_stage_args(), stream=2**64 - 1)


def test_numpy_integers_beyond_int64_are_value_errors():
    """NumPy's uint64 holds what int64 does not; its value is checked like an int's."""
    big = np.uint64(2**64 - 1)
    with pytest.raises(ValueError, match=re.escape(does_not_fit("shared_block_m", 2**64 - 1))):
        megamoe.prepare_megamoe_inputs(**shared_kwargs(big))
    with pytest.raises(ValueError, match=re.escape(does_not_fit("max_tokens", 2**64 - 1))):
        megamoe.stage(*small_stage_args(), max_tokens=big)


@pytest.mark.parametrize("value", [2**1024, -(2**1024), 10**5000], ids=["2**1024", "-2**1024", "10**5000"])
def test_int_too_large_for_a_float_is_a_value_error(value):
    """An int ``routed_scaling_factor`` beyond a double: a ValueError naming it, as the
    library's for values beyond float32 (float() would raise a bare OverflowError), its size
    given instead of thousands of digits."""
    bits = value.bit_length()
    size = f"a{' negative' if value < 0 else 'n'} int of {bits} bits"
    msg = f"megamoe: routed_scaling_factor: expected a value within float32's range, got {size}"
    kw = valid_kwargs()
    unchanged(kw, lambda: pytest.raises(ValueError, megamoe.prepare_megamoe_inputs, **kw,
                                        routed_scaling_factor=value).match(re.escape(msg)))  # fmt: skip
    routing = {n: kw[n] for n in ("topk_weights", "topk_ids", "topk_idx_out", "topk_weights_out")}
    with pytest.raises(ValueError, match=re.escape(msg)):
        megamoe.stage_megamoe_routing(**routing, routed_scaling_factor=value)
    with pytest.raises(ValueError, match=re.escape(msg)):
        megamoe.route(**router_kwargs(), routed_scaling_factor=value)
    with pytest.raises(ValueError, match=re.escape(msg)):
        megamoe.mega_moe_pre_dispatch_sm90(
            kw["hidden_states"], kw["topk_ids"], kw["topk_weights"], kw["x_fp8"],
            np.zeros((8, 2), np.float32), kw["topk_idx_out"], kw["topk_weights_out"], 8,
            routed_scaling_factor=value,
        )  # fmt: skip


@pytest.mark.skipif(not hasattr(megamoe, "set_cpu_threads"), reason="this library has no megamoe::set_cpu_threads")
@pytest.mark.parametrize("value", [2**31, 2**40, 2**70, -(2**31) - 1, -(2**70)], ids=str)
def test_cpu_threads_beyond_int32_are_value_errors(value):
    before = megamoe.cpu_threads()
    with pytest.raises(ValueError, match=re.escape(does_not_fit("set_cpu_threads: n", value, "int32"))):
        megamoe.set_cpu_threads(value)
    assert megamoe.cpu_threads() == before
    with pytest.raises(TypeError, match="megamoe: set_cpu_threads: n: expected an int, got str"):
        megamoe.set_cpu_threads("2")


def test_docstrings_say_out_of_range_ints_are_value_errors():
    for fn in (megamoe.prepare_megamoe_inputs, megamoe.route, megamoe.route_and_stage):
        raises = fn.__doc__.split("Raises:")[1]
        value_error = raises.split("ValueError:")[1].split("RuntimeError:")[0]
        assert "int64" in value_error and "2**64" in value_error, fn.__name__
    assert "int64" in megamoe.stage.__doc__ and "int64" in megamoe.output_shapes.__doc__


def test_torch_ints_beyond_int64_are_value_errors():
    torch = pytest.importorskip("torch")
    kw = {k: torch.from_numpy(v) for k, v in shared_kwargs(None).items() if isinstance(v, np.ndarray)}
    for value in (2**64, -(2**70)):
        with pytest.raises(ValueError, match=re.escape(does_not_fit("shared_block_m", value))):
            megamoe.prepare_megamoe_inputs(**kw, shared_block_m=value)
        with pytest.raises(ValueError, match=re.escape(does_not_fit("max_tokens", value))):
            megamoe.stage(*(torch.from_numpy(a) for a in small_stage_args()), max_tokens=value)


# ---------------------------------------------------------------------------------------
# 2. alloc_staging_buffers' allocator without torch


@pytest.fixture
def no_torch(monkeypatch):
    """An interpreter where ``import torch`` fails as it does without torch installed."""
    monkeypatch.setitem(sys.modules, "torch", None)


def test_alloc_default_allocator_is_none():
    assert inspect.signature(buffers.alloc_staging_buffers).parameters["allocator"].default is None
    assert "``None`` (default)" in buffers.alloc_staging_buffers.__doc__


def test_alloc_without_torch_uses_numpy(no_torch):
    bufs = buffers.alloc_staging_buffers(16, 256, 4, megamoe.MXFP8, 64)
    assert isinstance(bufs.storage, np.ndarray) and bufs.storage.nbytes == bufs.layout.nbytes
    assert bufs.x_fp8.dtype == np.uint8 and bufs.x_fp8.shape == (16, 256)
    assert bufs.topk_idx_out.dtype == np.int64 and bufs.shared_x_sf is not None
    # The buffers stage as the NumPy allocator's do.
    kw = valid_kwargs(T=5, H=256, K=4)
    megamoe.prepare_megamoe_inputs(kw["hidden_states"], kw["topk_weights"], kw["topk_ids"], **bufs.outputs(),
                                   full_buffer=True)  # fmt: skip
    assert (bufs.topk_idx_out[5:] == -1).all()
    same = buffers.alloc_staging_buffers(16, 256, 4, megamoe.MXFP8, 64, device="cpu")
    assert isinstance(same.storage, np.ndarray) and same.layout == bufs.layout


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "meta"])
def test_alloc_without_torch_off_the_cpu_says_torch_is_needed(no_torch, device):
    msg = f"megamoe.buffers: device {device!r} needs torch, which is not installed"
    with pytest.raises(ValueError, match=re.escape(msg)):
        buffers.alloc_staging_buffers(16, 256, 4, device=device)


def test_alloc_without_torch_explicit_torch_still_needs_it(no_torch):
    with pytest.raises(ModuleNotFoundError):
        buffers.alloc_staging_buffers(16, 256, 4, allocator="torch")


def test_alloc_default_with_torch_uses_torch():
    torch = pytest.importorskip("torch")
    bufs = buffers.alloc_staging_buffers(16, 256, 4)
    assert isinstance(bufs.storage, torch.Tensor) and bufs.x_fp8.dtype == torch.float8_e4m3fn
    e5 = buffers.alloc_staging_buffers(16, 256, 4, megamoe.MXFP8_E5M2, 64)
    assert e5.x_fp8.dtype == torch.float8_e5m2 and e5.layout.field("x_fp8").spec.dtype == "float8_e5m2"


def test_alloc_mxfp8_e5m2_buffers_without_torch(no_torch):
    """MXFP8_E5M2's buffers: x_fp8 is float8_e5m2 in the layout, uint8 bytes in NumPy, one
    byte a value like MXFP8's (the same offsets); staged in full-buffer mode they hold what
    megamoe.stage gives."""
    bufs = buffers.alloc_staging_buffers(16, 256, 4, megamoe.MXFP8_E5M2, 64)
    assert bufs.layout.field("x_fp8").spec == ((16, 256), "float8_e5m2") and bufs.layout.field("x_fp8").itemsize == 1
    assert bufs.x_fp8.dtype == np.uint8 and bufs.x_fp8.shape == (16, 256) and bufs.shared_x_sf is not None
    assert [f.offset for f in bufs.layout.fields] == [f.offset for f in buffers.staging_layout(16, 256, 4, megamoe.MXFP8, 64).fields]
    kw = valid_kwargs(T=5, H=256, K=4)
    megamoe.prepare_megamoe_inputs(kw["hidden_states"], kw["topk_weights"], kw["topk_ids"], **bufs.outputs(),
                                   hidden_quant=megamoe.MXFP8_E5M2, full_buffer=True)  # fmt: skip
    want = megamoe.stage(kw["hidden_states"], kw["topk_weights"], kw["topk_ids"], scheme=megamoe.MXFP8_E5M2)
    assert np.array_equal(bufs.x_fp8[:5], want.x_fp8) and np.array_equal(bufs.x_sf[:5], want.x_sf)
    assert (bufs.topk_idx_out[5:] == -1).all()


# ---------------------------------------------------------------------------------------
# 3. Allocations no memory holds

# A layout the shape rule accepts (every size fits in int64) of about 2**60 bytes: more
# than any address space, so every allocator fails, whatever the machine's memory.
HUGE = (2**40, 2**20, 8)


def test_alloc_impossible_size_is_a_value_error_numpy():
    nbytes = buffers.staging_layout(*HUGE).nbytes  # the layout's checks pass
    with pytest.raises(ValueError, match=re.escape(f"megamoe.buffers: cannot allocate {nbytes} bytes")) as info:
        buffers.alloc_staging_buffers(*HUGE, allocator="numpy")
    assert isinstance(info.value.__cause__, MemoryError)
    assert "MemoryError: Unable to allocate" in str(info.value)  # NumPy's words are kept


def test_alloc_impossible_size_default_allocator_without_torch(no_torch):
    nbytes = buffers.staging_layout(*HUGE).nbytes
    with pytest.raises(ValueError, match=re.escape(f"megamoe.buffers: cannot allocate {nbytes} bytes")):
        buffers.alloc_staging_buffers(*HUGE)


def test_alloc_size_beyond_int64_is_a_value_error():
    """Each field fits in int64, their sum does not (int64 ids of 2**55 x 64 entries)."""
    layout = buffers.staging_layout(2**55, 128, 64)
    assert layout.nbytes > 2**63
    msg = f"megamoe.buffers: cannot allocate {layout.nbytes} bytes for the staging buffers of {2**55} tokens"
    with pytest.raises(ValueError, match=re.escape(msg)):
        buffers.alloc_staging_buffers(2**55, 128, 64, allocator="numpy")
    # An align that pads the allocation past int64.
    with pytest.raises(ValueError, match="more than int64 can address"):
        buffers.alloc_staging_buffers(16, 256, 4, allocator="numpy", align=2**62)


def test_stage_impossible_max_tokens_is_a_value_error():
    h, w, ids = small_stage_args()
    M = 2**53  # x_fp8: 2**60 bytes; T * H fits in int64, so output_shapes accepts it
    megamoe.output_shapes(M, 128, 2)
    msg = f"megamoe.stage: cannot allocate {M * 128} bytes for a ({M}, 128) float8_e4m3fn output"
    with pytest.raises(ValueError, match=re.escape(msg)) as info:
        megamoe.stage(h, w, ids, max_tokens=M)
    assert isinstance(info.value.__cause__, MemoryError)


def test_dsv4_impossible_topk_is_a_value_error():
    """dsv4_topk_prepare_megamoe allocates [T, K] results, K from topk_idx_out (here a
    broadcast view claiming 2**56 columns)."""
    kw = route_and_stage_kwargs()
    idx = np.broadcast_to(np.zeros((), np.int64), (8, 2**56))
    msg = f"megamoe.dsv4_topk_prepare_megamoe: cannot allocate {8 * 2**56 * 4} bytes for a (8, {2**56}) float32 output"
    with pytest.raises(ValueError, match=re.escape(msg)) as info:
        megamoe.dsv4_topk_prepare_megamoe(kw["hidden_states"], kw["router_logits"], kw["e_score_correction_bias"], 1.5,
                                          np.int32, kw["x_fp8"], kw["x_sf"], idx, kw["topk_weights_out"])  # fmt: skip
    assert isinstance(info.value.__cause__, MemoryError)


class OutOfMemoryError(RuntimeError):
    """Named as torch's (torch.OutOfMemoryError, torch.cuda.OutOfMemoryError)."""


@pytest.mark.parametrize(
    "error",
    [
        MemoryError("Unable to allocate 1.00 EiB"),
        ValueError("array is too big; `arr.size * arr.dtype.itemsize` is larger than the maximum possible size."),
        RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 1099511627776 bytes."),
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory"),
        OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 GiB"),
    ],
    ids=["MemoryError", "numpy-too-big", "torch-cpu", "torch-cpu-enforce", "torch-oom"],
)
def test_allocation_errors_become_value_errors(error):
    def make():
        raise error

    with pytest.raises(ValueError, match=re.escape("megamoe.test: cannot allocate 1024 bytes for a thing")) as info:
        _args.allocate("megamoe.test", "a thing", 1024, make)
    assert info.value.__cause__ is error and str(error) in str(info.value)


def test_other_runtime_errors_pass_through_allocate():
    """A RuntimeError that says nothing of memory (a sticky CUDA error of earlier work
    surfacing at the allocation) is no statement about the size."""
    error = RuntimeError("CUDA error: an illegal memory access was encountered")

    def make():
        raise error

    with pytest.raises(RuntimeError) as info:
        _args.allocate("megamoe.test", "a thing", 1024, make)
    assert info.value is error


def test_torch_impossible_sizes_are_value_errors():
    torch = pytest.importorskip("torch")
    nbytes = buffers.staging_layout(*HUGE).nbytes
    with pytest.raises(ValueError, match=re.escape(f"megamoe.buffers: cannot allocate {nbytes} bytes")) as info:
        buffers.alloc_staging_buffers(*HUGE, allocator="torch")
    assert isinstance(info.value.__cause__, RuntimeError)
    h, w, ids = (torch.from_numpy(a) for a in small_stage_args())
    with pytest.raises(ValueError, match=re.escape("megamoe.stage: cannot allocate")):
        megamoe.stage(h, w, ids, max_tokens=2**53)
