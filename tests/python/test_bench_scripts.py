"""The GPU benchmark scripts and scripts/device.sh, kept from rotting on machines without a
GPU: their dry runs (argument parsing, the configuration grids; no torch), the A/B
comparison, the router's NumPy reference on planted cases, and, where torch is installed,
their CPU check modes (the correctness checks of every benchmark on the CPU backend)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
HAS_TORCH = importlib.util.find_spec("torch") is not None
SCRIPTS = ("bench_formats.py", "bench_stage.py", "bench_router.py", "bench_op_overhead.py", "bench_norm.py")


def _module(name):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(args, env=None, timeout=300):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env={**os.environ, **(env or {})})
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_dry_run_lists_configurations(script):
    rc, out, err = _run([sys.executable, str(BENCH / script), "--dry-run"])
    assert rc == 0, out + err
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows and all(r["dry_run"] for r in rows)


def test_router_grid_is_the_issue_grid():
    rc, out, err = _run([sys.executable, str(BENCH / "bench_router.py"), "--dry-run"])
    rows = [json.loads(line) for line in out.splitlines()]
    assert {(r["E"], r["K"], r["H"]) for r in rows} == {(256, 6, 4096), (384, 6, 7168)}
    assert sorted({r["T"] for r in rows}) == [1, 8, 64, 256, 1024, 4096]
    assert {r["eplb"] for r in rows} == {False, True}


def test_deepgemm_part_dry_run():
    """The deepgemm part (opt-in): DeepGEMM's SM90 FP8 buffer at T 1 ... 16384, the CPU
    check's small buffer at T 1 and 5, not among the default parts."""
    rc, out, err = _run([sys.executable, str(BENCH / "bench_formats.py"), "--dry-run", "--parts", "deepgemm"])
    assert rc == 0, out + err
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert row["part"] == "deepgemm" and row["variant"] == "sm90_fp8"
    assert row["T"] == [1, 8, 64, 256, 1024, 4096, 16384]
    assert (row["num_experts"], row["num_max_tokens_per_rank"], row["top_k"], row["H"]) == (256, 16384, 8, 7168)
    assert row["timed"] == ["full_us", "copy_us", "eager_us"]
    rc, out, err = _run([sys.executable, str(BENCH / "bench_formats.py"), "--dry-run", "--cpu-check", "--parts",
                         "deepgemm"])
    assert rc == 0, out + err
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert row["T"] == [1, 5] and row["H"] == 256
    rc, out, err = _run([sys.executable, str(BENCH / "bench_formats.py"), "--dry-run"])
    assert rc == 0 and "deepgemm" not in out


def _formats_dry(*args):
    rc, out, err = _run([sys.executable, str(BENCH / "bench_formats.py"), "--dry-run", *args])
    assert rc == 0, out + err
    return [json.loads(line) for line in out.splitlines()]


def test_online_part_dry_run():
    """The online part (opt-in): H 7168 and 4096, T 1 ... 16384, its four timings; --T and
    --quick choose the tokens, the CPU check its small sizes; not among the default parts."""
    rows = _formats_dry("--parts", "online")
    assert [(r["part"], r["H"]) for r in rows] == [("online", 7168), ("online", 4096)]
    assert all(r["T"] == [1, 16, 64, 1024, 16384] for r in rows) and all(r["floor"] == 2.0 ** -100 for r in rows)
    assert rows[0]["timed"] == ["online_us", "three_launch_us", "static_us", "copy_us"]
    assert [r["T"] for r in _formats_dry("--parts", "online", "--T", "3,4096")] == [[3, 4096], [3, 4096]]
    assert [r["T"] for r in _formats_dry("--parts", "online", "--quick")] == [[1, 64, 16384]] * 2
    assert [(r["H"], r["T"]) for r in _formats_dry("--parts", "online", "--cpu-check")] == [(256, [1, 5])]
    assert [r["part"] for r in _formats_dry("--parts", "formats,online")] == ["formats"] * 2 + ["online"] * 2
    assert not any(r.get("part") == "online" for r in _formats_dry())
    rc, _, err = _run([sys.executable, str(BENCH / "bench_formats.py"), "--dry-run", "--parts", "online,onl"])
    assert rc == 2 and "'onl'" in err


def _online_rows():
    bf = _module("bench_formats")
    card = dict(device="NVIDIA H100 80GB HBM3", torch="2.9.0", commit="abc1234")
    ok = dict(online_equals_three_launch=True, static_equals_online=True)
    a = bf.online_finish(dict(part="online", H=7168, T=1, bytes=3700, online_us=4.0, three_launch_us=9.0,
                              static_us=2.5, copy_us=1.2, **ok, **card))
    b = bf.online_finish(dict(part="online", H=4096, T=16384, bytes=10 ** 8, online_us=80.0, three_launch_us=120.0,
                              static_us=64.0, copy_us=60.0, **ok, **card))
    c = dict(part="online", H=4096, T=16, online_equals_three_launch=False, static_equals_online=True, **card)
    return [dict(part="formats", H=7168, T=1), a, b, c]


