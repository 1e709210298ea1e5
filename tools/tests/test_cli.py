#!/usr/bin/env python3
"""Tests of the megamoe-stage CLI (plain python3, no numpy).

Usage: test_cli.py PATH/TO/megamoe-stage CASE   (CASE: see CASES at the bottom)
Exits 0 when the case passes; prints what failed otherwise.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading

EXE = None
SMALL = ["-T", "96", "-H", "512", "--iters", "1"]


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def run(*args, expect_rc=None):
    # surrogateescape: stderr may echo a file name that is not UTF-8 byte for byte.
    p = subprocess.run([EXE, *args], capture_output=True, text=True, errors="surrogateescape",
                       timeout=240)
    if expect_rc is not None and p.returncode != expect_rc:
        raise Failure(f"megamoe-stage {' '.join(args)}: exit {p.returncode}, expected {expect_rc}\n"
                      f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def snr(text):
    m = re.search(r"^SNR: ([0-9.]+) dB$", text, re.M)
    check(m is not None, f"no 'SNR: <x> dB' line in:\n{text}")
    return float(m.group(1))


def small_with(flag, value):
    """SMALL with @p flag set to @p value (in place of SMALL's own value for it)."""
    args = list(SMALL)
    if flag in args:
        i = args.index(flag)
        del args[i:i + 2]
    return args + [flag, value]


def expect_pass(args, min_snr=30.0):
    p = run(*args, expect_rc=0)
    check("reference: bit-exact match" in p.stdout, f"no bit-exact line for {args}:\n{p.stdout}")
    check(snr(p.stdout) > min_snr, f"SNR <= {min_snr} for {args}:\n{p.stdout}")
    return p


def expect_error(args, *needles):
    p = run(*args, expect_rc=2)
    for n in needles:
        check(n in p.stderr, f"megamoe-stage {' '.join(args)}: stderr lacks {n!r}:\n{p.stderr}")
    return p


# ---- safetensors helpers -------------------------------------------------------------

def read_st(path):
    """-> (header dict, data bytes)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def tensors(path):
    """-> {name: (dtype, shape, bytes)}."""
    h, data = read_st(path)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}


def write_st(path, ts, header_override=None, raw_header=None):
    """ts: {name: (dtype, shape, bytes)} written in order; header_override patches entries."""
    h, off, blobs = {}, 0, []
    for k, (dt, shape, b) in ts.items():
        h[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    for k, v in (header_override or {}).items():
        h.setdefault(k, {}).update(v)
    hb = raw_header if raw_header is not None else json.dumps(h).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))


def bf16_to_f32_bytes(b):
    out = bytearray()
    for i in range(0, len(b), 2):
        out += b"\0\0" + b[i:i + 2]
    return bytes(out)


def i32_to_i64_bytes(b):
    vals = struct.unpack(f"<{len(b) // 4}i", b)
    return struct.pack(f"<{len(vals)}q", *vals)


def f32_to_bf16_bytes(b):
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", b):
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out += struct.pack("<H", u & 0xFFFF)
    return bytes(out)


# ---- cases -----------------------------------------------------------------------------

def case_default():
    """Small default-scheme runs pass with a bit-exact line and SNR > 30 dB."""
    p = expect_pass(SMALL)
    check(re.search(r"^time: [0-9.]+ (us|ms) per call", p.stdout, re.M), p.stdout)
    check(re.search(r"^bandwidth: [0-9.]+ GB/s", p.stdout, re.M), p.stdout)
    check(re.search(r"^max relative error: [0-9.e+-]+", p.stdout, re.M), p.stdout)
    check("is_padding bool (19 padded)" in p.stdout, p.stdout)  # tokens 5, 10, ..., 95
    p = expect_pass(SMALL + ["--pad-every", "0", "--seed", "7", "-K", "6", "--experts", "16"])
    check("is_padding absent" in p.stdout, p.stdout)
    p = run("-T", "0", "-H", "256", expect_rc=0)
    check("reference: bit-exact match" in p.stdout, p.stdout)


def case_schemes():
    """Every scheme, bit-exact against the reference."""
    for s in ["mxfp8", "ue8m0-g128", "fp32-g128", "fp32-g32", "mxfp8-e5m2"]:
        # e5m2 keeps two mantissa bits where e4m3 keeps three: about 6 dB less.
        p = expect_pass(SMALL + ["--scheme", s], min_snr=22.0 if s == "mxfp8-e5m2" else 28.0)
        check(f"scheme: {s} = QuantScheme(" in p.stdout, p.stdout)
        sf = "int32" if s.startswith(("mxfp8", "ue8m0")) else "float32"
        g = 32 if s in ("mxfp8", "fp32-g32", "mxfp8-e5m2") else 128
        cols = 512 // (4 * g) if sf == "int32" else 512 // g
        check(f"x_sf [96, {cols}] {sf}" in p.stdout, p.stdout)


def case_shared():
    """--shared-block-m stages shared_x_sf with the required rows; fp32 schemes are rejected."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.safetensors")
        for bm in ["64", "192", "1"]:
            p = expect_pass(["-T", "300", "-H", "1024", "--iters", "1", "--shared-block-m", bm,
                             "--output", out])
            b = int(bm)
            rows = -(-300 // b) * (-(-b // 128) * 128)
            ts = tensors(out)
            check(ts["shared_x_sf"][0] == "I32" and ts["shared_x_sf"][1] == [rows, 8],
                  f"shared_x_sf entry {ts['shared_x_sf'][:2]}, expected I32 [{rows}, 8]")
            check(f"shared_x_sf [{rows}, 8]" in p.stdout, p.stdout)
    expect_error(SMALL + ["--scheme", "fp32-g128", "--shared-block-m", "64"], "UE8M0")
    expect_error(SMALL + ["--shared-block-m", "0"], "shared_block_m must be positive")


FLAGS = ["--help", "--version", "--input", "-T", "--tokens", "-H", "--hidden", "-K", "--topk",
         "--experts", "--pad-every", "--seed", "--scheme", "--shared-block-m", "--device",
         "--iters", "--output", "--save-inputs", "--json"]


def case_help():
    """--help documents every flag, the schemes, the metrics and the exit codes."""
    p = run("--help", expect_rc=0)
    for f in FLAGS:
        check(re.search(r"(^|[\s,])" + re.escape(f) + r"\b", p.stdout), f"--help lacks {f}:\n{p.stdout}")
    for word in ["mxfp8", "ue8m0-g128", "fp32-g128", "fp32-g32", "mxfp8-e5m2", "auto", "SNR",
                 "max relative error", "1e-3 * amax", "bit-exact", "Exit status", "hidden_states",
                 "topk_ids", "topk_weights", "is_padding", "x_fp8", "x_sf", "topk_idx_out",
                 "topk_weights_out", "shared_x_sf", "F8_E4M3", "F8_E5M2"]:
        check(word in p.stdout, f"--help lacks {word!r}")
    p = run("--version", expect_rc=0)
    check(re.match(r"\d+\.\d+\.\d+", p.stdout.strip()), p.stdout)


def case_json():
    """--json prints one parseable object (also for errors)."""
    p = run(*SMALL, "--json", expect_rc=0)
    j = json.loads(p.stdout)
    check(j["reference"]["match"] is True and j["reference"]["first_mismatch"] is None, j)
    check(j["exit_code"] == 0 and j["backend"] in ("cpu", "cuda"), j)
    check(j["shapes"]["tokens"] == 96 and j["shapes"]["hidden"] == 512 and j["shapes"]["topk"] == 8, j)
    check(j["scheme"]["name"] == "mxfp8" and j["scheme"]["group_size"] == 32, j)
    check(j["quality"]["snr_db"] > 30 and 0 < j["quality"]["max_rel_err"] <= 2 ** -4, j)
    check(j["timing"]["median_us"] > 0 and j["timing"]["bytes"] > 0 and j["timing"]["iters"] == 1, j)
    # bytes = T*H*2 + T*H + T*(H/128)*4 + T*K*(4 + 4 + 8 + 4) + T
    check(j["timing"]["bytes"] == 96 * 512 * 3 + 96 * 4 * 4 + 96 * 8 * 20 + 96, j["timing"])
    p = run("--json", "--input", "/nonexistent/x.safetensors", expect_rc=2)
    j = json.loads(p.stdout)
    check("cannot open" in j["error"] and j["exit_code"] == 2, j)
    for usage in [["--scheme", "foo"], ["-T", "-5"]]:  # command-line errors too
        j = json.loads(run("--json", *usage, expect_rc=2).stdout)
        check(j["exit_code"] == 2 and j["error"].startswith("megamoe-stage: error: "), j)


def case_roundtrip():
    """--save-inputs then --input gives byte-identical --output files; other dtypes too."""
    with tempfile.TemporaryDirectory() as d:
        inp, o1, o2, o3 = (os.path.join(d, n) for n in ["in.st", "o1.st", "o2.st", "o3.st"])
        expect_pass(["-T", "100", "-H", "384", "--iters", "1", "--scheme", "fp32-g32",
                     "--save-inputs", inp, "--output", o1, "--seed", "3"])
        p = expect_pass(["--input", inp, "--output", o2, "--iters", "1", "--scheme", "fp32-g32"])
        check(f"input: {inp}" in p.stdout, p.stdout)
        b1, b2 = open(o1, "rb").read(), open(o2, "rb").read()
        check(b1 == b2, "--output files differ between the generated run and the --input run")
        ins = tensors(inp)
        check({k: v[:2] for k, v in ins.items()} == {
            "hidden_states": ("BF16", [100, 384]), "topk_ids": ("I32", [100, 8]),
            "topk_weights": ("F32", [100, 8]), "is_padding": ("BOOL", [100])}, ins.keys())
        outs = tensors(o1)
        check({k: v[:2] for k, v in outs.items()} == {
            "x_fp8": ("F8_E4M3", [100, 384]), "x_sf": ("F32", [100, 12]),
            "topk_idx_out": ("I64", [100, 8]), "topk_weights_out": ("F32", [100, 8])}, outs)
        idx = struct.unpack("<800q", outs["topk_idx_out"][2])
        check(all(v == -1 for v in idx[4 * 8:5 * 8]) and all(0 <= v < 256 for v in idx[:32]), idx[:40])
        # Same values as F32 hidden / I64 ids / BF16 weights / U8 padding: same x_fp8, x_sf, ids.
        hs, ids, w, pad = (ins[k] for k in ["hidden_states", "topk_ids", "topk_weights", "is_padding"])
        alt = os.path.join(d, "alt.st")
        write_st(alt, {"is_padding": ("U8", pad[1], pad[2]),
                       "hidden_states": ("F32", hs[1], bf16_to_f32_bytes(hs[2])),
                       "topk_weights": ("BF16", w[1], f32_to_bf16_bytes(w[2])),
                       "topk_ids": ("I64", ids[1], i32_to_i64_bytes(ids[2]))})
        p = expect_pass(["--input", alt, "--output", o3, "--iters", "1", "--scheme", "fp32-g32"])
        check("hidden_states float32, topk_ids int64, topk_weights bfloat16, is_padding uint8" in p.stdout,
              p.stdout)
        o3t = tensors(o3)
        for k in ["x_fp8", "x_sf", "topk_idx_out"]:
            check(o3t[k] == outs[k], f"{k} differs between bf16 and fp32 copies of the same input")


def case_errors():
    """Each broken input file exits 2 with a message naming file, tensor and problem."""
    with tempfile.TemporaryDirectory() as d:
        good = os.path.join(d, "good.st")
        run("-T", "10", "-H", "256", "--save-inputs", good, "--iters", "1", expect_rc=0)
        raw = open(good, "rb").read()
        ts = tensors(good)
        bad = os.path.join(d, "bad.st")

        def variant(mutate=None, **kw):
            t = dict(ts)
            if mutate:
                mutate(t)
            write_st(bad, t, **kw)
            return ["--input", bad, "--iters", "1"]

        missing = os.path.join(d, "nope.safetensors")
        expect_error(["--input", missing], missing, "cannot open")
        open(bad, "wb").write(raw[:5])
        expect_error(["--input", bad], bad, "truncated file", "5 bytes")
        open(bad, "wb").write(raw[:100])
        expect_error(["--input", bad], bad, "bad header length")
        open(bad, "wb").write(raw[:len(raw) - 7])
        expect_error(["--input", bad], bad, "out of range", "truncated file?")
        open(bad, "wb").write(struct.pack("<Q", 1 << 60) + raw[8:])
        expect_error(["--input", bad], bad, "bad header length")
        expect_error(variant(raw_header=b"{\"hidden_states\": [1, 2"), bad, "invalid JSON header")
        expect_error(variant(raw_header=b"[1, 2, 3]"), bad, "expected a JSON object, got array")
        expect_error(variant(lambda t: t.pop("topk_ids")), bad, "missing tensor 'topk_ids'",
                     "hidden_states, is_padding, topk_weights")
        hs = ts["hidden_states"]
        expect_error(variant(lambda t: t.update(hidden_states=("F64", [10, 64], hs[2]))), bad,
                     "tensor 'hidden_states'", "expected dtype BF16, F16 or F32, got F64")
        expect_error(variant(lambda t: t.update(topk_ids=("F32",) + ts["topk_ids"][1:])), bad,
                     "tensor 'topk_ids'", "expected dtype I32 or I64, got F32")
        expect_error(variant(lambda t: t.update(is_padding=("I32", [10], b"\0" * 40))), bad,
                     "tensor 'is_padding'", "expected dtype BOOL or U8, got I32")
        expect_error(variant(lambda t: t.update(hidden_states=("BF16", [2560], hs[2]))), bad,
                     "tensor 'hidden_states'", "expected rank 2 [T, H], got rank 1 with shape [2560]")
        w = ts["topk_weights"]
        expect_error(variant(lambda t: t.update(topk_weights=("F32", [10, 4], w[2][:160]))), bad,
                     "tensor 'topk_weights'", "expected shape [10, 8]", "got [10, 4]")
        ids = ts["topk_ids"]
        expect_error(variant(lambda t: t.update(topk_ids=("I32", [9, 8], ids[2][:288]))), bad,
                     "inconsistent T", "hidden_states has 10 tokens", "topk_ids has 9")
        expect_error(variant(lambda t: t.update(is_padding=("BOOL", [12], b"\0" * 12))), bad,
                     "inconsistent T", "is_padding has 12")
        expect_error(variant(header_override={"topk_ids": {"data_offsets": [0, 1 << 40]}}), bad,
                     "tensor 'topk_ids'", "out of range")
        expect_error(variant(header_override={"topk_ids": {"shape": [10, 9]}}), bad,
                     "tensor 'topk_ids'", "needs 360 bytes")
        expect_error(variant(header_override={"topk_ids": {"shape": [10, -8]}}), bad,
                     "tensor 'topk_ids'", "non-negative integer sizes")
        # A megamoe::Error (validation) is printed as-is.
        expect_error(variant(lambda t: t.update(hidden_states=("BF16", [20, 64], hs[2][:2560]),
                                                topk_ids=("I32", [20, 4], ids[2]),
                                                topk_weights=("F32", [20, 4], w[2]),
                                                is_padding=("BOOL", [20], b"\0" * 20))),
                     "multiple of 128")


def case_usage():
    """Bad command lines exit 2."""
    expect_error(["--no-such-flag"])
    expect_error(["--scheme", "fp16"], "--scheme")
    expect_error(["--device", "tpu"], "--device")
    expect_error(["--input", "x.safetensors", "-T", "8"], "excludes")
    expect_error(["-T", "8", "-K", "9", "--experts", "8"], "--topk 9", "--experts 8")
    expect_error(["-T", "8", "-H", "200"], "hidden_size to be a multiple of 128")
    expect_error(["--iters", "0"], "--iters")


def case_device():
    """--device cpu works; --device cuda works or explains why not; auto always works."""
    p = expect_pass(SMALL + ["--device", "cpu"])
    check(p.stdout.splitlines()[1].startswith("backend: cpu"), p.stdout)
    expect_pass(SMALL + ["--device", "auto"])
    p = run(*SMALL, "--device", "cuda")
    if p.returncode == 0:
        check("reference: bit-exact match" in p.stdout and "backend: cuda" in p.stdout, p.stdout)
    else:
        check(p.returncode == 2 and "--device cuda" in p.stderr, f"rc {p.returncode}: {p.stderr}")


def feed_fifo(path, payload):
    """Open FIFO @p path for writing in a thread (a reader blocks until a writer opens)."""
    def writer():
        try:
            with open(path, "wb") as f:
                f.write(payload)
        except OSError:  # the reader closed first
            pass
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    return t


def unblock_fifo_writer(path):
    """Open and close FIFO @p path for reading, so that a feed_fifo writer's open returns."""
    os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))


