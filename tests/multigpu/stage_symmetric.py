#!/usr/bin/env python3
"""megamoe in expert-parallel symmetric memory: each rank stages its own tokens into its
own symmetric buffers, signals its peer, and the peer reads them directly and checks them
bitwise against its own CPU-backend run of the same inputs.

One process per GPU (torchrun), NCCL process group, PyTorch symmetric memory
(torch.distributed._symmetric_memory), NVLink multicast off (set below, before torch is
imported, and kept for every process torchrun starts):

    torchrun --nproc-per-node 2 tests/multigpu/stage_symmetric.py --out OUT --timing

Rank r stages into its buffers (megamoe.buffers.alloc_staging_buffers, allocator
"symmetric"; full-buffer mode: max_tokens rows, T_r <= max_tokens tokens) on its current
stream, then ``put_signal`` to rank r+1; rank r+1 ``wait_signal``s on its stream, copies
rank r's buffers out of rank r's memory (a copy kernel on its own device reading the peer's
view), regenerates rank r's inputs from rank r's seed, stages them with the CPU backend
into separate poisoned arrays and compares every output bit for bit, the untouched rows
(full-buffer tail of x / x_sf / x_scales, unmapped shared_x_sf rows) included. A barrier
then lets the next staging overwrite the buffers. Every preset, eager and replayed from a
CUDA graph (the staging captured once, replayed on new inputs and a new NVFP4 global scale).

``--timing``: each rank's staging time (CUDA events per call) alone (the ranks take turns,
the others idle) and while its peer reads its buffers over NVLink in a loop on a side
stream; one JSON line per rank, scheme, token count and mode (docs/PERFORMANCE.md).

Without torchrun (no process group) or with world size 1 the same staging, read and check
run on one device: CPU tensors (or NumPy arrays without torch), the allocation's own views
standing in for the peer's; that is what CI runs (tests/multigpu/test_symmetric.py).
``--host-shared-dir DIR`` runs the cross-rank protocol with CPU processes under torchrun
(gloo): buffers in files every rank maps, behind a stand-in handle (HostHandle).
Results: JSON lines (``--out DIR``: DIR/rank<r>.jsonl), a summary on stdout; exit status 1
when any check failed.
"""

from __future__ import annotations

import os

# NVLink multicast stays off: NCCL's NVLS, PyTorch symmetric memory's multicast object and
# NVSHMEM's NVLS (a program using multicast can take a shared host's GPUs out of service).
# Set before torch is imported so that every library reads them.
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_k] = _v

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

import numpy as np  # noqa: E402

import megamoe  # noqa: E402
from megamoe import buffers as mb  # noqa: E402

try:
    import torch
except ImportError:  # CI without torch: NumPy arrays on the CPU backend
    torch = None

PRESETS = {
    name: getattr(megamoe, name)
    for name in ("MXFP8", "FP8_UE8M0_G128", "FP8_FP32_G128", "FP8_FP32_G32", "MXFP4", "MXFP4_RNE",
                 "NVFP4_STATIC", "NVFP4_PER_TOKEN", "MXFP8_E5M2")  # fmt: skip
}
POISON = 0xA5  # no staging result is all 0xA5 bytes; untouched bytes must stay it
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
GRAPH_CASES = (100, 101)  # case numbers of the CUDA-graph replays (seeds differ from eager)


# ---------------------------------------------------------------------------------------
# Inputs: a function of (seed, T) only, so that a reader can regenerate a peer's


def seed_of(base: int, rank: int, case: int) -> int:
    return base * 7919 + rank * 104729 + case