def test_online_ratios_and_table(tmp_path):
    """The online rows' ratios, (b) / (a) and (a) / (c); the markdown table of the online
    rows only, a failed check (not timed) as NO with its times absent; --table renders a
    run's JSONL file the same way."""
    bf = _module("bench_formats")
    _, a, b, _ = rows = _online_rows()
    assert a["three_launch_over_online"] == 2.25 and a["online_over_static"] == 1.6 and a["copy_over_online"] == 0.3
    assert a["online_minus_static_us"] == 1.5 and a["online_TBps"] == 3700 / 4.0 * 1e-6
    assert b["three_launch_over_online"] == 1.5 and b["copy_over_online"] == 0.75
    md = bf.online_markdown(rows).splitlines()
    assert md[0] == "NVIDIA H100 80GB HBM3, torch 2.9.0, megamoe abc1234" and md[1] == ""
    head, rule, *body = md[2:]
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert cols[:3] == ["H", "T", "online us"] and len(cols) == len(bf.ONLINE_COLUMNS) and len(body) == 3
    assert rule.count("|") == len(cols) + 1
    cells = [dict(zip(cols, (c.strip() for c in line.strip("|").split("|")))) for line in body]
    assert cells[0]["3-launch / online"] == "2.25x" and cells[0]["online / static"] == "1.60x"
    assert cells[0]["copy / online"] == "30%" and cells[0]["online - static us"] == "+1.50"
    assert cells[0]["bytes equal"] == "yes" and cells[1]["3-launch us"] == "120.00" and cells[1]["T"] == "16384"
    assert cells[2]["bytes equal"] == "NO" and cells[2]["online us"] == "-" and cells[2]["3-launch / online"] == "-"
    assert bf.online_markdown([dict(kind="header")]) == "(no rows)"
    f = tmp_path / "online.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, out, err = _run([sys.executable, str(BENCH / "bench_formats.py"), "--table", str(f)])
    assert rc == 0 and out.splitlines() == md, out + err


def test_bench_formats_without_cuda_exits_cleanly(tmp_path, monkeypatch, capsys):
    """No torch, or torch without a CUDA device: a message, exit 0, nothing written (the
    online part as every other)."""
    import types

    bf = _module("bench_formats")
    out = tmp_path / "rows"
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert bf.main(["--parts", "online", "--out", str(out)]) == 0
    assert "no CUDA device" in capsys.readouterr().err and not out.exists()
    if not HAS_TORCH:
        rc, _, err = _run([sys.executable, str(BENCH / "bench_formats.py"), "--parts", "online", "--out", str(out)])
        assert rc == 0 and "torch is not installed" in err and "nothing measured" in err and not out.exists()


def test_bad_arguments_are_rejected():
    rc, _, err = _run([sys.executable, str(BENCH / "bench_router.py"), "--dry-run", "--layers", "E1"])
    assert rc == 2 and "E1" in err
    rc, _, err = _run([sys.executable, str(BENCH / "bench_formats.py"), "--dry-run", "--parts", "nope"])
    assert rc == 2 and "nope" in err


def test_device_sh_plans_both_calls_within_the_deadline():
    assert _run(["bash", "-n", str(ROOT / "scripts" / "device.sh")])[0] == 0
    for call, steps in (("call1", ["info", "build", "sanitize", "suite", "pytest", "suite-wait", "sanitize-wait"]),
                        ("call2", ["info", "build", "bench-formats", "nonfinite", "bench-router", "ab", "bench-op"]),
                        ("call3", ["info", "build", "bench-formats", "bench-router", "bench-op"]),
                        ("call4", ["info", "build", "bench-op", "sanitize", "sanitize-wait"]),
                        ("call5", ["info", "build", "suite", "pytest", "suite-wait", "bench-formats"])):
        rc, out, err = _run(["bash", str(ROOT / "scripts" / "device.sh"), "--list", call])
        assert rc == 0, out + err
        lines = out.splitlines()
        assert [ln.split()[0] for ln in lines[:-1]] == steps
        assert lines[-1].startswith("deadline ")
        assert int(lines[-1].split()[1]) < 600
    rc, _, err = _run(["bash", str(ROOT / "scripts" / "device.sh"), "no-such-step"])
    assert rc == 2 and "no-such-step" in err
    rc, out, err = _run(["bash", str(ROOT / "scripts" / "device.sh"), "--list", "info", "build", "bench-norm"])
    assert rc == 0 and [ln.split() for ln in out.splitlines()[:-1]] == [["info", "30"], ["build", "420"],
                                                                        ["bench-norm", "240"]], out + err