def case_hostile():
    """Huge, wrapping or inconsistent numbers and unreadable files exit 2 with a clear
    message (never a crash); T = 0 succeeds with nothing to stage."""
    int64_max = 2 ** 63 - 1
    # shared_x_sf needs ceil(T / bm) * round_up(bm, 128) rows: T + bm - 1 and bm + 127 must not wrap.
    for bm in [int64_max, 2 ** 63 - 127]:
        expect_error(SMALL + ["--shared-block-m", str(bm)], "--shared-block-m",
                     "shared_x_sf row count", "does not fit in int64")
    for bm in [2 ** 62, 2 ** 63 - 128]:  # the rows fit, rows * 4 words * 4 bytes does not
        expect_error(SMALL + ["--shared-block-m", str(bm)], "output 'shared_x_sf'",
                     "does not fit in int64")
    # 2^44 rows * 16 bytes = 256 TiB: past any host, so the allocation itself fails.
    expect_error(SMALL + ["--shared-block-m", str(2 ** 44)], "cannot allocate 281474976710656 bytes",
                 "output 'shared_x_sf'", "out of host memory")
    p = expect_pass(SMALL + ["--shared-block-m", str(2 ** 20)])  # one block of 2^20 rows
    check("shared_x_sf [1048576, 4]" in p.stdout, p.stdout)

    # Byte counts of the generated tensors.
    expect_error(["-T", str(2 ** 62), "-H", "128", "-K", "1"], "tensor 'hidden_states'",
                 "BF16 [4611686018427387904, 128]", "does not fit in int64")
    expect_error(["-T", "1", "-H", str(2 ** 62), "-K", "1"], "tensor 'hidden_states'", "does not fit in int64")
    expect_error(["-T", str(2 ** 40), "-H", "128", "-K", "1"], "cannot allocate", "tensor 'hidden_states'",
                 "out of host memory")
    p = run("--json", "-T", str(2 ** 62), "-H", "128", "-K", "1", expect_rc=2)
    j = json.loads(p.stdout)
    check("does not fit in int64" in j["error"] and j["exit_code"] == 2, j)
    # Integer flags: decimal, in range, never saturated or read as octal/hex by the parser.
    for flag, value, needles in [
            ("-T", "-1", ["--tokens", "out of range [0, 9223372036854775807]"]),
            ("-T", str(2 ** 63), ["--tokens", "out of range"]),
            ("-T", str(2 ** 64 + 96), ["--tokens", "out of range"]),
            ("-T", "0x10", ["--tokens", "expected a decimal integer, got '0x10'"]),
            ("-T", "1e3", ["--tokens", "expected a decimal integer"]),
            ("-H", "-128", ["--hidden", "expected a positive multiple of 128, got -128"]),
            ("-K", "0", ["--topk", "out of range [1, "]),
            ("--iters", "-3", ["--iters", "out of range [1, 2147483647]"]),
            ("--iters", str(2 ** 40), ["--iters", "out of range [1, 2147483647]"]),
            ("--seed", "-1", ["--seed", "out of range [0, 4294967295]"]),
            ("--seed", str(2 ** 32), ["--seed", "out of range [0, 4294967295]"]),
            ("--pad-every", "-2", ["--pad-every", "out of range"]),
            ("--experts", str(2 ** 31), ["--experts", "out of range [1, 2147483647]"]),
            ("--shared-block-m", str(2 ** 63), ["--shared-block-m", "out of range"]),
            ("--shared-block-m", str(-2 ** 63 - 1), ["--shared-block-m", "out of range"])]:
        expect_error(small_with(flag, value), *needles)
    p = expect_pass(small_with("-T", "010"))  # decimal 10, not octal 8
    check("shapes: T=10 " in p.stdout, p.stdout)

    with tempfile.TemporaryDirectory() as d:
        # Files that cannot be read as a whole: a directory, a FIFO, an empty device.
        expect_error(["--input", d], d, "is a directory")
        fifo = os.path.join(d, "fifo")
        os.mkfifo(fifo)
        feed = feed_fifo(fifo, b"\x10" + b"\0" * 7 + b"{}" * 8)
        expect_error(["--input", fifo], fifo, "cannot determine the file size")
        unblock_fifo_writer(fifo)  # megamoe-stage refuses the FIFO without opening it
        feed.join(timeout=10)
        expect_error(["--input", os.devnull], "not a regular file (a character device)")

        good = os.path.join(d, "good.st")
        run("-T", "10", "-H", "256", "--save-inputs", good, "--iters", "1", expect_rc=0)
        ts = tensors(good)
        bad = os.path.join(d, "bad.st")

        def with_extra(dtype, shape):
            write_st(bad, {**ts, "extra": (dtype, shape, b"")})
            return ["--input", bad]

        # numel * dtype size wraps to 0 in 64 bits for each of these: the 0-byte span must not pass.
        for dtype, shape in [("I64", [1, 2 ** 62]), ("F32", [2 ** 61, 2]), ("I64", [2 ** 31, 2 ** 31])]:
            expect_error(with_extra(dtype, shape), bad, "tensor 'extra'", "data_offsets span 0 bytes",
                         "needs more than 2^63 - 1 bytes")
        for shape in [[2 ** 32, 2 ** 32], [2 ** 63], [2 ** 64 - 1]]:
            expect_error(with_extra("U8", shape), bad, "tensor 'extra'", "shape too large")
        expect_error(with_extra("U8", [2 ** 64 + 1]), bad, "tensor 'extra'", "non-negative integer sizes")
        write_st(bad, dict(ts), header_override={"hidden_states": {"shape": [2, 2 ** 61]}})
        expect_error(["--input", bad], "tensor 'hidden_states'", "needs more than 2^63 - 1 bytes")

        # A file name that is not UTF-8 still gives valid UTF-8 --json output.
        odd = os.path.join(d, "\udcff.st")
        shutil.copyfile(good, odd)
        for args, rc, key in [(["--input", odd, "--iters", "1"], 0, "input"),
                              (["--input", odd + ".missing"], 2, "error")]:
            p = run("--json", *args, expect_rc=rc)
            j = json.loads(p.stdout.encode("utf-8"))  # a stray 0xff byte would not encode
            check("\ufffd" in json.dumps(j[key], ensure_ascii=False), j)

        # T = 0: nothing to stage, every output empty, the report says so.
        empty, out, saved = (os.path.join(d, n) for n in ["empty.st", "out.st", "saved.st"])
        for hs_dtype in ["BF16", "F32"]:
            write_st(empty, {"hidden_states": (hs_dtype, [0, 256], b""), "topk_ids": ("I32", [0, 8], b""),
                             "topk_weights": ("F32", [0, 8], b""), "is_padding": ("BOOL", [0], b"")})
            p = run("--input", empty, "--iters", "1", "--output", out, "--save-inputs", saved, expect_rc=0)
            for line in ["shapes: T=0 H=256 K=8", "SNR: n/a (no tokens)", "max relative error: n/a (no tokens)",
                         "bandwidth: n/a (0 bytes per call, no tokens)", "reference: bit-exact match"]:
                check(line in p.stdout, f"T = 0 ({hs_dtype}): no {line!r} in\n{p.stdout}")
            check(tensors(out) == {
                "x_fp8": ("F8_E4M3", [0, 256], b""), "x_sf": ("I32", [0, 2], b""),
                "topk_idx_out": ("I64", [0, 8], b""), "topk_weights_out": ("F32", [0, 8], b"")}, tensors(out))
            check(tensors(saved)["hidden_states"] == (hs_dtype, [0, 256], b""), tensors(saved))
            run("--input", saved, "--iters", "1", expect_rc=0)
        p = run("--input", empty, "--iters", "1", "--json", expect_rc=0)
        j = json.loads(p.stdout)
        check(j["shapes"]["tokens"] == 0 and j["timing"]["bytes"] == 0 and j["timing"]["gbps"] is None, j)
        check(j["quality"]["snr_db"] is None and j["reference"]["match"] is True, j)
        p = run("-T", "0", "-H", "512", "--iters", "1", "--shared-block-m", "64", expect_rc=0)
        check("shared_x_sf [0, 4]" in p.stdout and "reference: bit-exact match" in p.stdout, p.stdout)