def tokens_for(max_tokens: int, rank: int, case: int) -> int:
    """Each rank's token count in an eager case: full, nearly full, half, none (rotating
    with the rank, so that peers differ)."""
    M = max_tokens
    pick = (M, M - 1 - 3 * rank, M // 2 + rank, 0)[(case + rank) % 4]
    return min(max(pick, 0), M)


def graph_tokens(max_tokens: int, rank: int) -> int:
    return min(max(max_tokens * 3 // 4 - rank, 1), max_tokens)


def host_inputs(seed: int, T: int, H: int, K: int, scheme: Any, case: int) -> dict:
    """float32 activations of many magnitudes (some special values on odd cases), fp32
    weights, int32 ids, a padding mask, and NVFP4 static's global scale."""
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((T, H)).astype(np.float32)
    h *= (np.float32(2.0) ** rng.integers(-12, 12, size=(T, H // 32, 1)).astype(np.float32)).repeat(32, 2).reshape(T, H)
    if T > 3 and case % 2:
        h[3, :6] = [np.nan, -np.nan, np.inf, -np.inf, 3e38, 1e-40]
    gs = None
    if megamoe.output_shapes(max(T, 1), H, K, scheme).global_scale is not None:
        gs = np.array([0.37 + 0.01 * (case % 50)], np.float32)
    return dict(
        hidden_states=h,
        topk_weights=rng.random((T, K)).astype(np.float32),
        topk_ids=rng.integers(0, 256, (T, K)).astype(np.int32),
        is_padding=np.arange(T) % 7 == 3,
        global_scale=gs,
    )


def framework_inputs(host: dict, fw: str, device: Any) -> dict:
    """The inputs as the staging call gets them: NumPy as they are; torch with bf16
    activations (the model's dtype) on ``device``."""
    if fw == "numpy":
        return dict(host)
    out = {}
    for k, v in host.items():
        if v is None:
            out[k] = None
            continue
        t = torch.from_numpy(np.ascontiguousarray(v))
        if k == "hidden_states":
            t = t.to(torch.bfloat16)  # on the host: the same rounding on every rank
        out[k] = t.to(device)
    return out


def stage(outputs: dict, inputs: dict, scheme: Any) -> None:
    megamoe.prepare_megamoe_inputs(**inputs, **outputs, hidden_quant=scheme, full_buffer=True)


# ---------------------------------------------------------------------------------------
# Bits and the check


def bits(a: Any) -> np.ndarray:
    """The raw bits of an array or tensor (any device) as unsigned ints of its item size,
    same shape (so NaN payloads, -0.0 and fp8 codes compare exactly)."""
    if torch is not None and isinstance(a, torch.Tensor):
        t = a.detach().cpu().contiguous()
        shape, item = tuple(t.shape), t.element_size()
        return t.view(torch.uint8).numpy().view(_UINT[item]).reshape(shape)
    a = np.ascontiguousarray(a)
    return a.view(_UINT[a.itemsize])


def compare(got: dict, want: dict, limit: int = 3) -> list:
    """Bitwise differences between two {name: bits} dicts, as messages (empty: equal)."""
    bad = []
    for name in sorted(set(got) | set(want)):
        if name not in got or name not in want:
            bad.append(f"{name}: present in {'got' if name in got else 'want'} only")
            continue
        g, w = got[name], want[name]
        if g.shape != w.shape or g.dtype != w.dtype:
            bad.append(f"{name}: {g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}")
            continue
        diff = np.argwhere(g != w)
        if diff.size:
            first = [f"{tuple(int(i) for i in d)}: got {int(g[tuple(d)]):#x}, want {int(w[tuple(d)]):#x}"
                     for d in diff[:limit]]  # fmt: skip
            bad.append(f"{name}: {len(diff)} of {g.size} elements differ; " + "; ".join(first))
    return bad


def corrupt(b: dict, name: str) -> None:
    """Flip one bit of one byte of ``b[name]`` (a self-test of the check)."""
    flat = b[name].reshape(-1).view(np.uint8)
    flat[flat.size // 2] ^= 0x10


def reference(host: dict, fw: str, scheme: Any, layout: mb.StagingLayout) -> dict:
    """{name: bits} of the CPU backend staging ``host`` into separate poisoned outputs of
    the layout's shapes (megamoe.output_shapes at max_tokens rows): what the peer's
    buffers must hold, byte for byte."""
    inputs = framework_inputs(host, fw, "cpu")
    outs = {}
    for f in layout.fields:
        if fw == "numpy":
            a = np.empty(f.spec.shape, mb._dtype(None, f.spec.dtype))
            a.view(np.uint8)[...] = POISON
        else:
            a = torch.empty(f.spec.shape, dtype=mb._dtype(torch, f.spec.dtype))
            a.view(torch.uint8).fill_(POISON)
        outs[f.name] = a
    if layout.shared_block_m is not None:
        outs["shared_block_m"] = layout.shared_block_m
    stage(outs, inputs, scheme)
    return {f.name: bits(outs[f.name]) for f in layout.fields}


# ---------------------------------------------------------------------------------------
# A symmetric-memory stand-in for CPU processes (the protocol at world size > 1 without GPUs)


class HostHandle:
    """What the script and megamoe.buffers use of a rendezvous handle (``rank``,
    ``world_size``, ``offset``, ``get_buffer``, ``put_signal``, ``wait_signal``,
    ``barrier``) over CPU memory: ``blocks[r]`` is rank r's allocation block (a 1-D uint8
    tensor), this rank's tensor starting ``offset`` bytes into its block; ``get_buffer``
    addresses a block as CUDASymmetricMemory::get_buffer does (base + storage_offset *
    itemsize). Signals go through the process group's store (a key per signal, ``tag``
    naming the allocation: each has its own signals, as each symmetric allocation has its
    own signal pad), the barrier through the process group; without a store they are
    no-ops (one process)."""

    def __init__(self, rank: int, blocks: list, offset: int = 0, store: Any = None, dist: Any = None,
                 tag: str = "") -> None:  # fmt: skip
        self.rank, self.world_size, self.offset, self.blocks = rank, len(blocks), offset, blocks
        self._store, self._dist, self._tag, self._sent, self._seen = store, dist, tag, {}, {}

    def get_buffer(self, rank: int, sizes: tuple, dtype: Any, storage_offset: int = 0) -> Any:
        item = torch.empty((), dtype=dtype).element_size()
        n = int(np.prod(sizes)) * item
        start = storage_offset * item
        if start + n > self.blocks[rank].numel():
            raise ValueError(f"HostHandle.get_buffer: {start + n} bytes exceed the block's {self.blocks[rank].numel()}")
        return self.blocks[rank][start : start + n].view(dtype).view(tuple(sizes))

    def put_signal(self, dst_rank: int, channel: int = 0, timeout_ms: int = 0) -> None:
        k = (channel, dst_rank)
        self._sent[k] = self._sent.get(k, 0) + 1
        if self._store is not None:
            self._store.set(f"megamoe-signal/{self._tag}/{channel}/{self.rank}->{dst_rank}/{self._sent[k]}", "1")

    def wait_signal(self, src_rank: int, channel: int = 0, timeout_ms: int = 0) -> None:
        k = (channel, src_rank)
        self._seen[k] = self._seen.get(k, 0) + 1
        if self._store is not None:
            self._store.wait([f"megamoe-signal/{self._tag}/{channel}/{src_rank}->{self.rank}/{self._seen[k]}"])

    def barrier(self, channel: int = 0, timeout_ms: int = 0) -> None:
        if self._dist is not None:
            self._dist.barrier()


def alloc_host_shared(layout: mb.StagingLayout, directory: str, tag: str, rank: int, world: int,
                      dist: Any) -> mb.StagingBuffers:  # fmt: skip
    """Staging buffers whose blocks are files every rank maps (a collective): this rank's
    views and a HostHandle over all ranks' blocks, as alloc_staging_buffers(allocator=
    "symmetric") returns them, with a 64-byte offset into each block (as a memory pool may
    place a tensor) so that the peer views' offset arithmetic is exercised."""
    offset = 64
    path = lambda r: os.path.join(directory, f"{tag}-rank{r}.bin")  # noqa: E731
    np.memmap(path(rank), np.uint8, mode="w+", shape=(offset + layout.nbytes,)).flush()
    dist.barrier()
    blocks = [torch.from_numpy(np.memmap(path(r), np.uint8, mode="r+", shape=(offset + layout.nbytes,)))
              for r in range(world)]  # fmt: skip
    handle = HostHandle(rank, blocks, offset, dist.distributed_c10d._get_default_store(), dist, tag)
    storage = blocks[rank][offset:]
    return mb.StagingBuffers(**mb._views(storage, layout, torch), storage=storage, layout=layout, handle=handle,
                             rank=rank)  # fmt: skip


# ---------------------------------------------------------------------------------------
# The run: ranks, devices, the signal between a writer and its reader


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.fw = args.framework or ("torch" if torch is not None else "numpy")
        if self.fw == "torch" and torch is None:
            raise SystemExit("stage_symmetric: --framework torch: torch is not installed")
        self.dist = None
        self.rank, self.world, local = 0, 1, 0
        if "WORLD_SIZE" in os.environ and self.fw == "torch":
            import torch.distributed as dist

            self.dist = dist
            self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            local = int(os.environ.get("LOCAL_RANK", self.rank))
        want_cuda = args.device == "cuda" or (args.device is None and self.world > 1)
        if args.device is None and self.world == 1 and self.fw == "torch":
            want_cuda = torch.cuda.is_available() and megamoe.has_cuda_backend()
        if want_cuda:
            if self.fw != "torch" or not torch.cuda.is_available():
                raise SystemExit("stage_symmetric: CUDA needs torch with a CUDA device")
            if not megamoe.has_cuda_backend():
                raise SystemExit("stage_symmetric: megamoe was built without its CUDA backend")
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
        else:
            self.device = "cpu"
        self.cuda = want_cuda
        if self.world > 1 and not self.cuda and not args.host_shared_dir:
            raise SystemExit("stage_symmetric: world size > 1 needs CUDA (symmetric memory) or --host-shared-dir")
        if self.dist is not None:
            if self.cuda:  # bound to this rank's GPU: NCCL's barrier and communicator use it
                self.dist.init_process_group("nccl", device_id=self.device)
            else:
                self.dist.init_process_group("gloo")
        self.allocator = args.allocator or ("symmetric" if self.cuda and self.dist is not None else
                                            "host-shared" if args.host_shared_dir else
                                            "numpy" if self.fw == "numpy" else "torch")  # fmt: skip
        if self.allocator == "host-shared" and (self.cuda or self.dist is None or not args.host_shared_dir):
            raise SystemExit("stage_symmetric: allocator host-shared: CPU processes under torchrun, --host-shared-dir")
        if args.symm_backend:
            import torch.distributed._symmetric_memory as symm_mem

            symm_mem.set_backend(args.symm_backend)
        self.dst, self.src = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        self.records: list = []
        self.keep: list = []  # every allocation lives until the end: no peer reads freed memory
        self.allocs = 0
        self.out = None
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            self.out = open(os.path.join(args.out, f"rank{self.rank}.jsonl"), "w")

    # -- records ---------------------------------------------------------------------------

    def record(self, **rec: Any) -> None:
        rec = dict(rank=self.rank, world_size=self.world, **rec)
        self.records.append(rec)
        if self.out is not None:
            self.out.write(json.dumps(rec) + "\n")
            self.out.flush()

    # -- buffers, signals --------------------------------------------------------------------

    def alloc(self, max_tokens: int, scheme: Any, bm: Optional[int]) -> mb.StagingBuffers:
        a = self.args
        if self.allocator == "host-shared":
            layout = mb.staging_layout(max_tokens, a.hidden, a.top_k, scheme, bm)
            self.allocs += 1
            bufs = alloc_host_shared(layout, a.host_shared_dir, f"a{self.allocs}", self.rank, self.world, self.dist)
        else:
            bufs = mb.alloc_staging_buffers(max_tokens, a.hidden, a.top_k, scheme, bm, device=self.device,
                                            allocator=self.allocator)  # fmt: skip
        self.keep.append(bufs)
        return bufs

    def poison(self, bufs: mb.StagingBuffers) -> None:
        if self.fw == "numpy":
            bufs.storage[...] = POISON
        else:
            bufs.storage.fill_(POISON)

    def staged(self, bufs: mb.StagingBuffers) -> None:
        """After this rank's staging, on its stream: tell the rank that reads it."""
        if bufs.handle is not None and self.dst != self.rank:
            bufs.handle.put_signal(self.dst, channel=0, timeout_ms=self.args.signal_timeout_ms)

    def wait(self, bufs: mb.StagingBuffers) -> None:
        """Before reading: the source rank has staged (its put_signal), on this stream."""
        if bufs.handle is not None and self.src != self.rank:
            bufs.handle.wait_signal(self.src, channel=0, timeout_ms=self.args.signal_timeout_ms)

    def done(self, bufs: mb.StagingBuffers) -> None:
        """Every rank has read: the buffers may be overwritten (stream-ordered barrier)."""
        if bufs.handle is not None and self.world > 1:
            bufs.handle.barrier(channel=1, timeout_ms=self.args.signal_timeout_ms)

    def sync_all(self) -> None:
        """Host and devices of every rank at one point (between timed phases)."""
        if self.cuda:
            torch.cuda.synchronize()
        if self.dist is not None and self.world > 1:
            self.dist.barrier()

    def read(self, view: mb.StagingBuffers) -> dict:
        """{name: bits} of another rank's buffers, copied on this rank's device (a copy
        kernel reading the peer's memory through its view), then to the host."""
        out = {}
        for name, v in view.tensors().items():
            if self.fw == "numpy":
                out[name] = bits(v.copy())
            else:
                c = torch.empty_like(v)
                c.copy_(v)
                out[name] = c
        return {k: v if isinstance(v, np.ndarray) else bits(v) for k, v in out.items()}

    # -- the check ------------------------------------------------------------------------------

    def check_case(self, bufs: mb.StagingBuffers, name: str, scheme: Any, mode: str, case: int,
                   T_src: int, extra: Optional[dict] = None) -> None:  # fmt: skip
        """Read the source rank's buffers (after its signal) and compare them with this
        rank's CPU run of the source's inputs."""
        a = self.args
        self.wait(bufs)
        got = self.read(bufs.peer(self.src))
        self.done(bufs)
        if a.corrupt and a.corrupt in got:
            corrupt(got, a.corrupt)
        host = host_inputs(seed_of(a.seed, self.src, case), T_src, a.hidden, a.top_k, scheme, case)
        want = reference(host, self.fw, scheme, bufs.layout)
        bad = compare(got, want)
        self.record(kind="check", src=self.src, scheme=name, mode=mode, case=case, tokens=T_src,
                    max_tokens=bufs.layout.max_tokens, hidden=a.hidden, top_k=a.top_k,
                    shared_block_m=bufs.layout.shared_block_m, fields=sorted(got), ok=not bad,
                    mismatches=bad, **(extra or {}))  # fmt: skip

    def run_checks(self) -> None:
        a = self.args
        M = a.max_tokens
        for name in a.schemes:
            s = PRESETS[name]
            bm = a.shared_block_m if s.ue8m0 else None
            bufs = self.alloc(M, s, bm)
            if "eager" in a.modes:
                for case in range(a.cases):
                    T = tokens_for(M, self.rank, case)
                    self.poison(bufs)
                    host = host_inputs(seed_of(a.seed, self.rank, case), T, a.hidden, a.top_k, s, case)
                    stage(bufs.outputs(), framework_inputs(host, self.fw, self.device), s)
                    self.staged(bufs)
                    self.check_case(bufs, name, s, "eager", case, tokens_for(M, self.src, case))
            if "graph" in a.modes:
                self.run_graph(bufs, name, s)
            self.sync_all()

    def run_graph(self, bufs: mb.StagingBuffers, name: str, scheme: Any) -> None:
        """The staging captured once in a CUDA graph (static inputs), replayed on new inputs
        copied into them; on the CPU the same static-input calls, run directly."""
        a = self.args
        T = graph_tokens(a.max_tokens, self.rank)
        static = framework_inputs(host_inputs(seed_of(a.seed, self.rank, GRAPH_CASES[0]), T, a.hidden, a.top_k,
                                              scheme, GRAPH_CASES[0]), self.fw, self.device)  # fmt: skip
        outputs = bufs.outputs()

        def step() -> None:
            stage(outputs, static, scheme)

        replay, how = step, "direct (no CUDA graph on the CPU)"
        if self.cuda:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()  # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the NCCL watchdog thread's event queries must not end the capture
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                step()
            self.keep.append(graph)
            replay, how = graph.replay, "captured"
        for case in GRAPH_CASES:
            host = host_inputs(seed_of(a.seed, self.rank, case), T, a.hidden, a.top_k, scheme, case)
            new = framework_inputs(host, self.fw, self.device)
            for k, v in new.items():
                if v is not None:
                    if self.fw == "numpy":
                        static[k][...] = v
                    else:
                        static[k].copy_(v)
            self.poison(bufs)
            replay()
            self.staged(bufs)
            self.check_case(bufs, name, scheme, "graph", case, graph_tokens(a.max_tokens, self.src), {"graph": how})

    # -- timing ---------------------------------------------------------------------------------

    def time_calls(self, fn: Callable[[], None], iters: int) -> list:
        """Microseconds of each of ``iters`` calls (CUDA events on the current stream, or
        the host clock on the CPU)."""
        if not self.cuda:
            out = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e6)
            return out
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for s, e in ev:
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        self._events = ev
        return [s.elapsed_time(e) * 1e3 for s, e in ev]

    def run_timing(self) -> None:
        a = self.args
        for name in a.timing_schemes:
            s = PRESETS[name]
            bm = a.shared_block_m if s.ue8m0 else None
            for T in a.timing_tokens:
                bufs = self.alloc(T, s, bm)
                host = host_inputs(seed_of(a.seed, self.rank, 1000), T, a.hidden, a.top_k, s, 0)
                inputs = framework_inputs(host, self.fw, self.device)
                outputs = bufs.outputs()

                def fn() -> None:
                    stage(outputs, inputs, s)

                for _ in range(3):
                    fn()
                base = dict(kind="timing", scheme=name, tokens=T, hidden=a.hidden, top_k=a.top_k, shared_block_m=bm,
                            iters=a.iters, device=self._device_name(), allocator=self.allocator)  # fmt: skip
                for turn in range(self.world):  # alone: one rank at a time, the others idle
                    self.sync_all()
                    if turn == self.rank:
                        self.record(mode="alone", **base, **_stats(self.time_calls(fn, a.iters)))
                    self.sync_all()
                if self.world > 1 and self.cuda:
                    self.record(mode="peer_reading", **base, **self.time_while_peer_reads(bufs, fn))
                self.sync_all()

    def time_while_peer_reads(self, bufs: mb.StagingBuffers, fn: Callable[[], None]) -> dict:
        """Staging timed while this rank reads its source's buffers in a loop on a side
        stream (every rank does both at once, so each rank's buffers are read by its
        reader while it stages). Reads outlast the timed calls (checked: ``covered``)."""
        a = self.args
        src = bufs.peer(self.src).storage
        scratch = torch.empty_like(src)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            read_us = _stats(self.time_calls(lambda: scratch.copy_(src), 5))["median_us"]
        stage_us = _stats(self.time_calls(fn, 5))["median_us"]
        # Enough reads to outlast launching them and the timed calls (launch costs included).
        n_reads = min(max(math.ceil(3.0 * (stage_us * a.iters + 5000.0) / max(read_us, 1e-3)), 4), 100000)
        self.sync_all()
        r0, r1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            r0.record()
            for _ in range(n_reads):
                scratch.copy_(src)
            r1.record()
        times = self.time_calls(fn, a.iters)
        first, last = self._events[0][0], self._events[-1][1]
        torch.cuda.synchronize()
        covered = r0.elapsed_time(first) >= 0 and last.elapsed_time(r1) >= 0
        read_total_us = r0.elapsed_time(r1) * 1e3
        return dict(**_stats(times), covered=covered, reads=n_reads, read_bytes=src.numel(),
                    read_GBps=src.numel() * n_reads / (read_total_us * 1e3) if read_total_us > 0 else None)  # fmt: skip

    def _device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.cuda else "cpu"

    def finish(self) -> int:
        checks = [r for r in self.records if r["kind"] == "check"]
        failed = [r for r in checks if not r["ok"]]
        self.record(kind="summary", checks=len(checks), failed=len(failed), framework=self.fw,
                    device=self._device_name(), allocator=self.allocator, megamoe=megamoe.__version__,
                    torch=None if torch is None else torch.__version__)  # fmt: skip
        for r in failed:
            print(f"rank {self.rank}: FAILED {r['scheme']} {r['mode']} case {r['case']} (from rank {r['src']}):",
                  *r["mismatches"], sep="\n  ", file=sys.stderr)  # fmt: skip
        for r in self.records:
            if r["kind"] == "timing":
                print(f"rank {self.rank}: {r['scheme']} T={r['tokens']} {r['mode']}: median {r['median_us']:.1f} us")
        print(f"rank {self.rank}/{self.world} ({self.fw}, {self._device_name()}, {self.allocator}): "
              f"{len(checks) - len(failed)} passed, {len(failed)} failed")  # fmt: skip
        if self.out is not None:
            self.out.close()
        if self.dist is not None:
            self.sync_all()
            self.dist.destroy_process_group()
        return 1 if failed else 0


def _stats(us: list) -> dict:
    v = sorted(us)
    q = lambda p: v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))]  # noqa: E731
    return dict(median_us=q(0.5), p10_us=q(0.1), p90_us=q(0.9), min_us=v[0])


def _csv_ints(s: str) -> list:
    return [int(x) for x in s.split(",") if x]


def _csv_schemes(s: str) -> list:
    names = [x for x in s.split(",") if x] if s != "all" else list(PRESETS)
    for n in names:
        if n not in PRESETS:
            raise argparse.ArgumentTypeError(f"unknown scheme {n!r} (presets: {', '.join(PRESETS)})")
    return names


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-tokens", type=int, default=256, help="rows of the symmetric buffers (full-buffer mode)")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--shared-block-m", type=int, default=64, help="shared_x_sf layout (UE8M0 schemes)")
    p.add_argument("--schemes", type=_csv_schemes, default=list(PRESETS), help="comma-separated presets, or all")
    p.add_argument("--modes", type=lambda s: s.split(","), default=["eager", "graph"])
    p.add_argument("--cases", type=int, default=4, help="eager cases per scheme (token counts rotate)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda under torchrun with world size > 1 or when available, else cpu")
    p.add_argument("--framework", choices=["torch", "numpy"], default=None, help="default: torch when installed")
    p.add_argument("--allocator", choices=["torch", "numpy", "symmetric", "host-shared"], default=None,
                   help="default: symmetric on CUDA under torchrun, host-shared with --host-shared-dir, "
                        "else torch (numpy without torch)")
    p.add_argument("--host-shared-dir", default=None,
                   help="CPU processes under torchrun (gloo): buffers in files there that every rank maps, "
                        "signals through the store (the cross-rank protocol without GPUs)")
    p.add_argument("--symm-backend", default=None, help="torch.distributed._symmetric_memory.set_backend(NAME)")
    p.add_argument("--signal-timeout-ms", type=int, default=120000)
    p.add_argument("--timing", action="store_true", help="also time staging alone and while the peer reads")
    p.add_argument("--timing-tokens", type=_csv_ints, default=[128, 4096])
    p.add_argument("--timing-schemes", type=_csv_schemes,
                   default=["MXFP8", "FP8_FP32_G128", "MXFP4", "NVFP4_PER_TOKEN"])  # fmt: skip
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--no-checks", action="store_true", help="timing only")
    p.add_argument("--corrupt", default=None, metavar="FIELD",
                   help="self-test: flip one bit of FIELD in what was read, so that its checks must fail")
    p.add_argument("--out", default=None, help="directory for rank<r>.jsonl")
    return p.parse_args(argv)


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    run = Run(args)
    if not args.no_checks:
        run.run_checks()
    if args.timing:
        run.run_timing()
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