def test_device_sh_bench_formats_command():
    """The bench-formats step runs parts formats and full_buffer (with QUICK=1's --quick)
    through pybench; BENCH_FORMATS_ARGS replaces those arguments (e.g. --parts online)."""
    fn = ("eval \"$(sed -n '/^step_bench_formats() {/,/^}/p' scripts/device.sh)\"; "
          "pybench() { echo \"$@\"; }; step_bench_formats")
    rc, out, _ = _run(["bash", "-c", fn])
    assert rc == 0 and out.split() == ["bench-formats", "bench/bench_formats.py", "--parts", "formats,full_buffer"], out
    rc, out, _ = _run(["bash", "-c", "QUICK_FLAG=--quick; " + fn])
    assert out.split() == ["bench-formats", "bench/bench_formats.py", "--parts", "formats,full_buffer", "--quick"], out
    rc, out, _ = _run(["bash", "-c", fn], env={"BENCH_FORMATS_ARGS": "--parts online --T 1,16384"})
    assert out.split() == ["bench-formats", "bench/bench_formats.py", "--parts", "online", "--T", "1,16384"], out
    rc, out, _ = _run(["bash", "-c", fn], env={"BENCH_FORMATS_ARGS": ""})
    assert out.split() == ["bench-formats", "bench/bench_formats.py"], out


def test_device_sh_bench_norm_command():
    """The bench-norm step runs bench/bench_norm.py --quick through pybench (--out its
    directory, joined into bench-norm.jsonl); BENCH_NORM_ARGS replaces --quick."""
    fn = ("eval \"$(sed -n '/^step_bench_norm() {/p' scripts/device.sh)\"; "
          "pybench() { echo \"$@\"; }; step_bench_norm")
    rc, out, _ = _run(["bash", "-c", fn])
    assert rc == 0 and out.split() == ["bench-norm", "bench/bench_norm.py", "--quick"], out
    rc, out, _ = _run(["bash", "-c", fn], env={"BENCH_NORM_ARGS": "--T 1,64 --residual off"})
    assert out.split() == ["bench-norm", "bench/bench_norm.py", "--T", "1,64", "--residual", "off"], out
    rc, out, _ = _run(["bash", "-c", fn], env={"BENCH_NORM_ARGS": ""})
    assert out.split() == ["bench-norm", "bench/bench_norm.py"], out


def _norm_dry(*args):
    rc, out, err = _run([sys.executable, str(BENCH / "bench_norm.py"), "--dry-run", *args])
    assert rc == 0, out + err
    return [json.loads(line) for line in out.splitlines()], err


def test_bench_norm_grid_is_the_issue_grid():
    rows, err = _norm_dry()
    assert {(r["H"], r["scheme"], r["residual"]) for r in rows} == {
        (H, s, res) for H in (4096, 7168) for s in ("mxfp8", "fp8_fp32_g128") for res in (False, True)}
    assert sorted({r["T"] for r in rows}) == [1, 16, 64, 256, 1024, 4096, 16384, 65536]
    assert len(rows) == 64 and '"out": "./norm.jsonl"' in err
    rows, _ = _norm_dry("--quick", "--residual", "off", "--out", "/tmp/x/bench_norm.jsonl")
    assert sorted({r["T"] for r in rows}) == [1, 64, 4096, 16384] and not any(r["residual"] for r in rows)
    rows, err = _norm_dry("--T", "3,5", "--H", "7168", "--schemes", "mxfp8", "--residual", "on", "--out", "d")
    assert [(r["H"], r["scheme"], r["residual"], r["T"]) for r in rows] == [(7168, "mxfp8", True, 3),
                                                                           (7168, "mxfp8", True, 5)]
    assert '"out": "d/norm.jsonl"' in err


@pytest.mark.parametrize("args,needle", [(["--T", "0"], "--T"), (["--T", "x"], "--T"), (["--H", "100"], "--H"),
                                         (["--schemes", "mxfp4"], "mxfp4"), (["--residual", "maybe"], "--residual")])
def test_bench_norm_bad_arguments(args, needle):
    rc, _, err = _run([sys.executable, str(BENCH / "bench_norm.py"), "--dry-run", *args])
    assert rc == 2 and needle in err


def test_bench_norm_bytes_and_ratios():
    bn = _module("bench_norm")
    assert [bn.elem_bytes(res, y) for res in (False, True) for y in (True, False)] == [5, 3, 9, 7]
    # T = 16384, H = 7168, MXFP8 with y: 5 bytes an element, the weight, a scale byte per 32,
    # the top-k (K = 8: 4 + 4 in, 8 + 4 out) and the padding mask.
    T, H = 16384, 7168
    assert bn.fused_bytes(T, H, "mxfp8", False, True) == T * H * 5 + H * 2 + T * H // 32 + T * 8 * 20 + T
    assert bn.fused_bytes(T, H, "fp8_fp32_g128", True, False) == T * H * 7 + H * 2 + T * 56 * 4 + T * 8 * 20 + T
    r = bn.finish(dict(unfused_us=345.0, fused_y_us=230.0, fused_us=138.0, stage_us=119.0, copy_y_us=207.0,
                       copy_us=124.2, bytes_y=4600, bytes=2760))
    assert r["unfused_over_fused_y"] == 1.5 and r["unfused_over_fused"] == 2.5
    assert r["copy_y_over_fused_y"] == 0.9 and abs(r["copy_over_fused"] - 0.9) < 1e-12
    assert r["fused_y_minus_stage_us"] == 111.0 and r["fused_minus_stage_us"] == 19.0
    assert r["fused_y_TBps"] == 4600 / 230.0 * 1e-6