def case_router():
    """--router: the fused router, bit-exact against both references, in every scheme and
    shape the router takes; its flags, report, JSON, outputs and errors."""
    for extra in [[], ["--logits-dtype", "fp32"], ["--experts", "384", "-K", "6"], ["--experts", "512", "-K", "16"],
                  ["--experts", "7", "-K", "7", "--pad-every", "0"], ["--routed-scaling-factor", "1"],
                  ["--shared-block-m", "64"], ["--scheme", "fp32-g128"], ["--scheme", "ue8m0-g128"],
                  ["--scheme", "fp32-g32"], ["--scheme", "mxfp8-e5m2"]]:
        p = expect_pass(SMALL + ["--router"] + extra, min_snr=22.0 if "mxfp8-e5m2" in extra else 30.0)
        check("router reference: bit-exact match" in p.stdout, f"--router {extra}:\n{p.stdout}")
        check(re.search(r"^router: E=\d+ K=\d+, router_logits (bfloat16|float32), .*route alone ", p.stdout, re.M),
              p.stdout)
    p = run(*SMALL, "--router", "--experts", "384", "-K", "6", "--json", expect_rc=0)
    j = json.loads(p.stdout)
    r = j["router"]
    check(r["experts"] == 384 and r["topk"] == 6 and r["logits"] == "bfloat16" and r["routed_scaling_factor"] == 1.5, r)
    check(r["reference"]["match"] is True and r["route_median_us"] > 0 and j["reference"]["match"] is True, j)
    # bytes: T*H*2 + T*H + T*(H/128)*4 + T*K*(8 + 4) + T, plus logits (bf16), bias, ids, weights
    check(j["timing"]["bytes"] == 96 * 512 * 3 + 96 * 4 * 4 + 96 * 6 * 12 + 96 + 96 * 384 * 2 + 384 * 4 + 96 * 6 * 8,
          j["timing"])
    check(json.loads(run(*SMALL, "--json", expect_rc=0).stdout)["router"] is None, "router without --router")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.st")
        run(*SMALL, "--router", "-K", "6", "--output", out, expect_rc=0)
        ts = tensors(out)
        check(ts["topk_ids"][:2] == ("I32", [96, 6]) and ts["topk_weights"][:2] == ("F32", [96, 6]), ts.keys())
        ids = struct.unpack(f"<{96 * 6}i", ts["topk_ids"][2])
        idx = struct.unpack(f"<{96 * 6}q", ts["topk_idx_out"][2])
        check(list(ids) == list(idx), "topk_idx_out is topk_ids widened")
        check(all(i == -1 for i in ids[4 * 6:5 * 6]) and all(0 <= i < 256 for i in ids[:6]), ids[:30])
        expect_error(["--router", "--input", out], "excludes")
        expect_error(["--router", "--save-inputs", out], "excludes")
    p = run("-T", "0", "-H", "512", "--iters", "1", "--router", expect_rc=0)
    check("router reference: bit-exact match" in p.stdout and "reference: bit-exact match" in p.stdout, p.stdout)
    check("bandwidth: n/a" in p.stdout, p.stdout)  # no tokens, no rate
    # Refused before the [T, E] logits are generated, and under --explain too.
    expect_error(["-T", "100000", "-H", "128", "--router", "--experts", "100000"], "1 to 512 experts")
    expect_error(["-T", "4", "-H", "128", "--router", "--experts", "1000", "--explain"], "1 to 512 experts")
    p = run("-T", "4", "-H", "128", "--router", "--explain", expect_rc=0)
    check(p.stdout.startswith("plan: cpu backend") and "--router: route_and_stage" in p.stdout, p.stdout)
    expect_error(SMALL + ["--router", "--experts", "600"], "router_logits", "1 to 512 experts")
    expect_error(SMALL + ["--router", "-K", "17", "--experts", "300"], "top_k")
    expect_error(SMALL + ["--router", "--routed-scaling-factor", "inf"], "routed_scaling_factor", "finite")
    expect_error(SMALL + ["--routed-scaling-factor", "2"], "--router")
    expect_error(SMALL + ["--logits-dtype", "fp32"], "--router")
    expect_error(SMALL + ["--router", "--logits-dtype", "fp16"], "--logits-dtype")
    p = run("--help", expect_rc=0)
    for word in ["--router", "--routed-scaling-factor", "--logits-dtype", "router_logits",
                 "e_score_correction_bias", "router reference"]:
        check(word in p.stdout, f"--help lacks {word!r}")

def case_explain():
    """--explain prints megamoe::explain's plan; alone it exits 0 without running."""
    p = run("-T", "96", "-H", "512", "--explain", expect_rc=0)
    check(re.match(r"plan: cpu backend", p.stdout) and "time:" not in p.stdout, p.stdout)
    p = expect_pass(SMALL + ["--explain"])
    lines = p.stdout.splitlines()
    check(lines[0].startswith("plan: ") and "time:" in p.stdout, p.stdout)  # plan before the run
    j = json.loads(run("-T", "96", "-H", "512", "--explain", "--json", expect_rc=0).stdout)
    check(j["plan"].startswith("cpu backend") and j["exit_code"] == 0 and "timing" not in j, j)
    j = json.loads(run(*SMALL, "--explain", "--json", expect_rc=0).stdout)
    check(j["plan"].startswith("cpu backend") and j["reference"]["match"] is True, j)
    check(json.loads(run(*SMALL, "--json", expect_rc=0).stdout)["plan"] is None, "plan without --explain")
    # The plan validates: an invalid call is an error, not a plan.
    expect_error(["-T", "8", "-H", "200", "--explain"], "megamoe-stage: error:", "multiple of 128")


def case_threads():
    """--threads N sets the CPU backend's threads, reported on the backend line."""
    for n in ["1", "2"]:
        p = expect_pass(SMALL + ["--device", "cpu", "--threads", n])
        check(re.search(rf"^backend: cpu, device cpu \(\d+ hardware threads\), {n} staging threads$", p.stdout,
                        re.M), p.stdout)
        j = json.loads(run(*SMALL, "--device", "cpu", "--threads", n, "--json", expect_rc=0).stdout)
        check(j["cpu_threads"] == int(n), j)
    p = expect_pass(SMALL + ["--device", "cpu"])  # default: every CPU this process may use
    cpus = len(os.sched_getaffinity(0))
    check(f"), {cpus} staging threads" in p.stdout, f"expected {cpus} staging threads:\n{p.stdout}")
    expect_error(SMALL + ["--threads", "2000"], "--threads")
    expect_error(SMALL + ["--threads", "-1"], "--threads")


