"""megamoe.buffers (the staging layout and its allocators) and tests/multigpu/stage_symmetric.py.

Always (CI): the layout against megamoe.output_shapes, views that share the allocation's
bytes, the peer views through a stand-in symmetric-memory handle, the whole script at world
size 1 on the CPU (NumPy; torch tensors and a gloo process group under torchrun too when
torch is installed), and the check failing on one wrong byte. The two-GPU run (NCCL,
symmetric memory, NVLink between the ranks) skips unless two CUDA devices are present.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import megamoe
import stage_symmetric as ss
from megamoe import buffers as mb

try:
    import torch
except ImportError:
    torch = None

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "stage_symmetric.py"
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
FRAMEWORKS = ["numpy", pytest.param("torch", marks=needs_torch)]
SMALL = ["--max-tokens", "24", "--hidden", "512", "--top-k", "6"]


def records(out: pathlib.Path) -> list:
    return [json.loads(line) for f in sorted(out.glob("rank*.jsonl")) for line in f.read_text().splitlines()]


# ---------------------------------------------------------------------------------------
# The layout


@pytest.mark.parametrize("name", ss.PRESETS)
@pytest.mark.parametrize("bm", [None, 64, 200])
def test_layout_is_output_shapes_at_aligned_disjoint_offsets(name, bm):
    s = ss.PRESETS[name]
    if bm is not None and not s.ue8m0:
        with pytest.raises(ValueError, match="UE8M0"):
            mb.staging_layout(40, 1024, 6, s, bm)
        return
    lay = mb.staging_layout(40, 1024, 6, s, bm)
    want = megamoe.output_shapes(40, 1024, 6, s, bm)
    assert [f.name for f in lay.fields] == [n for n in mb.FIELDS if getattr(want, n) is not None]
    end = 0
    for f in lay.fields:
        assert f.spec == getattr(want, f.name), f.name
        assert f.offset % lay.align == 0 and f.offset >= end, f.name
        end = f.offset + f.nbytes
    assert end <= lay.nbytes and lay.nbytes % lay.align == 0
    assert lay.max_tokens == 40 and lay.shared_block_m == bm


def test_layout_argument_errors():
    with pytest.raises(ValueError, match="align: expected a power of two >= 8, got 24"):
        mb.staging_layout(8, 256, 2, align=24)
    with pytest.raises(ValueError, match="align"):
        mb.staging_layout(8, 256, 2, align=4)
    with pytest.raises(TypeError, match="max_tokens"):
        mb.staging_layout(None, 256, 2)
    with pytest.raises(ValueError, match="multiple of 128"):
        mb.staging_layout(8, 200, 2)
    with pytest.raises(ValueError, match="allocator: expected 'torch', 'numpy' or 'symmetric', got 'cuda'"):
        mb.alloc_staging_buffers(8, 256, 2, allocator="cuda")
    with pytest.raises(ValueError, match="allocates on the CPU"):
        mb.alloc_staging_buffers(8, 256, 2, allocator="numpy", device="cuda")


def _alloc(fw, *a, **kw):
    return mb.alloc_staging_buffers(*a, allocator=fw, **kw)


@pytest.mark.parametrize("fw", FRAMEWORKS)
@pytest.mark.parametrize("name", ["MXFP8", "FP8_FP32_G128", "NVFP4_PER_TOKEN"])
def test_views_are_the_allocations_bytes(fw, name):
    s = ss.PRESETS[name]
    b = _alloc(fw, 24, 512, 6, s, 64 if s.ue8m0 else None)
    raw = np.arange(b.layout.nbytes, dtype=np.int64).astype(np.uint8) * 7
    if fw == "numpy":
        b.storage[...] = raw
    else:
        b.storage.copy_(torch.from_numpy(raw))
    for f in b.layout.fields:
        got = ss.bits(getattr(b, f.name)).reshape(-1).view(np.uint8)
        assert np.array_equal(got, raw[f.offset : f.offset + f.nbytes]), f.name
    out = b.outputs()
    assert set(out) == {f.name for f in b.layout.fields} | ({"shared_block_m"} if s.ue8m0 else set())
    assert b.peer(0) is b and b.handle is None
    with pytest.raises(ValueError, match=r"peer\(1\): these buffers are not symmetric memory"):
        b.peer(1)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_staging_into_the_views_is_staging_into_arrays(fw):
    """The views are valid outputs of prepare_megamoe_inputs in full-buffer mode, and what
    they receive is what separate arrays receive."""
    s = megamoe.MXFP8
    b = _alloc(fw, 24, 512, 6, s, 64)
    host = ss.host_inputs(5, 17, 512, 6, s, 1)
    if fw == "numpy":
        b.storage[...] = ss.POISON
    else:
        b.storage.fill_(ss.POISON)
    ss.stage(b.outputs(), ss.framework_inputs(host, fw, "cpu"), s)
    got = {n: ss.bits(v) for n, v in b.tensors().items()}
    assert ss.compare(got, ss.reference(host, fw, s, b.layout)) == []
    assert np.all(got["topk_idx_out"][17:] == np.uint64(2**64 - 1))  # the full-buffer tail: -1
    assert np.all(got["x_fp8"][17:] == ss.POISON)  # rows T.. of x untouched


@needs_torch
@pytest.mark.parametrize("name", ["MXFP8", "FP8_FP32_G32", "MXFP4", "NVFP4_PER_TOKEN"])
def test_peer_views_read_the_peers_bytes(name):
    """Two ranks over the script's stand-in handle (get_buffer addressing blocks as
    CUDASymmetricMemory does), the tensors starting 512 bytes into their blocks:
    rank 1 stages into its buffers, rank 0's peer(1) views are those bytes, field by field,
    and peer(1).storage is all of them."""
    s = ss.PRESETS[name]
    bm = 64 if s.ue8m0 else None
    lay = mb.staging_layout(24, 512, 6, s, bm)
    off = 512
    blocks = [torch.full((off + lay.nbytes,), 0x11 * (r + 1), dtype=torch.uint8) for r in range(2)]
    ranks = []
    for r in range(2):
        views = mb._views(blocks[r][off:], lay, torch)
        handle = ss.HostHandle(r, blocks, off)
        ranks.append(mb.StagingBuffers(**views, storage=blocks[r][off:], layout=lay, handle=handle, rank=r))
    host = ss.host_inputs(9, 20, 512, 6, s, 0)
    ranks[1].storage.fill_(ss.POISON)  # the 512 bytes before it keep 0x22
    ss.stage(ranks[1].outputs(), ss.framework_inputs(host, "torch", "cpu"), s)
    peer = ranks[0].peer(1)
    assert peer.rank == 1 and peer.layout is lay
    for f in lay.fields:
        mine, theirs = getattr(ranks[1], f.name), getattr(peer, f.name)
        assert theirs.data_ptr() == mine.data_ptr(), f.name
        assert theirs.shape == mine.shape and theirs.dtype == mine.dtype, f.name
    assert peer.storage.data_ptr() == ranks[1].storage.data_ptr() and peer.storage.numel() == lay.nbytes
    assert ss.compare({n: ss.bits(v) for n, v in peer.tensors().items()}, ss.reference(host, "torch", s, lay)) == []
    assert ranks[0].peer(0) is ranks[0]
    with pytest.raises(ValueError, match=r"expected a rank in \[0, 2\)"):
        ranks[0].peer(2)


def test_torch_version_parsing():
    assert [mb._version(v) for v in ("2.11.0+cu130", "2.10.1", "2.9.0a0+git1234", "3.0")] == [
        (2, 11), (2, 10), (2, 9), (3, 0)]  # fmt: skip


@needs_torch
def test_symmetric_allocator_needs_cuda():
    with pytest.raises(ValueError, match="needs a CUDA device, got cpu"):
        mb.alloc_staging_buffers(8, 256, 2, allocator="symmetric", device="cpu")


# ---------------------------------------------------------------------------------------
# The check


def test_compare_reports_every_single_wrong_byte():
    rng = np.random.default_rng(0)
    want = {"a": rng.integers(0, 2**63, (5, 3), dtype=np.int64).view(np.uint64),
            "b": rng.integers(0, 255, (4, 8), dtype=np.uint8)}  # fmt: skip
    got = {k: v.copy() for k, v in want.items()}
    assert ss.compare(got, want) == []
    for name, a in want.items():
        for byte in range(a.nbytes):
            g = {k: v.copy() for k, v in want.items()}
            g[name].reshape(-1).view(np.uint8)[byte] ^= 0x80
            bad = ss.compare(g, want)
            assert len(bad) == 1 and bad[0].startswith(f"{name}: 1 of {a.size} elements differ"), (name, byte, bad)
    ss.corrupt(got, "b")
    assert ss.compare(got, want)[0].startswith("b: 1 of 32 elements differ; (2, 0): got 0x")
    del got["b"]
    assert ss.compare(got, want) == ["b: present in want only"]
    assert ss.compare({"a": want["a"][:4]}, {"a": want["a"]})[0] == "a: uint64[4, 3] != uint64[5, 3]"


@pytest.mark.parametrize("field", mb.FIELDS)
def test_a_corrupted_byte_fails_the_run(field, tmp_path, capsys):
    """--corrupt FIELD flips one bit of what was read: every check whose scheme has FIELD
    fails, naming it; the others pass; the exit status is 1."""
    schemes = "MXFP8,FP8_FP32_G128,NVFP4_PER_TOKEN"
    rc = ss.main(SMALL + ["--schemes", schemes, "--modes", "eager", "--cases", "1", "--corrupt", field,
                          "--framework", "numpy", "--out", str(tmp_path)])  # fmt: skip
    checks = [r for r in records(tmp_path) if r["kind"] == "check"]
    assert len(checks) == 3
    hit = [r for r in checks if field in r["fields"]]
    assert hit and rc == 1
    for r in checks:
        assert r["ok"] == (r not in hit), r
        if r in hit:
            assert len(r["mismatches"]) == 1 and r["mismatches"][0].startswith(f"{field}: 1 of ")
    assert f"FAILED {hit[0]['scheme']} eager case 0 (from rank 0)" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# The script at world size 1


def check_coverage(recs: list, world: int) -> None:
    checks = [r for r in recs if r["kind"] == "check"]
    assert checks and all(r["ok"] for r in checks), [r["mismatches"] for r in checks if not r["ok"]]
    for rank in range(world):
        mine = [r for r in checks if r["rank"] == rank]
        assert {(r["scheme"], r["mode"]) for r in mine} == {(n, m) for n in ss.PRESETS for m in ("eager", "graph")}
        assert all(r["src"] == (rank - 1) % world for r in mine)
        assert any(r["tokens"] == 0 for r in mine) and any(r["tokens"] == r["max_tokens"] for r in mine)
        for r in mine:
            s = ss.PRESETS[r["scheme"]]
            assert ("shared_x_sf" in r["fields"]) == s.ue8m0
            assert ("x_scales" in r["fields"]) == (r["scheme"] == "NVFP4_PER_TOKEN")
    summaries = [r for r in recs if r["kind"] == "summary"]
    assert len(summaries) == world and all(r["failed"] == 0 for r in summaries)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_world_size_1_every_format_eager_and_graph(fw, tmp_path):
    assert ss.main(SMALL + ["--framework", fw, "--device", "cpu", "--out", str(tmp_path)]) == 0
    recs = records(tmp_path)
    check_coverage(recs, 1)
    assert recs[-1]["allocator"] == fw and recs[-1]["device"] == "cpu"


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_world_size_1_timing_records(fw, tmp_path):
    rc = ss.main(SMALL + ["--framework", fw, "--device", "cpu", "--no-checks", "--timing", "--iters", "3",
                          "--timing-tokens", "8,24", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    timing = [r for r in records(tmp_path) if r["kind"] == "timing"]
    assert {(r["scheme"], r["tokens"], r["mode"]) for r in timing} == {
        (n, t, "alone") for n in ("MXFP8", "FP8_FP32_G128", "MXFP4", "NVFP4_PER_TOKEN") for t in (8, 24)
    }
    for r in timing:
        assert 0 < r["min_us"] <= r["p10_us"] <= r["median_us"] <= r["p90_us"] and r["iters"] == 3


def torchrun(nproc: int, args: list, tmp_path: pathlib.Path, timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(SCRIPT),
           *args, "--out", str(tmp_path)]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@needs_torch
def test_torchrun_world_size_1_gloo(tmp_path):
    """Under torchrun with one CPU process: a gloo process group, the same checks."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: torchrun would use it (test_one_gpu_symmetric_world_size_1 runs that)")
    p = torchrun(1, SMALL + ["--device", "cpu"], tmp_path, 600)
    assert p.returncode == 0, p.stdout + p.stderr
    check_coverage(records(tmp_path), 1)