def _norm_rows():
    card = dict(card="NVIDIA H100 80GB HBM3", torch="2.9.0", commit="abc1234")
    base = dict(kind="norm", H=7168, scheme="mxfp8", residual=False, eps=1e-6, bytes_y=10, bytes=6, unfused_us=8.4,
                fused_y_us=2.0, fused_us=1.9, stage_us=1.7, copy_y_us=1.5, copy_us=1.2, staged_equal=True,
                residual_out_equal=None, **card)
    bn = _module("bench_norm")
    return [dict(kind="header", device="x"), bn.finish(dict(base, T=64)),
            bn.finish(dict(base, T=16384, residual=True, unfused_us=345.0, fused_y_us=200.0, fused_us=120.0,
                           stage_us=119.0, copy_y_us=194.0, copy_us=117.0, staged_equal=False,
                           residual_out_equal=True)), dict(kind="summary", rows=2, rows_failing_checks=1)]


def test_bench_norm_table_from_rows(tmp_path):
    bn = _module("bench_norm")
    md = bn.markdown(_norm_rows()).splitlines()
    assert md[0] == "NVIDIA H100 80GB HBM3, torch 2.9.0, megamoe abc1234" and md[1] == ""
    head, rule, a, b = md[2:]
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert cols[:5] == ["H", "scheme", "residual", "T", "unfused us"] and len(cols) == len(bn.COLUMNS)
    assert rule.count("|") == len(cols) + 1 and rule.startswith("|---:|---|---|---:|")
    cells = dict(zip(cols, (c.strip() for c in a.strip("|").split("|"))))
    assert cells["T"] == "64" and cells["unfused us"] == "8.40" and cells["unfused / fused+y"] == "4.20x"
    assert cells["copy+y / fused+y"] == "75%" and cells["fused+y - stage us"] == "+0.30"
    assert cells["bytes equal"] == "yes" and cells["residual"] == "no"
    cells = dict(zip(cols, (c.strip() for c in b.strip("|").split("|"))))
    assert cells["unfused / fused+y"] == "1.73x" and cells["copy / fused"] == "98%" and cells["bytes equal"] == "NO"
    assert cells["residual"] == "yes"
    assert bn.markdown([dict(kind="header")]) == "(no rows)"
    # --table renders a run's JSONL file the same way.
    f = tmp_path / "bench_norm.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in _norm_rows()))
    rc, out, err = _run([sys.executable, str(BENCH / "bench_norm.py"), "--table", str(f)])
    assert rc == 0 and out.splitlines() == md, out + err


def test_bench_norm_without_cuda_exits_cleanly(tmp_path, monkeypatch, capsys):
    """No torch, or torch without a CUDA device: a message, exit 0, nothing written."""
    import types

    bn = _module("bench_norm")
    out = tmp_path / "bench_norm.jsonl"
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert bn.main(["--quick", "--out", str(out)]) == 0
    assert "no CUDA device" in capsys.readouterr().err and not out.exists()
    if not HAS_TORCH:
        rc, stdout, err = _run([sys.executable, str(BENCH / "bench_norm.py"), "--quick", "--out", str(out)])
        assert rc == 0 and "torch is not installed" in err and "nothing measured" in err and not out.exists()


def test_bench_norm_commit(monkeypatch):
    bn = _module("bench_norm")
    monkeypatch.setenv("MEGAMOE_COMMIT", "feedbee")
    assert bn.commit() == "feedbee"
    monkeypatch.delenv("MEGAMOE_COMMIT")
    c = bn.commit()
    assert c is None or len(c) == 40


def _bench_json(path, us):
    rows = [dict(H=7168, scheme="mxfp8", T=T, megamoe_us=v) for T, v in us.items()]
    path.write_text(json.dumps(dict(rows=rows)))
    return str(path)