def case_messages():
    """Plain usage messages; library errors carry the CLI's own prefix."""
    for h in ["0", "-128"]:
        p = expect_error(["-T", "8", "-H", h], f"--hidden: expected a positive multiple of 128, got {h}")
        check("e+308" not in p.stderr and "9223372036854775807" not in p.stderr, p.stderr)
    p = expect_error(["-T", "8", "-H", "200"], "hidden_size to be a multiple of 128")
    check(p.stderr.startswith("megamoe-stage: error: "), p.stderr)
    p = expect_error(["--input", "/nonexistent/x.safetensors"], "cannot open")
    check(p.stderr.startswith("megamoe-stage: error: "), p.stderr)


FORMATS = {  # --scheme: (x_q dtype and width for H = 512, x_sf dtype and width, x_scales, min SNR)
    "mxfp8": ("F8_E4M3", 512, "I32", 4, False, 28), "ue8m0-g128": ("F8_E4M3", 512, "I32", 1, False, 28),
    "fp32-g128": ("F8_E4M3", 512, "F32", 4, False, 28), "fp32-g128-sm90": ("F8_E4M3", 512, "F32", 4, False, 28),
    "fp32-g32": ("F8_E4M3", 512, "F32", 16, False, 28), "mxfp8-e5m2": ("F8_E5M2", 512, "I32", 4, False, 22),
    "mxfp4": ("U8", 256, "I32", 4, False, 15), "mxfp4-rne": ("U8", 256, "I32", 4, False, 15),
    "nvfp4-static": ("U8", 256, "I32", 8, False, 17), "nvfp4-per-token": ("U8", 256, "I32", 8, True, 17)}