@needs_torch
def test_torchrun_world_size_2_on_the_cpu(tmp_path):
    """Two CPU processes (gloo) over file-backed buffers every rank maps and signals through
    the store: the cross-rank protocol of the GPU run (rank r stages, signals r+1, which
    reads r's buffers and checks them against its CPU run of r's inputs, with r's token
    counts) on a machine without GPUs; and a corrupted read fails both ranks."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: torchrun would use it (test_two_gpus runs that)")
    shared = tmp_path / "shared"
    shared.mkdir()
    args = SMALL + ["--device", "cpu", "--host-shared-dir", str(shared)]
    timing = ["--timing", "--iters", "2", "--timing-tokens", "8", "--timing-schemes", "MXFP8"]
    p = torchrun(2, args + timing, tmp_path / "ok", 600)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = records(tmp_path / "ok")
    check_coverage(recs, 2)
    assert all(r["allocator"] == "host-shared" for r in recs if r["kind"] == "summary")
    by_case = {(r["rank"], r["scheme"], r["case"]): r["tokens"] for r in recs if r["kind"] == "check"}
    assert any(by_case[(0, n, c)] != by_case[(1, n, c)] for n in ss.PRESETS for c in range(4))  # peers differ
    assert {(r["rank"], r["mode"]) for r in recs if r["kind"] == "timing"} == {(0, "alone"), (1, "alone")}
    p = torchrun(2, args + ["--schemes", "MXFP8", "--modes", "eager", "--cases", "1", "--corrupt", "x_sf"],
                 tmp_path / "bad", 600)  # fmt: skip
    assert p.returncode != 0
    bad = [r for r in records(tmp_path / "bad") if r["kind"] == "check"]
    assert len(bad) == 2 and not any(r["ok"] for r in bad)
    assert all(r["mismatches"][0].startswith("x_sf: 1 of") for r in bad)


# ---------------------------------------------------------------------------------------
# GPUs


def _one_gpu_reason() -> str:
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    if not megamoe.has_cuda_backend():
        return "megamoe was built without its CUDA backend"
    return ""


@pytest.mark.skipif(bool(_one_gpu_reason()), reason=_one_gpu_reason() or "-")
def test_one_gpu_symmetric_world_size_1(tmp_path):
    """torchrun with one process on one GPU: NCCL, a symmetric-memory allocation and its
    handle (get_buffer checked against the allocation), every format staged on CUDA,
    eager and from a CUDA graph, bitwise against the CPU backend; the reader is the
    writer (no peer to signal)."""
    p = torchrun(1, ["--timing", "--iters", "20", "--timing-tokens", "128"], tmp_path, 600)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = records(tmp_path)
    check_coverage(recs, 1)
    assert recs[-1]["allocator"] == "symmetric" and recs[-1]["device"] != "cpu"
    assert all(r["graph"] == "captured" for r in recs if r.get("mode") == "graph" and r["kind"] == "check")


def _two_gpus_reason() -> str:
    if torch is None:
        return "torch is not installed"
    if torch.cuda.device_count() < 2:
        return f"needs two CUDA devices, found {torch.cuda.device_count()}"
    if not megamoe.has_cuda_backend():
        return "megamoe was built without its CUDA backend"
    return ""


@pytest.mark.skipif(bool(_two_gpus_reason()), reason=_two_gpus_reason() or "-")
def test_two_gpus(tmp_path):
    """Two processes, NCCL, symmetric memory: each rank reads the other's buffers over
    NVLink and checks them against its CPU run of the other's inputs, every format, eager
    and CUDA graph; then the timing (alone / while the peer reads)."""
    p = torchrun(2, ["--timing", "--iters", "50"], tmp_path, 600)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = records(tmp_path)
    check_coverage(recs, 2)
    assert all(r["allocator"] == "symmetric" for r in recs if r["kind"] == "summary")
    timing = [r for r in recs if r["kind"] == "timing"]
    for rank in (0, 1):
        assert {r["mode"] for r in timing if r["rank"] == rank} == {"alone", "peer_reading"}
    assert all(r["covered"] for r in timing if r["mode"] == "peer_reading")