def test_ab_compare(tmp_path):
    ab = _module("ab_compare")
    this = [_bench_json(tmp_path / "t1.json", {1: 1.30, 64: 1.50}),
            _bench_json(tmp_path / "t2.json", {1: 1.32, 64: 1.52})]
    base = [_bench_json(tmp_path / "b1.json", {1: 1.31, 64: 1.40}),
            _bench_json(tmp_path / "b2.json", {1: 1.29, 64: 1.42})]
    out = tmp_path / "ab.jsonl"
    assert ab.main(["--this", *this, "--base", *base, "--out", str(out)]) == 1  # T = 64 is 7% slower
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_t = {r["T"]: r for r in rows if r["kind"] == "ab"}
    assert by_t[1]["within_tol"] and not by_t[64]["within_tol"]
    assert abs(by_t[64]["this_over_base_minus_1"] - (1.51 / 1.41 - 1)) < 1e-12
    assert rows[-1]["rows_outside_tol"] == 1
    assert ab.main(["--this", *this[:1], "--base", *this[1:]]) == 0


def _formats_run(d, label, times, copy=1.0):
    (d / label).mkdir(parents=True)
    with open(d / label / "formats.jsonl", "w") as f:
        for T, us in times.items():
            f.write(json.dumps(dict(format="nvfp4_static", H=4096, T=T, megamoe_us=us, copy_us=copy)) + "\n")