def case_formats():
    """Every --scheme, bit-exact against the reference, with the shapes of output_shapes and
    an SNR from dequantizing; --amax-floor and --global-scale reach the call and the check."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.st")
        for s, (qdt, qcols, sfdt, sfcols, xs, min_snr) in FORMATS.items():
            p = expect_pass(SMALL + ["--scheme", s, "--output", out], min_snr=min_snr)
            check(snr(p.stdout) < 40, f"{s}: implausible SNR\n{p.stdout}")
            ts = tensors(out)
            xq = "x_fp8" if qdt.startswith("F8_") else "x_q"
            check(ts[xq][:2] == (qdt, [96, qcols]) and ts["x_sf"][:2] == (sfdt, [96, sfcols]), (s, ts.keys()))
            check(("x_scales" in ts) == xs and (not xs or ts["x_scales"][:2] == ("F32", [96])), (s, ts.keys()))
            j = json.loads(run(*SMALL, "--scheme", s, "--json", expect_rc=0).stdout)
            check(j["reference"]["match"] is True and j["scheme"]["x_q_shape"] == [96, qcols], j["scheme"])
        # fp4 bytes: x_q is T*H/2; nvfp4-per-token adds x_scales, nvfp4-static the global scale.
        b8 = json.loads(run(*SMALL, "--json", expect_rc=0).stdout)["timing"]["bytes"]
        b4 = json.loads(run(*SMALL, "--scheme", "nvfp4-per-token", "--json", expect_rc=0).stdout)["timing"]["bytes"]
        check(b4 == b8 - 96 * 256 + 96 * 4 * 4 + 96 * 4, (b8, b4))  # x_sf: 8 words a row instead of 4
    # The floor: an all-zero-ish input would show it; here it must reach the reference too.
    for s in ["mxfp8", "fp32-g128", "mxfp8-e5m2", "mxfp4", "nvfp4-per-token"]:
        p = expect_pass(SMALL + ["--scheme", s, "--amax-floor", "1e-10"], min_snr=15)
        j = json.loads(run(*SMALL, "--scheme", s, "--amax-floor", "1e-10", "--json", expect_rc=0).stdout)
        check(abs(j["scheme"]["amax_floor"] - 1e-10) < 1e-15 and "+floor=1" in j["scheme"]["library_name"],
              j["scheme"])
    # A huge floor changes every scale: still bit-exact (the reference gets the same floor).
    expect_pass(SMALL + ["--amax-floor", "1000"], min_snr=-100)
    p = expect_pass(SMALL + ["--scheme", "nvfp4-static"], min_snr=17)
    m = re.search(r"global_scale ([0-9.e+-]+)", p.stdout)
    check(m and float(m.group(1)) > 0, p.stdout)
    p = expect_pass(SMALL + ["--scheme", "nvfp4-static", "--global-scale", "0.5"], min_snr=-100)
    check("global_scale 0.5" in p.stdout, p.stdout)
    # nvfp4-online computes its global scale (the reference checks it with the bytes).
    for floor in ["1e-4", "0"]:
        p = expect_pass(SMALL + ["--scheme", "nvfp4-online", "--amax-floor", floor], min_snr=15)
        m = re.search(r"global_scale ([0-9.e+-]+|inf)", p.stdout)
        check(m is not None, p.stdout)
        j = json.loads(run(*SMALL, "--scheme", "nvfp4-online", "--amax-floor", floor, "--json", expect_rc=0).stdout)
        check(j["reference"]["match"] is True and j["scheme"]["global_scale"] is not None, j)
    expect_error(SMALL + ["--scheme", "nvfp4-online", "--global-scale", "0.5"], "--global-scale", "nvfp4-static")
    j = json.loads(run(*SMALL, "--scheme", "fp32-g128-sm90", "--json", expect_rc=0).stdout)
    check(j["scheme"]["library_name"].startswith("fp8_fp32_g128+floor=1") and j["scheme"]["amax_floor"] < 1e-9,
          j["scheme"])
    expect_error(SMALL + ["--global-scale", "0.5"], "--global-scale", "nvfp4-static")
    expect_error(SMALL + ["--amax-floor", "-1"], "floor")
    # Options that would otherwise be ignored or poison the report: named, exit 2.
    for bad in ["-1e-30", "nan", "inf"]:
        expect_error(SMALL + ["--amax-floor", bad], "--amax-floor", "finite non-negative")
    # Floor 0 (the unit scale): bit-exact against the reference, every family that reads a floor.
    for s in ["mxfp8", "fp32-g128", "mxfp8-e5m2", "mxfp4-rne", "nvfp4-per-token"]:
        p = expect_pass(SMALL + ["--scheme", s, "--amax-floor", "0"], min_snr=15)
        j = json.loads(run(*SMALL, "--scheme", s, "--amax-floor", "0", "--json", expect_rc=0).stdout)
        check(j["scheme"]["amax_floor"] == 0 and j["scheme"]["library_name"].endswith("+floor=0"), j["scheme"])
    for bad in ["inf", "nan", "-1", "0"]:
        expect_error(SMALL + ["--scheme", "nvfp4-static", "--global-scale", bad], "--global-scale", "finite positive")
    expect_error(SMALL + ["--scheme", "nvfp4-static", "--amax-floor", "1"], "--amax-floor", "nvfp4-static")
    p = run("--help", expect_rc=0)
    for word in ["mxfp4", "mxfp4-rne", "nvfp4-static", "nvfp4-per-token", "nvfp4-online", "--amax-floor", "--global-scale",
                 "x_scales", "__metadata__"]:
        check(word in p.stdout, f"--help lacks {word!r}")


def case_metadata():
    """--output and --save-inputs write __metadata__; --input reports it (round trip)."""
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "in.st"), os.path.join(d, "out.st")
        run(*SMALL, "--scheme", "mxfp4-rne", "--amax-floor", "1e-10", "--save-inputs", inp, "--output", out,
            expect_rc=0)
        md = read_st(out)[0]["__metadata__"]
        check(md["scheme"].startswith("mxfp4_rne+floor=1") and md["group_size"] == "32" and
              md["tie_rule"] == "nearest-even" and md["amax_floor"] == "1.00000001e-10" and
              re.match(r"\d+\.\d+\.\d+", md["megamoe_version"]), md)
        md = read_st(inp)[0]["__metadata__"]
        check(md["scheme"].startswith("mxfp4_rne+floor=1") and md["producer"] == "megamoe-stage --save-inputs", md)
        p = expect_pass(["--input", inp, "--iters", "1", "--scheme", "mxfp4-rne", "--amax-floor", "1e-10"],
                        min_snr=15)
        check(re.search(r"^input metadata: .*scheme=mxfp4_rne\+floor=1\S* .*tie_rule=nearest-even", p.stdout,
                        re.M), p.stdout)
        j = json.loads(run("--input", inp, "--iters", "1", "--json", expect_rc=0).stdout)
        check(j["input"]["metadata"]["cli_scheme"] == "mxfp4-rne", j["input"])
        run(*SMALL, "--scheme", "nvfp4-static", "--global-scale", "0.25", "--output", out, expect_rc=0)
        md = read_st(out)[0]["__metadata__"]
        check(md["scheme"] == "nvfp4_static" and md["group_size"] == "16" and md["tie_rule"] == "toward-zero" and
              md["global_scale"] == "0.25", md)
        # A file without __metadata__ reports nothing.
        hs = tensors(inp)
        write_st(inp, hs)
        p = expect_pass(["--input", inp, "--iters", "1"])
        check("input metadata" not in p.stdout, p.stdout)


def case_full_buffer():
    """--full-buffer --max-tokens M: top-k rows T..M-1 are -1 / +0.0, x rows T..M-1 untouched;
    the reference check covers both (in every format)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.st")
        for s in ["mxfp8", "fp32-g32", "mxfp8-e5m2", "mxfp4", "nvfp4-per-token"]:
            p = expect_pass(SMALL + ["--scheme", s, "--full-buffer", "--max-tokens", "128", "--output", out],
                            min_snr=15)
            check("full buffer of 128 rows" in p.stdout, p.stdout)
            ts = tensors(out)
            idx = struct.unpack("<1024q", ts["topk_idx_out"][2])
            w = ts["topk_weights_out"][2]
            check(ts["topk_idx_out"][1] == [128, 8] and all(v == -1 for v in idx[96 * 8:]), idx[96 * 8:])
            check(w[96 * 8 * 4:] == b"\0" * (32 * 8 * 4), "tail weights are not +0.0")
            xq = ts["x_fp8" if "x_fp8" in ts else "x_q"]
            row = len(xq[2]) // 128
            check(xq[1][0] == 128 and xq[2][96 * row:] == b"\x5a" * (32 * row), f"{s}: x_q tail rows were written")
            check(ts["x_sf"][1][0] == 128 and set(ts["x_sf"][2][96 * len(ts["x_sf"][2]) // 128:]) == {0x5a}, s)
            check(read_st(out)[0]["__metadata__"]["full_buffer_rows"] == "128", s)
        p = run("-T", "0", "-H", "512", "--iters", "1", "--full-buffer", "--max-tokens", "16", "--output", out,
                expect_rc=0)
        check("reference: bit-exact match" in p.stdout, p.stdout)
        check(struct.unpack("<128q", tensors(out)["topk_idx_out"][2]) == (-1,) * 128, "T = 0: the whole buffer")
    expect_pass(SMALL + ["--full-buffer", "--max-tokens", "96"])
    # Bytes: the x outputs' T rows, the top-k outputs' M rows (rows T.. of x are not written).
    b = json.loads(run(*SMALL, "--json", expect_rc=0).stdout)["timing"]["bytes"]
    bf = json.loads(run(*SMALL, "--json", "--full-buffer", "--max-tokens", "128", expect_rc=0).stdout)["timing"]["bytes"]
    check(bf == b + (128 - 96) * 8 * (8 + 4), (b, bf))
    expect_error(SMALL + ["--full-buffer"], "--max-tokens")
    expect_error(SMALL + ["--max-tokens", "128"], "--full-buffer")
    expect_error(SMALL + ["--full-buffer", "--max-tokens", "50"], "megamoe-stage: error:")


def case_progress():
    """The progress line: on stderr, only when stdout is a terminal (a pty here)."""
    args = ["-T", "1024", "-H", "1024", "--iters", "1"]  # 2^20 elements: just long enough
    p = run(*args, expect_rc=0)
    check(p.stderr == "", f"progress without a terminal:\n{p.stderr!r}")
    import pty
    master, slave = pty.openpty()
    try:
        q = subprocess.run([EXE, *args], stdout=slave, stderr=subprocess.PIPE, timeout=240)
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 65536)
        except OSError:  # EIO: the pty is closed and drained
            break
        if not b:
            break
        chunks.append(b)
    os.close(master)
    out, err = b"".join(chunks).decode(), q.stderr.decode()
    check(q.returncode == 0 and "reference: bit-exact match" in out, out)
    for step in ["generating the inputs", "staging (1 warmup + 1 timed calls)", "checking against the reference"]:
        check(f"megamoe-stage: {step}..." in err, f"no {step!r} in {err!r}")
    check(err.endswith("\r\x1b[K") and "megamoe-stage:" not in out, (err, out))
    p = run("-T", "96", "-H", "512", "--iters", "1", "--json", expect_rc=0)
    check(p.stderr == "", p.stderr)


def run_quick(*args, expect_rc, seconds=20):
    """run(), but a run still going after @p seconds (a hang) is killed and fails the case."""
    try:
        p = subprocess.run([EXE, *args], capture_output=True, text=True, errors="surrogateescape",
                           timeout=seconds)
    except subprocess.TimeoutExpired:
        raise Failure(f"megamoe-stage {' '.join(args)}: still running after {seconds} s (killed)")
    if p.returncode != expect_rc:
        raise Failure(f"megamoe-stage {' '.join(args)}: exit {p.returncode}, expected {expect_rc}\n"
                      f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def case_deep_json():
    """A header nested 200,000 levels deep (a ~400 KB file) exits 2 with a short message,
    never a stack overflow; JSON quoted in messages is cut to a few hundred bytes."""
    with tempfile.TemporaryDirectory() as d:
        good = os.path.join(d, "good.st")
        run("-T", "10", "-H", "256", "--save-inputs", good, "--iters", "1", expect_rc=0)
        ts = tensors(good)
        bad = os.path.join(d, "deep.st")
        n = 200000
        for shape in [b"[" * n + b"]" * n, b"[1, " + b"[" * n + b"]" * n + b"]", b"[" * n]:
            hb = b'{"hidden_states": {"dtype": "BF16", "shape": ' + shape + b', "data_offsets": [0, 0]}}'
            with open(bad, "wb") as f:
                f.write(struct.pack("<Q", len(hb)) + hb)
            check(os.path.getsize(bad) > 200000, "the nested header is written")
            p = run_quick("--input", bad, "--iters", "1", expect_rc=2)
            check("invalid JSON header: nested deeper than 64 levels" in p.stderr and len(p.stderr) < 1000,
                  f"no short nesting message: {p.stderr[:2000]!r}")
            j = json.loads(run_quick("--input", bad, "--json", expect_rc=2).stdout)
            check("nested deeper than 64 levels" in j["error"] and j["exit_code"] == 2, str(j)[:2000])
        # Nested deep in a string is no nesting: brackets in names and metadata do not count.
        write_st(bad, {**ts, "[" * 1000: ("U8", [1], b"\0")})
        hdr, data = read_st(bad)
        hdr["__metadata__"] = {"note": "{[\\\"" * 1000}
        hb = json.dumps(hdr).encode()
        with open(bad, "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb + data)
        run_quick("--input", bad, "--iters", "1", expect_rc=0)
        # Nested below the limit, or wide: the message quotes the start of the value only.
        for shape in ["[" * 60 + "1" + "]" * 60, "[" + ", ".join(["-1"] * 200000) + "]",
                      "[" + ", ".join(["1"] * 10) + ", \"" + "x" * 100000 + "\"]"]:
            write_st(bad, dict(ts), raw_header=('{"topk_ids": {"dtype": "I32", "shape": ' + shape +
                                                ', "data_offsets": [0, 0]}}').encode())
            p = run_quick("--input", bad, expect_rc=2)
            check("tensor 'topk_ids'" in p.stderr and "non-negative integer sizes" in p.stderr and
                  len(p.stderr) < 1500, f"{len(p.stderr)} bytes: {p.stderr[:2000]!r}")
        # Invalid JSON: the parser's message (which quotes the last token) is cut too.
        write_st(bad, dict(ts), raw_header=b'{"' + b"k" * 100000)
        p = run_quick("--input", bad, expect_rc=2)
        check("invalid JSON header" in p.stderr and len(p.stderr) < 1000, p.stderr[:2000])
        # A tensor name of 100,000 bytes is quoted in part.
        write_st(bad, {**ts, "n" * 100000: ("F64", [1], b"\0" * 7)})
        p = run_quick("--input", bad, expect_rc=2)
        check("needs 8 bytes" in p.stderr and len(p.stderr) < 1000, p.stderr[:2000])


def zero_width_file(path, rows, extra=None):
    """hidden_states BF16 [rows, 0], topk_ids I32 / topk_weights F32 [rows, 0]: no bytes at all."""
    ts = {"hidden_states": ("BF16", [rows, 0], b""), "topk_ids": ("I32", [rows, 0], b""),
          "topk_weights": ("F32", [rows, 0], b"")}
    write_st(path, {**ts, **(extra or {})})


def case_zero_width():
    """2^40 tokens of H = K = 0 (a file of a few hundred bytes): the library accepts it and
    the CLI's own loops (quality, dequantization, reference, shared rows, I/O) finish at
    once, bounded by the bytes that exist."""
    with tempfile.TemporaryDirectory() as d:
        inp, out, saved = (os.path.join(d, n) for n in ["in.st", "out.st", "saved.st"])
        rows = 2 ** 40
        zero_width_file(inp, rows)
        check(os.path.getsize(inp) < 300, os.path.getsize(inp))
        for s in ["mxfp8", "ue8m0-g128", "fp32-g128", "fp32-g32", "mxfp8-e5m2", "mxfp4", "mxfp4-rne",
                  "nvfp4-static"]:
            extras = [[], ["--output", out, "--save-inputs", saved], ["--full-buffer", "--max-tokens", str(rows + 1)]]
            if s in ("mxfp8", "ue8m0-g128", "mxfp8-e5m2", "mxfp4", "mxfp4-rne"):
                extras.append(["--shared-block-m", "64"])
            for extra in extras:
                p = run_quick("--input", inp, "--iters", "1", "--scheme", s, *extra, expect_rc=0)
                for line in [f"shapes: T={rows} H=0 K=0", "SNR: n/a (no hidden values, H = 0)",
                             "max relative error: n/a (no hidden values, H = 0)", "reference: bit-exact match"]:
                    check(line in p.stdout, f"{s} {extra}: no {line!r} in\n{p.stdout}")
        ts = tensors(out)
        check(all(v[1][0] == rows and v[2] == b"" for v in ts.values()), ts)
        check(tensors(saved)["hidden_states"] == ("BF16", [rows, 0], b""), tensors(saved))
        j = json.loads(run_quick("--input", inp, "--iters", "1", "--json", expect_rc=0).stdout)
        check(j["shapes"]["tokens"] == rows and j["quality"]["max_rel_err"] is None and
              j["quality"]["snr_db"] is None and j["reference"]["match"] is True, j)
        # Per-token x_scales would be 4 TiB: refused, not attempted.
        run_quick("--input", inp, "--iters", "1", "--scheme", "nvfp4-per-token", expect_rc=2)
        # With an is_padding of 2^20 bytes the rows exist: still quick.
        zero_width_file(inp, 2 ** 20, {"is_padding": ("BOOL", [2 ** 20], b"\1" * 2 ** 20)})
        p = run_quick("--input", inp, "--iters", "1", expect_rc=0)
        check("is_padding bool (1048576 padded)" in p.stdout and "reference: bit-exact match" in p.stdout, p.stdout)


def case_same_file():
    """--output (or --save-inputs) on the --input file, under any name, is refused before
    any work, and the input is left as it was; so is --output on the --save-inputs file."""
    with tempfile.TemporaryDirectory() as d:
        inp = os.path.join(d, "in.st")
        run("-T", "10", "-H", "256", "--save-inputs", inp, "--iters", "1", expect_rc=0)
        before = open(inp, "rb").read()
        link, hard = os.path.join(d, "link.st"), os.path.join(d, "hard.st")
        os.symlink(inp, link)
        os.link(inp, hard)
        sub = os.path.join(d, "sub")
        os.mkdir(sub)
        names = [inp, os.path.join(d, ".", "in.st"), os.path.join(sub, "..", "in.st"), link, hard]
        for name in names:
            for flag in ["--output", "--save-inputs"]:
                p = expect_error(["--input", inp, "--iters", "1", flag, name], f"{flag} {name}: the same file as --input")
                check(p.stdout == "", p.stdout)
                check(open(inp, "rb").read() == before, f"{flag} {name} changed the input file")
            expect_error(["--input", name, "--iters", "1", "--output", inp], "the same file as --input")
        j = json.loads(run("--input", inp, "--output", link, "--json", expect_rc=2).stdout)
        check("the same file as --input" in j["error"] and j["exit_code"] == 2, j)
        # --explain alone writes nothing, but the command line is refused all the same.
        expect_error(["--input", inp, "--output", inp, "--explain"], "the same file as --input")
        # Neither file exists yet: the same path under two spellings.
        new = os.path.join(d, "new.st")
        expect_error(SMALL + ["--output", new, "--save-inputs", os.path.join(sub, "..", "new.st")],
                     "the same file as --save-inputs", "overwrite the saved inputs")
        check(not os.path.exists(new), "a refused command line created its output")
        # Different files pass.
        expect_pass(["--input", inp, "--iters", "1", "--output", new])
        expect_pass(["--input", link, "--iters", "1", "--output", new])
        check(open(inp, "rb").read() == before, "the input file changed")


def case_nonregular():
    """--input reads regular files only: a FIFO without a writer, a device or a socket exits 2
    at once with "not a regular file", without opening it (a FIFO's open would block)."""
    import socket
    with tempfile.TemporaryDirectory() as d:
        fifo = os.path.join(d, "fifo")
        os.mkfifo(fifo)
        for name, kind in [(fifo, "a FIFO"), ("/dev/zero", "a character device"),
                           (os.devnull, "a character device")]:
            p = run_quick("--input", name, "--iters", "1", expect_rc=2, seconds=10)
            check(f"{name}: not a regular file ({kind})" in p.stderr, p.stderr)
        j = json.loads(run_quick("--input", fifo, "--json", expect_rc=2, seconds=10).stdout)
        check("not a regular file" in j["error"] and j["exit_code"] == 2, j)
        sock_path = os.path.join(d, "sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(sock_path)
            p = run_quick("--input", sock_path, expect_rc=2, seconds=10)
            check("not a regular file (a socket)" in p.stderr, p.stderr)
        finally:
            sock.close()
        # A symlink is followed: to a FIFO it is refused, to a regular file it is read.
        link = os.path.join(d, "link")
        os.symlink(fifo, link)
        p = run_quick("--input", link, expect_rc=2, seconds=10)
        check("not a regular file (a FIFO)" in p.stderr, p.stderr)
        good = os.path.join(d, "good.st")
        run("-T", "10", "-H", "256", "--save-inputs", good, "--iters", "1", expect_rc=0)
        os.remove(link)
        os.symlink(good, link)
        expect_pass(["--input", link, "--iters", "1"])
        expect_error(["--input", d], "is a directory")


def max_rel_err(text):
    m = re.search(r"^max relative error: ([0-9.e+-]+) \(elements with (.*)\)$", text, re.M)
    check(m is not None, f"no 'max relative error: <x> (elements with ...)' line in:\n{text}")
    return float(m.group(1)), m.group(2)


def case_fp4_quality():
    """fp4 schemes report the max relative error over the elements e2m1 resolves in their
    group (|x| >= 0.5 * group scale), clearly below 1; fp8 schemes keep 1e-3 * group amax."""
    for s in ["mxfp4", "mxfp4-rne", "nvfp4-static", "nvfp4-per-token"]:
        for shape in [["-T", "96", "-H", "512"], ["-T", "7", "-H", "128", "--seed", "5"]]:
            p = expect_pass(shape + ["--iters", "1", "--scheme", s], min_snr=15)
            err, rule = max_rel_err(p.stdout)
            check(0 < err < 0.5, f"{s}: max relative error {err}, expected in (0, 0.5):\n{p.stdout}")
            check(rule.startswith("|x| >= 0.5 * group scale"), rule)
        q = json.loads(run(*SMALL, "--scheme", s, "--json", expect_rc=0).stdout)["quality"]
        check(0 < q["max_rel_err"] < 0.5 and q["rel_err_scale_step"] == 0.5 and q["rel_err_floor"] is None, q)
        check(0 < q["rel_err_elements"] <= q["finite_elements"] == 96 * 512, q)
        check(q["rel_err_rule"].startswith("|x| >= 0.5 * group scale"), q)
    for s in ["mxfp8", "fp32-g128", "mxfp8-e5m2"]:
        p = expect_pass(SMALL + ["--scheme", s], min_snr=22.0 if s == "mxfp8-e5m2" else 30.0)
        err, rule = max_rel_err(p.stdout)
        bound = 2 ** -3 if s == "mxfp8-e5m2" else 2 ** -4  # half an ulp: two or three mantissa bits
        check(0 < err <= bound and rule == "|x| > 1e-3 * group amax", p.stdout)
        q = json.loads(run(*SMALL, "--scheme", s, "--json", expect_rc=0).stdout)["quality"]
        check(q["rel_err_floor"] == 1e-3 and q["rel_err_scale_step"] is None and q["rel_err_elements"] > 0, q)
    p = run("--help", expect_rc=0)
    check("0.5 *" in p.stdout and "smallest nonzero" in p.stdout, "--help lacks the fp4 rule")


def e5m2_value(b):
    """The value of an fp8 e5m2 byte (written from the format: 1 sign, 5 exponent bits of bias
    15, 2 mantissa bits; exponent 31 is Inf / NaN)."""
    e, m = (b >> 2) & 0x1F, b & 3
    if e == 0x1F:
        v = float("inf") if m == 0 else float("nan")
    else:
        v = m * 2.0 ** -16 if e == 0 else (1 + m / 4) * 2.0 ** (e - 15)
    return -v if b & 0x80 else v


def case_e5m2():
    """--scheme mxfp8-e5m2 (e5m2 values, UE8M0 scales of amax / 57344, G = 32): bit-exact
    against the reference, x_fp8 written as F8_E5M2, in full-buffer mode, with the shared
    copy and the router too; its bytes decode to the input within half an e5m2 ulp."""
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "in.st"), os.path.join(d, "out.st")
        p = expect_pass(SMALL + ["--scheme", "mxfp8-e5m2", "--save-inputs", inp, "--output", out], min_snr=22)
        check(snr(p.stdout) < 30, f"an SNR e5m2's two mantissa bits cannot give:\n{p.stdout}")
        check("scheme: mxfp8-e5m2 = QuantScheme(" in p.stdout and "x_sf [96, 4] int32" in p.stdout, p.stdout)
        ts = tensors(out)
        check(ts["x_fp8"][:2] == ("F8_E5M2", [96, 512]) and ts["x_sf"][:2] == ("I32", [96, 4]), ts.keys())
        md = read_st(out)[0]["__metadata__"]
        check(md["scheme"] == "mxfp8_e5m2" and md["group_size"] == "32" and md["tie_rule"] == "nearest-even" and
              md["cli_scheme"] == "mxfp8-e5m2", md)
        # Every group's largest magnitude lands in (28672, 57344] before rounding (its scale is
        # the power of two at or above amax / 57344), so its byte is 0x77..0x7B; finite inputs
        # give no Inf / NaN bytes. Decoded with the scales, each value is within half an ulp
        # (2^-3 relative) of the bf16 input.
        q, sf = ts["x_fp8"][2], struct.unpack("<384i", ts["x_sf"][2])
        hs = tensors(inp)["hidden_states"][2]
        x = [v for (v,) in struct.iter_unpack("<f", bf16_to_f32_bytes(hs))]
        check(all((b & 0x7F) <= 0x7B for b in q), "an Inf / NaN byte for finite inputs")
        for t in range(96):
            for g in range(16):
                byte = (sf[t * 4 + g // 4] >> (8 * (g % 4))) & 0xFF
                scale = 2.0 ** (byte - 127)
                grp = range(t * 512 + g * 32, t * 512 + g * 32 + 32)
                amax = max(abs(x[i]) for i in grp)
                check(amax == 0 or 0x77 <= max(q[i] & 0x7F for i in grp) <= 0x7B, (t, g, [q[i] for i in grp]))
                for i in grp:
                    deq = e5m2_value(q[i]) * scale
                    check(abs(deq - x[i]) <= max(abs(x[i]) * 2 ** -3, 2.0 ** -17 * scale), (t, g, i, x[i], deq))
        # Round trip: the saved inputs give the same bytes.
        o2 = os.path.join(d, "o2.st")
        p = expect_pass(["--input", inp, "--output", o2, "--iters", "1", "--scheme", "mxfp8-e5m2"], min_snr=22)
        check(tensors(o2)["x_fp8"] == ts["x_fp8"] and tensors(o2)["x_sf"] == ts["x_sf"], "--input run differs")
        # Full buffer: rows T..M-1 of x_fp8 / x_sf untouched, the top-k tail -1 / +0.0.
        p = expect_pass(SMALL + ["--scheme", "mxfp8-e5m2", "--full-buffer", "--max-tokens", "128", "--output", out],
                        min_snr=22)
        check("full buffer of 128 rows" in p.stdout, p.stdout)
        ts = tensors(out)
        check(ts["x_fp8"][:2] == ("F8_E5M2", [128, 512]) and ts["x_fp8"][2][96 * 512:] == b"\x5a" * (32 * 512),
              "x_fp8 tail rows")
        check(ts["x_sf"][1] == [128, 4] and set(ts["x_sf"][2][96 * 16:]) == {0x5a}, "x_sf tail rows")
        idx = struct.unpack("<1024q", ts["topk_idx_out"][2])
        check(all(v == -1 for v in idx[96 * 8:]), idx[96 * 8:])
    for args in [SMALL + ["--shared-block-m", "64"], SMALL + ["--amax-floor", "1e-10"], SMALL + ["--router"],
                 ["-T", "7", "-H", "128", "--iters", "1", "--seed", "5"], SMALL + ["--amax-floor", "1000"]]:
        p = expect_pass(args + ["--scheme", "mxfp8-e5m2"], min_snr=-100 if "1000" in args else 22)
        check("router reference: bit-exact match" in p.stdout or "--router" not in args, p.stdout)
    j = json.loads(run(*SMALL, "--scheme", "mxfp8-e5m2", "--json", expect_rc=0).stdout)
    sc, qu = j["scheme"], j["quality"]
    check(sc["library_name"] == "mxfp8_e5m2" and sc["scale"] == "ue8m0" and sc["group_size"] == 32 and
          sc["x_q_shape"] == [96, 512] and sc["x_sf_shape"] == [96, 4], sc)
    # Half an ulp of two mantissa bits: above e4m3's 2^-4, at most 2^-3.
    check(j["reference"]["match"] is True and 2 ** -4 < qu["max_rel_err"] <= 2 ** -3, qu)
    check(json.loads(run(*SMALL, "--json", expect_rc=0).stdout)["timing"]["bytes"] == j["timing"]["bytes"],
          "mxfp8-e5m2 moves the bytes mxfp8 moves")
    p = run("--help", expect_rc=0)
    check("mxfp8-e5m2" in p.stdout and "F8_E5M2" in p.stdout and "FlashInfer" in p.stdout, "--help lacks mxfp8-e5m2")
    expect_error(SMALL + ["--scheme", "mxfp8-e5m2", "--global-scale", "0.5"], "--global-scale", "nvfp4-static")




# ---- the norm form (--rmsnorm-weight: megamoe::rmsnorm_and_stage) ---------------------------

def f32(v):
    """@p v (a Python float) rounded once to fp32 (round to nearest even)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def bf16_bits(v):
    """The bf16 bits nearest fp32 value @p v (ties to even; NaN -> 0x7FC0)."""
    if v != v:
        return 0x7FC0
    (u,) = struct.unpack("<I", struct.pack("<f", v))
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def bf16_val(b):
    return struct.unpack("<f", struct.pack("<I", b << 16))[0]


def norm_rows(x, residual, w, H, eps):
    """docs/CONTRACT.md "RMSNorm and stage" written out in Python: x, residual (or None) bf16
    bits, w the weight's values; -> (y bits, z bits). Every fp32 operation is formed in
    double and rounded once (exact for +, *, / and sqrt of two floats)."""
    ys, zs = [], []
    eps = f32(eps)
    for t in range(len(x) // H):
        row = x[t * H:(t + 1) * H]
        if residual is not None:
            zb = [bf16_bits(f32(bf16_val(a) + bf16_val(b))) for a, b in zip(row, residual[t * H:(t + 1) * H])]
        else:
            zb = list(row)
        z = [bf16_val(b) for b in zb]
        n = H // 16
        N = 1
        while N < n:
            N *= 2
        c = [0.0] * N
        for k in range(n):
            acc = f32(z[16 * k] * z[16 * k])
            for i in range(1, 16):
                acc = f32(acc + f32(z[16 * k + i] * z[16 * k + i]))
            c[k] = acc
        h = N // 2
        while h >= 1:
            for j in range(h):
                c[j] = f32(c[j] + c[j + h])
            h //= 2
        s = f32(1.0 / f32(f32(f32(c[0] / H) + eps) ** 0.5))
        ys += [bf16_bits(f32(bf16_val(bf16_bits(f32(zj * s))) * wj)) for zj, wj in zip(z, w)]
        zs += zb
    return ys, zs


def u16s(b):
    return list(struct.unpack(f"<{len(b) // 2}H", b))


def norm_file(d, name="in.st", T=96, H=512, seed="0"):
    """Inputs with a random weight and residual, saved by the norm form's --save-inputs."""
    path = os.path.join(d, name)
    run("-T", str(T), "-H", str(H), "--iters", "1", "--seed", seed, "--rmsnorm-weight", "random", "--residual",
        "random", "--save-inputs", path, expect_rc=0)
    return path


NORM = ["--rmsnorm-weight", "random", "--residual", "random"]
STAGED = ("x_fp8", "x_q", "x_sf", "x_scales", "topk_idx_out", "topk_weights_out", "shared_x_sf")


def staged(ts):
    return {k: v for k, v in ts.items() if k in STAGED}


def case_norm():
    """The norm form end to end on the CPU backend: y and residual_out equal the contract's
    norm written out here; the staged bytes equal those of a direct prepare_inputs call on y
    (megamoe-stage's staging form run on a file of y); without --write-y the same bytes;
    the saved inputs give the same output file; the report, JSON and --help."""
    with tempfile.TemporaryDirectory() as d:
        inp, out, out2, yfile, ystage = (os.path.join(d, n) for n in ["in.st", "out.st", "o2.st", "y.st", "ys.st"])
        p = expect_pass(SMALL + NORM + ["--device", "cpu", "--write-y", "--write-residual-out", "--save-inputs", inp,
                                        "--output", out])
        for line in ["norm: rmsnorm_and_stage, weight generated (random) (bfloat16 [512]), residual generated "
                     "(random), eps 1e-06; writes y, residual_out",
                     "stage check: bit-exact match (staged outputs against prepare_inputs of the y written)",
                     "norm reference: bit-exact match", "backend: cpu"]:
            check(line in p.stdout, f"no {line!r} in\n{p.stdout}")
        ins, ts = tensors(inp), tensors(out)
        check(ins["rmsnorm_weight"][:2] == ("BF16", [512]) and ins["residual"][:2] == ("BF16", [96, 512]), ins.keys())
        check(ts["y"][:2] == ("BF16", [96, 512]) and ts["residual_out"][:2] == ("BF16", [96, 512]), ts.keys())
        md = read_st(out)[0]["__metadata__"]
        check(md["call"] == "rmsnorm_and_stage" and md["rmsnorm_eps"] == "9.99999997e-07", md)
        x, r = u16s(ins["hidden_states"][2]), u16s(ins["residual"][2])
        w = [bf16_val(b) for b in u16s(ins["rmsnorm_weight"][2])]
        y, z = norm_rows(x, r, w, 512, 1e-6)
        check(u16s(ts["y"][2]) == y, "y differs from the contract's norm")
        check(u16s(ts["residual_out"][2]) == z, "residual_out differs from bf16(x + residual)")
        # The staged bytes are prepare_inputs(y): the staging form on a file of y.
        write_st(yfile, {"hidden_states": ts["y"], "topk_ids": ins["topk_ids"], "topk_weights": ins["topk_weights"],
                         "is_padding": ins["is_padding"]})
        expect_pass(["--input", yfile, "--iters", "1", "--output", ystage])
        check(tensors(ystage) == staged(ts), "the norm form's staged bytes differ from prepare_inputs(y)")
        # Without --write-y / --write-residual-out: the same staged bytes, no y in the file.
        p = expect_pass(["--input", inp, "--rmsnorm-weight", "rmsnorm_weight", "--residual", "residual", "--iters", "1",
                         "--output", out2])
        check("writes no y" in p.stdout and "prepare_inputs of the y of one more call" in p.stdout, p.stdout)
        t2 = tensors(out2)
        check("y" not in t2 and "residual_out" not in t2 and t2 == staged(ts), "staged bytes without y differ")
        # The same inputs read back give the same file; a weight given as F32 the same rows.
        expect_pass(["--input", inp, "--rmsnorm-weight", "rmsnorm_weight", "--residual", "residual", "--iters", "1",
                     "--write-y", "--write-residual-out", "--output", out2])
        check(open(out2, "rb").read() == open(out, "rb").read(), "--input run of the saved inputs differs")
        wfile = os.path.join(d, "w.st")
        wb = ins["rmsnorm_weight"]
        write_st(wfile, {"other": ("U8", [1], b"\0"), "gamma": ("F32", [512], bf16_to_f32_bytes(wb[2]))})
        p = expect_pass(["--input", inp, "--rmsnorm-weight", wfile + ":gamma", "--residual", inp, "--iters", "1",
                         "--write-y", "--output", out2])
        check(f"weight {wfile} tensor 'gamma' (float32 [512])" in p.stdout and
              f"residual {inp} tensor 'residual'" in p.stdout, p.stdout)
        check(tensors(out2)["y"] == ts["y"] and staged(tensors(out2)) == staged(ts), "an F32 weight gives other rows")
        # No residual, another eps, the ones weight: y = the contract's norm of x.
        p = expect_pass(["--input", inp, "--rmsnorm-weight", "ones", "--eps", "0.5", "--iters", "1", "--write-y",
                         "--output", out2])
        check("residual none, eps 0.5; writes y" in p.stdout, p.stdout)
        y1, _ = norm_rows(x, None, [1.0] * 512, 512, 0.5)
        check(u16s(tensors(out2)["y"][2]) == y1, "y (eps 0.5, no residual) differs from the contract's norm")
        # JSON: the norm object and the bytes (staging + residual + weight + y + residual_out).
        j = json.loads(run(*SMALL, *NORM, "--write-y", "--write-residual-out", "--json", expect_rc=0).stdout)
        n = j["norm"]
        check(n["call"] == "rmsnorm_and_stage" and n["weight"] == {"source": "generated (random)", "dtype": "bfloat16",
                                                                      "shape": [512]}, n)
        check(n["residual"]["shape"] == [96, 512] and n["eps"] == f32(1e-6) and n["write_y"] and
              n["write_residual_out"], n)
        check(n["stage_check"]["match"] is True and n["reference"]["match"] is True and j["reference"]["match"], j)
        base = 96 * 512 * 3 + 96 * 4 * 4 + 96 * 8 * 20 + 96
        check(j["timing"]["bytes"] == base + 96 * 512 * 2 * 3 + 512 * 2, j["timing"])
        check(j["quality"]["snr_db"] > 30, j["quality"])
        check(json.loads(run(*SMALL, "--json", expect_rc=0).stdout)["norm"] is None, "norm without --rmsnorm-weight")
        # T = 0: nothing to do, every check passes.
        p = run("-T", "0", "-H", "512", "--iters", "1", *NORM, "--write-y", "--output", out2, expect_rc=0)
        check("stage check: bit-exact match" in p.stdout and tensors(out2)["y"] == ("BF16", [0, 512], b""), p.stdout)
    p = run("--help", expect_rc=0)
    for word in ["--rmsnorm-weight", "--residual", "--eps", "--write-y", "--write-residual-out", "rmsnorm_and_stage",
                 "stage check", "norm reference", "FILE:TENSOR", "residual_out"]:
        check(word in p.stdout, f"--help lacks {word!r}")


NORM_FORMATS = ["mxfp8", "ue8m0-g128", "fp32-g128", "fp32-g128-sm90", "fp32-g32", "mxfp8-e5m2", "mxfp4", "mxfp4-rne",
                "nvfp4-per-token", "nvfp4-online", "bf16"]


def case_norm_formats():
    """The norm form in every --scheme and with every staging option (full buffer, shared
    copy, amax floors, the nvfp4-static global scale, threads, explain): bit-exact against
    prepare_inputs(y) and the references, the staged bytes equal those of the staging form
    on a file of y."""
    with tempfile.TemporaryDirectory() as d:
        out, yfile, ystage = (os.path.join(d, n) for n in ["out.st", "y.st", "ys.st"])
        inp = norm_file(d)
        ins = tensors(inp)
        for s in NORM_FORMATS + ["nvfp4-static"]:
            extra = ["--global-scale", "0.002"] if s == "nvfp4-static" else []
            for opts in [[], ["--full-buffer", "--max-tokens", "128"], ["--amax-floor", "0"]]:
                if s in ("nvfp4-static", "bf16") and opts and opts[0] == "--amax-floor":
                    continue
                args = ["--input", inp, "--rmsnorm-weight", "rmsnorm_weight", "--residual", "residual", "--iters", "1",
                        "--scheme", s, "--write-y", "--output", out, *extra, *opts]
                if s == "bf16":  # the rows themselves: an infinite SNR
                    p = run(*args, expect_rc=0)
                    check("SNR: inf dB" in p.stdout and "reference: bit-exact match" in p.stdout, p.stdout)
                else:
                    p = expect_pass(args, min_snr=12)
                check("stage check: bit-exact match" in p.stdout and "norm reference: bit-exact match" in p.stdout,
                      f"{s} {opts}:\n{p.stdout}")
                ts = tensors(out)
                write_st(yfile, {"hidden_states": ts["y"], "topk_ids": ins["topk_ids"],
                                 "topk_weights": ins["topk_weights"], "is_padding": ins["is_padding"]})
                run("--input", yfile, "--iters", "1", "--scheme", s, "--output", ystage, *extra, *opts, expect_rc=0)
                check(tensors(ystage) == staged(ts), f"{s} {opts}: staged bytes differ from the staging form's")
        for s in ["mxfp8", "mxfp8-e5m2", "mxfp4"]:  # the shared copy (UE8M0 schemes)
            p = expect_pass(SMALL + NORM + ["--scheme", s, "--shared-block-m", "64", "--output", out], min_snr=15)
            check("shared_x_sf [256, 4]" in p.stdout and "stage check: bit-exact match" in p.stdout, p.stdout)
        p = expect_pass(SMALL + NORM + ["--threads", "1", "--device", "cpu"])
        check("1 staging threads" in p.stdout, p.stdout)
        p = run("-T", "96", "-H", "512", *NORM, "--explain", expect_rc=0)
        check(p.stdout.startswith("plan: cpu backend: rmsnorm T=96 H=512") and "time:" not in p.stdout, p.stdout)
        j = json.loads(run(*SMALL, *NORM, "--explain", "--json", expect_rc=0).stdout)
        check("rmsnorm" in j["plan"] and j["norm"]["stage_check"]["match"] is True, j)
        p = run(*SMALL, *NORM, "--device", "cuda")
        if p.returncode == 0:
            check("backend: cuda" in p.stdout and "stage check: bit-exact match" in p.stdout, p.stdout)
        else:
            check(p.returncode == 2 and "--device cuda" in p.stderr, f"rc {p.returncode}: {p.stderr}")


def case_norm_errors():
    """Bad norm-form command lines and inputs: exit 2 with a message naming the option, file
    and tensor, and no --output or --save-inputs file written."""
    with tempfile.TemporaryDirectory() as d:
        inp = norm_file(d, T=10, H=256)
        ins = tensors(inp)
        bad = os.path.join(d, "bad.st")
        wrong = os.path.join(d, "wrong.st")
        write_st(wrong, {"w16": ("F16", [256], b"\0" * 512), "w128": ("BF16", [128], b"\0" * 256),
                         "r32": ("F32", [10, 256], b"\0" * 10240), "r9": ("BF16", [9, 256], b"\0" * 4608)})
        f32_in = os.path.join(d, "f32.st")
        write_st(f32_in, {**ins, "hidden_states": ("F32", [10, 256], bf16_to_f32_bytes(ins["hidden_states"][2]))})
        gen = ["-T", "10", "-H", "256", "--iters", "1"]
        cases = [
            (gen + ["--residual", "random"], ["--residual requires --rmsnorm-weight"]),
            (gen + ["--eps", "0.1"], ["--eps requires --rmsnorm-weight"]),
            (gen + ["--write-y"], ["--write-y requires --rmsnorm-weight"]),
            (gen + ["--rmsnorm-weight", "ones", "--write-residual-out"], ["--write-residual-out requires --residual"]),
            (gen + ["--rmsnorm-weight", "ones", "--router"], ["excludes"]),
            (gen + ["--rmsnorm-weight", "ones", "--eps", "-1"], ["--eps", "finite non-negative value, got -1"]),
            (gen + ["--rmsnorm-weight", "ones", "--eps", "nan"], ["--eps", "finite non-negative"]),
            (gen + ["--rmsnorm-weight", "ones", "--eps", "1e-5x"], ["--eps", "finite non-negative"]),
            (gen + ["--rmsnorm-weight", "nope"], ["--rmsnorm-weight nope: no such file"]),
            (gen + ["--rmsnorm-weight", "ones", "--residual", "ones"], ["--residual ones: no such file"]),
            (["--input", inp, "--iters", "1", "--rmsnorm-weight", "nope"],
             ["--rmsnorm-weight nope: neither a tensor of --input", "nor a file"]),
            (["--input", inp, "--iters", "1", "--rmsnorm-weight", "residual"],
             ["--rmsnorm-weight: --input tensor 'residual'", "expected shape [256]", "got [10, 256]"]),
            (gen + ["--rmsnorm-weight", wrong + ":w16"],
             [f"{wrong} tensor 'w16'", "expected dtype BF16 or F32, got F16"]),
            (gen + ["--rmsnorm-weight", wrong + ":w128"], ["tensor 'w128'", "expected shape [256]", "got [128]"]),
            (gen + ["--rmsnorm-weight", wrong + ":none"], [f"--rmsnorm-weight {wrong}: no tensor 'none' in the file"]),
            (gen + ["--rmsnorm-weight", wrong], ["has 4 tensors and none named 'rmsnorm_weight'", ":TENSOR"]),
            (gen + ["--rmsnorm-weight", "ones", "--residual", wrong + ":r32"],
             ["--residual", "expected dtype BF16, got F32"]),
            (gen + ["--rmsnorm-weight", "ones", "--residual", wrong + ":r9"],
             ["tensor 'r9'", "expected shape [10, 256] (that of hidden_states), got [9, 256]"]),
            (["--input", f32_in, "--iters", "1", "--rmsnorm-weight", "rmsnorm_weight"],
             ["hidden_states F32 (expected BF16)"]),
            (gen + ["--rmsnorm-weight", "ones", "--scheme", "nvfp4-static"], ["nvfp4-static", "--global-scale"]),
            (gen + ["--rmsnorm-weight", "ones", "--scheme", "fp32-g128", "--shared-block-m", "64"], ["UE8M0"]),
            (["-T", "10", "-H", "384", "--iters", "1", "--rmsnorm-weight", "ones", "--scheme", "ue8m0-g128"],
             ["megamoe-stage: error: megamoe: x:", "multiple of 4"]),
            (gen + ["--rmsnorm-weight", "ones", "--full-buffer", "--max-tokens", "5"], ["megamoe-stage: error:"]),
            (gen + ["--rmsnorm-weight", inp, "--output", inp], ["--output", "the same file as --rmsnorm-weight"]),
            (gen + ["--rmsnorm-weight", "ones", "--residual", inp + ":residual", "--save-inputs", inp],
             ["--save-inputs", "the same file as --residual"]),
        ]
        before = open(inp, "rb").read()
        for args, needles in cases:
            for n, p in enumerate(["out.st", "saved.st"]):
                path = os.path.join(d, p)
                flag = "--output" if n == 0 else "--save-inputs"
                extra = [] if flag in args else [flag, path]
                expect_error(args + extra, *needles)
                check(not os.path.exists(path), f"{' '.join(args)}: {flag} {p} was written")
        check(open(inp, "rb").read() == before, "an input file changed")
        j = json.loads(run(*gen, "--rmsnorm-weight", "nope", "--json", expect_rc=2).stdout)
        check(j["exit_code"] == 2 and "--rmsnorm-weight nope" in j["error"], j)
        j = json.loads(run(*gen, "--write-y", "--json", expect_rc=2).stdout)
        check(j["exit_code"] == 2 and j["error"].startswith("megamoe-stage: error: "), j)


def case_no_reference():
    """A CLI built without the reference check (MEGAMOE_CLI_REFERENCE off) stages, measures
    and reports as always, says the check is not compiled in, and exits 0."""
    p = run(*SMALL, expect_rc=0)
    check("reference: not compiled in" in p.stdout and "bit-exact" not in p.stdout, p.stdout)
    check(snr(p.stdout) > 30, p.stdout)
    p = run(*SMALL, "--router", expect_rc=0)
    check("router reference: not compiled in" in p.stdout and "\nreference: not compiled in" in p.stdout, p.stdout)
    j = json.loads(run(*SMALL, "--router", "--json", expect_rc=0).stdout)
    check(j["reference"] is None and j["router"]["reference"] is None and j["exit_code"] == 0, j)
    check(j["quality"]["snr_db"] > 30, j["quality"])
    p = run("--help", expect_rc=0)
    check("MEGAMOE_CLI_REFERENCE" in p.stdout and "not compiled in" in p.stdout, p.stdout)
    expect_error(SMALL + ["--scheme", "nope"], "--scheme")
    # The norm form: the stage check is the CLI's own, in every build.
    p = run(*SMALL, "--rmsnorm-weight", "random", "--residual", "random", expect_rc=0)
    check("stage check: bit-exact match" in p.stdout and "norm reference: not compiled in" in p.stdout and
          "\nreference: not compiled in" in p.stdout, p.stdout)
    j = json.loads(run(*SMALL, "--rmsnorm-weight", "ones", "--json", expect_rc=0).stdout)
    check(j["norm"]["stage_check"]["match"] is True and j["norm"]["reference"] is None, j["norm"])

CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in CASES:
        sys.exit(f"usage: {sys.argv[0]} MEGAMOE_STAGE {{{','.join(CASES)}}}")
    EXE = sys.argv[1]
    try:
        CASES[sys.argv[2]]()
    except Failure as e:
        print(f"FAIL {sys.argv[2]}: {e}")
        sys.exit(1)
    print(f"PASS {sys.argv[2]}")