def test_ab_formats_merge(tmp_path):
    m = _module("ab_formats_merge")
    d = tmp_path / "ab-formats"
    _formats_run(d, "this1", {1: 1.2, 16384: 60.0})
    _formats_run(d, "base1", {1: 1.3, 16384: 66.0})
    _formats_run(d, "f16_mul1", {1: 1.1, 16384: 63.0})
    _formats_run(d, "this2", {1: 1.4, 16384: 62.0})
    _formats_run(d, "base2", {1: 1.5, 16384: 64.0})
    _formats_run(d, "f16_mul2", {1: 1.3, 16384: 61.0})
    out = tmp_path / "ab_formats.jsonl"
    assert m.main([str(d), str(out)]) == 0
    rows = {r["T"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows[16384]["this_us"] == 61.0 and rows[16384]["base_us"] == 65.0
    assert rows[16384]["ratio"] == round(61.0 / 65.0, 4)
    assert rows[16384]["f16_mul_us"] == 62.0 and rows[16384]["f16_mul_ratio"] == round(62.0 / 65.0, 4)
    assert rows[1]["f16_mul_runs"] == [1.1, 1.3] and rows[1]["base_runs"] == [1.3, 1.5]
    assert "f16_mul1_us" not in rows[1]
    assert m.main([str(tmp_path / "none"), str(out)]) == 1  # no run of both builds


def test_device_sh_ab_more_names():
    fn = "eval \"$(sed -n '/^ab_more() {/,/^}/p' scripts/device.sh)\"; ab_more"
    rc, out, _ = _run(["bash", "-c", fn], env={"AB_MORE": "f16_mul:.ab/f16_mul.tar.gz two:x"})
    assert rc == 0 and out.split("\n")[:2] == ["f16_mul .ab/f16_mul.tar.gz", "two x"]
    for bad in ("v1:x", "this:x", "base:x", "Up:x", "name"):
        rc, _, err = _run(["bash", "-c", fn], env={"AB_MORE": bad})
        assert rc == 1 and "AB_MORE" in err, bad


def test_router_reference_rules():
    tr = _module("triton_router")
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    # ties go to the lower id; NaN scores are chosen last; -inf scores +0
    logits = np.array([[1.0, 3.0, 3.0, nan, -inf, 0.5], [nan, nan, 2.0, -inf, -inf, -inf]], dtype=np.float32)
    ids, w, _ = tr.route_ref(logits, 4, alpha=1.5)
    assert ids[0].tolist() == [1, 2, 0, 5]
    assert ids[1].tolist() == [2, 3, 4, 5]  # numbers (+0 scores included) before NaN
    s = tr.scores_ref(logits[0, [1, 2, 0, 5]])
    total = np.float32(0)
    for v in s:
        total = np.float32(total + v)
    assert np.array_equal(w[0], (s / total).astype(np.float32) * np.float32(1.5))
    # a bias moves the selection, not the weights; -0 and +0 tie (lower id wins)
    ids_b, w_b, _ = tr.route_ref(np.zeros((1, 3), np.float32), 2, bias=np.array([-np.log1p(1.0) ** 0.5, 0.0, 0.0],
                                                                                  np.float32))
    assert ids_b[0].tolist() == [1, 2]
    # EPLB: replica p % count of the flat position, load recorded; padding: -1 / +0.0, not recorded
    l2p = np.array([[10, 11], [12, -1], [13, -1]], np.int32)
    rc = np.array([2, 1, 1], np.int32)
    logits = np.array([[5.0, 0.0, -5.0], [5.0, 0.0, -5.0], [5.0, 0.0, -5.0]], np.float32)
    ids_e, w_e, load = tr.route_ref(logits, 2, l2p=l2p, rcount=rc, num_physical=14,
                                    is_padding=np.array([0, 0, 1], bool))
    assert ids_e.tolist() == [[10, 12], [10, 12], [-1, -1]]  # p = 0, 2 -> slot 0 of expert 0
    assert w_e[2].tolist() == [0.0, 0.0]
    assert load[10] == 2 and load[12] == 2 and load.sum() == 4
    assert tr.ulp_diff(np.float32([1.0]), np.nextafter(np.float32([1.0]), np.float32(2)))[0] == 1
    cmp = tr.compare_routes((ids, w), (ids, w))
    assert cmp["ids_equal"] == 1.0 and cmp["max_weight_ulp"] == 0
    # and it sees a differing id set and a weight an ulp away
    ri, rw = np.array([[1, 2], [3, 4]], np.int32), np.float32([[0.5, 0.25], [0.75, 0.125]])
    gi, gw = ri.copy(), rw.copy()
    gi[1, 0] = 5
    gw[0, 1] = np.nextafter(gw[0, 1], np.float32(1))
    cmp = tr.compare_routes((ri, rw), (gi, gw))
    assert cmp["ids_equal"] == 0.5 and cmp["tokens_differing"] == 1 and cmp["max_weight_ulp"] == 1


def test_megamoe_route_matches_the_reference_where_bound():
    megamoe = pytest.importorskip("megamoe")
    if not hasattr(megamoe, "route"):
        pytest.skip("the Python binding of the router is not in this build")
    br, tr = _module("bench_router"), _module("triton_router")
    rng = np.random.default_rng(3)
    for E, K in ((256, 6), (384, 6)):
        logits = rng.standard_normal((37, E)).astype(np.float32)
        bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
        ids = np.zeros((37, K), np.int32)
        w = np.zeros((37, K), np.float32)
        br.call_kw(megamoe.route, router_logits=logits, e_score_correction_bias=bias, top_k=K,
                   routed_scaling_factor=1.5, topk_ids=ids, topk_weights=w)
        ref = tr.route_ref(logits, K, bias, 1.5)
        cmp = tr.compare_routes(ref[:2], (ids, w))
        assert cmp["ids_equal"] == 1.0 and cmp["max_weight_ulp"] <= 1, cmp


needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


@needs_torch
def test_cpu_checks_of_formats_stage_and_op_overhead():
    pytest.importorskip("megamoe")
    assert _module("bench_formats").main(["--cpu-check", "--parts", "full_buffer,nonfinite"]) == 0
    assert _module("bench_op_overhead").main(["--cpu-check", "--n", "5", "--rounds", "1"]) == 0


@needs_torch
def test_cpu_check_of_the_deepgemm_part(capsys):
    """megamoe's full-buffer fill of DeepGEMM's SM90 buffer equals the eager rendering's bytes."""
    pytest.importorskip("megamoe")
    assert _module("bench_formats").main(["--cpu-check", "--parts", "deepgemm"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    rows = [r for r in rows if r.get("part") == "deepgemm"]
    assert [r["T"] for r in rows] == [1, 5] and all(r["deepgemm_equals_eager"] for r in rows)


@needs_torch
def test_cpu_check_of_the_online_part(capsys, monkeypatch):
    """megamoe's NVFP4 online equals the three-launch rendering's bytes (x_q, x_sf, gs) and
    NVFP4 static's under that gs; a rendering whose gs differs fails the check loudly: the
    case is not timed, stderr names it, the run exits 1."""
    pytest.importorskip("megamoe")
    bf = _module("bench_formats")
    assert bf.main(["--cpu-check", "--parts", "online"]) == 0
    cap = capsys.readouterr()
    rows = [json.loads(line) for line in cap.out.splitlines() if line.startswith("{")]
    rows = [r for r in rows if r.get("part") == "online"]
    assert [r["T"] for r in rows] == [1, 5] and all(r["online_equals_three_launch"] for r in rows)
    assert all(r["static_equals_online"] and r["three_launch_over_online"] > 0 for r in rows)
    assert "| 256 | 5 |" in cap.out
    right = bf.three_launch_fn

    def doubled(hs, w, ids, pad, o, floor_t, div_t):
        f = right(hs, w, ids, pad, o, floor_t, div_t)
        return lambda: (f(), o["global_scale"].mul_(2.0))

    monkeypatch.setattr(bf, "three_launch_fn", doubled)
    assert bf.main(["--cpu-check", "--parts", "online"]) == 1
    cap = capsys.readouterr()
    rows = [r for r in (json.loads(line) for line in cap.out.splitlines() if line.startswith("{"))
            if r.get("part") == "online"]
    assert rows and not any(r["equal_global_scale"] or "online_us" in r for r in rows)
    assert "CHECK FAILED" in cap.err and "equal_global_scale" in cap.err


@needs_torch
def test_op_overhead_device_cpu_rows(tmp_path):
    """--device cpu writes a row per call (each registration style with its empty op) and a
    summary against the floor of the style megamoe registers its ops with."""
    pytest.importorskip("megamoe")
    bo = _module("bench_op_overhead")
    assert bo.main(["--device", "cpu", "--n", "3", "--rounds", "1", "--out", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "op_overhead.jsonl").read_text().splitlines()]
    assert rows[0]["kind"] == "header" and rows[0]["tensor_device"] == "cpu"
    assert [r["call"] for r in rows if r["kind"] == "op_overhead"] == list(bo.CALLS)
    med = {r["call"]: r["us_median"] for r in rows if r["kind"] == "op_overhead"}
    (summary,) = [r for r in rows if r["kind"] == "op_overhead_summary"]
    assert summary["floor"] == "empty_library"
    assert summary["op_minus_floor_us"] == med["op"] - med["empty_library"]
    assert summary["op_minus_floor_then_direct_us"] == med["op"] - med["empty_library_then_direct"]
    assert summary["op_custom_op_minus_empty_same_schema_us"] == med["op_custom_op"] - med["empty_same_schema"]


@needs_torch
def test_cpu_check_of_stage_megamoe_against_eager():
    pytest.importorskip("megamoe")
    assert _module("bench_stage").main(["--cpu-check", "--only", "all"]) == 0


@needs_torch
def test_cpu_check_of_router_eager_baseline():
    pytest.importorskip("megamoe")
    assert _module("bench_router").main(["--cpu-check", "--T", "1,17", "--layers", "E384_K6_H7168"]) == 0


@needs_torch
def test_router_binding_path_with_a_stand_in(monkeypatch):
    """The benchmark's megamoe rows (fused, route + stage) through stand-ins that follow the
    binding's expected names: the checks pass for a faithful router and fail for a wrong one."""
    import torch

    megamoe = pytest.importorskip("megamoe")
    br, tr = _module("bench_router"), _module("triton_router")

    def route(router_logits, topk_ids, topk_weights, *, top_k, e_score_correction_bias=None,
              routed_scaling_factor=1.0, logical_to_physical_map=None, logical_replica_count=None,
              expert_load_view=None, record_enabled=None, is_padding=None):
        eplb = logical_to_physical_map is not None
        ids, w, load = tr.route_ref(router_logits.float().numpy(), top_k, e_score_correction_bias.numpy(),
                                    routed_scaling_factor, None, logical_to_physical_map.numpy() if eplb else None,
                                    logical_replica_count.numpy() if eplb else None,
                                    expert_load_view.numel() if eplb else 0)
        topk_ids.copy_(torch.from_numpy(ids))
        topk_weights.copy_(torch.from_numpy(w))
        if eplb and int(record_enabled.item()):
            expert_load_view += torch.from_numpy(load).to(expert_load_view.dtype)

    def route_and_stage(router_logits, hidden_states, topk_ids, topk_weights, x_fp8, x_sf, topk_idx_out,
                        topk_weights_out, *, top_k, hidden_quant, **router):
        route(router_logits, topk_ids, topk_weights, top_k=top_k, **router)
        megamoe.prepare_megamoe_inputs(hidden_states, topk_weights, topk_ids, x_fp8, x_sf, topk_idx_out,
                                       topk_weights_out, hidden_quant=hidden_quant)

    monkeypatch.setattr(megamoe, "route", route, raising=False)
    monkeypatch.setattr(megamoe, "route_and_stage", route_and_stage, raising=False)
    argv = ["--cpu-check", "--T", "1,9", "--layers", "E256_K6_H4096"]
    assert br.main(argv) == 0

    def wrong(router_logits, topk_ids, topk_weights, **kw):  # the unbiased top-k
        route(router_logits, topk_ids, topk_weights, **kw)
        topk_weights.mul_(1.0001)

    monkeypatch.setattr(megamoe, "route", wrong)
    assert br.main(argv) == 1


@needs_torch
def test_triton_router_in_the_interpreter():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    code = (
        "import numpy as np, torch, triton_router as tr\n"
        "rng = np.random.default_rng(5)\n"
        "for E, K, eplb in ((256, 6, False), (384, 6, True)):\n"
        "    T = 6\n"
        "    lg = rng.standard_normal((T, E)).astype(np.float32); lg[0, :3] = [np.nan, np.inf, -np.inf]\n"
        "    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)\n"
        "    l2p = np.stack([np.arange(E), np.where(np.arange(E) < 32, E + np.arange(E), -1)], 1).astype(np.int32)\n"
        "    rc = np.where(np.arange(E) < 32, 2, 1).astype(np.int32)\n"
        "    pad = np.arange(T) % 4 == 3\n"
        "    ids = torch.full((T, K), 7, dtype=torch.int32); w = torch.full((T, K), 9.0)\n"
        "    load = torch.zeros(E + 32, dtype=torch.int32)\n"
        "    kw = dict(logical_to_physical_map=torch.from_numpy(l2p), logical_replica_count=torch.from_numpy(rc),\n"
        "              expert_load_view=load, record_enabled=torch.ones(1, dtype=torch.int32)) if eplb else {}\n"
        "    tr.route_triton(torch.from_numpy(lg), ids, w, K, torch.from_numpy(bias), 1.5,\n"
        "                    is_padding=torch.from_numpy(pad), **kw)\n"
        "    ri, rw, rl = tr.route_ref(lg, K, bias, 1.5, pad, l2p if eplb else None, rc if eplb else None, E + 32)\n"
        "    c = tr.compare_routes((ri, rw), (ids.numpy(), w.numpy()))\n"
        "    assert c['ids_equal'] == 1.0 and c['max_weight_ulp'] <= 8, c\n"
        "    assert not eplb or np.array_equal(load.numpy(), rl), (load, rl)\n"
        "print('ok')\n"
    )
    rc, out, err = _run([sys.executable, "-c", code], env={"TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(
        [str(BENCH), os.environ.get("PYTHONPATH", "")])})
    assert rc == 0 and "ok" in out, out + err


def test_sass_mix_counts_opcodes_per_kernel(tmp_path):
    sass = tmp_path / "k.sass"
    sass.write_text(
        "\n\tcode for sm_90\n\t\tFunction : _Z3fooPf\n"
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */\n"
        "        /*0010*/              @!P0 LOP3.LUT R0, R1, 0xff, RZ, 0xc0, !PT ;   /* 0x000000ff01007812 */\n"
        "        /*0020*/                   FFMA.SAT R2, R0, R1, R0 ;   /* 0x0000000100027223 */\n"
        "        /*0030*/                   FFMA R2, R0, R1, R0 ;   /* 0x0000000100027223 */\n"
        "\t\tFunction : _Z3barv\n"
        "        /*0000*/                   HADD2 R0, R1, R2 ;   /* 0x0000000201007230 */\n")
    mod = _module("sass_mix")
    k = mod.parse(sass.read_text())
    assert set(k) == {"_Z3fooPf", "_Z3barv"}
    assert k["_Z3fooPf"] == {"LDC": 1, "LOP3": 1, "FFMA": 2}
    assert k["_Z3barv"] == {"HADD2": 1}
    rc, out, err = _run([sys.executable, str(BENCH / "sass_mix.py"), "--sass-file", str(sass), "--match", "bar"])
    assert rc == 0, err
    assert "HADD2:1" in out and "foo" not in out


def test_trace_summary_medians(tmp_path):
    """bench/trace_summary.py: the first tenth of each key's lines dropped, medians of the
    rest, unreached points as None, block numbers above 7 as the grid's last block."""
    lines = ["cuda backend: kernel=rowwise (a plan line, ignored)"]
    for i in range(20):
        for b in (0, 131):
            lines.append(f"TRACE row-split b={b} t=0 sm=3 g0={1000 + i} g1={2000 + i + (5 if i >= 2 else 10**6)} "
                         f"d={100 + i} -1 {300 + b} 400 500 -1 {600 + i}")
    f = tmp_path / "x_graph.txt"
    f.write_text("\n".join(lines) + "\n")
    rc, out, err = _run([sys.executable, str(BENCH / "trace_summary.py"), str(f)])
    assert rc == 0, err
    rows = [json.loads(r) for r in out.splitlines()]
    assert [(r["kernel"], r["block"], r["thread"], r["n"]) for r in rows] == [("row-split", 0, 0, 18), ("row-split", "last", 0, 18)]
    # i = 2..19: medians 110.5 -> 110 (int), the dropped first two calls' huge spans gone
    assert rows[0]["points"] == [110, None, 300, 400, 500, None] and rows[0]["end"] == 610 and rows[0]["span_ns"] == 1005
    assert rows[1]["points"][2] == 431
    rc, _, err = _run([sys.executable, str(BENCH / "trace_summary.py")])
    assert rc == 2 and "Medians" in err


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch not installed")
def test_trace_tree_instruments_a_copy(tmp_path):
    """dev/trace/tree.sh: its patch still applies to the tree; the copy's kernels carry the
    phase points and include dev/trace/trace.cuh, the tree's own kernels carry none."""
    rc, out, err = _run(["bash", str(ROOT / "dev" / "trace" / "tree.sh"), "--check"])
    assert rc == 0, out + err
    dest = tmp_path / "tree"
    rc, out, err = _run(["bash", str(ROOT / "dev" / "trace" / "tree.sh"), str(dest)])
    assert rc == 0, out + err
    kernels = pathlib.Path("src/cuda/kernels")
    assert (dest / kernels / "trace.cuh").read_bytes() == (ROOT / "dev" / "trace" / "trace.cuh").read_bytes()
    for name in ("router.cuh", "quantize_fast.cuh", "quantize_rowwise.cuh"):
        assert "MM_TRACE_PRINT" in (dest / kernels / name).read_text()
        assert "MM_TRACE" not in (ROOT / kernels / name).read_text()
    assert (dest / "src" / "api.cpp").read_bytes() == (ROOT / "src" / "api.cpp").read_bytes()
