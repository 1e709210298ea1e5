#!/usr/bin/env python3
"""make_corpus.py: the input format of tests/fuzz/fuzz_stage.cpp, and its seed corpus.

Run `python3 tests/fuzz/make_corpus.py` to (re)write tests/fuzz/corpus/. No numpy.

An input is a header, twelve tensor descriptors, with mode bit 7 an extension block (the
entry point, full-buffer mode, scaling, the router, and ten more descriptors), then a
payload. Everything is little-endian; bytes missing at the end read as zero, and zero
always means "the natural choice", so a short input is still a meaningful call.

Header (58 bytes)
  u8   mode         bit0 raw sizes: T, H, K are used as given (else "small sizes":
                      T = T mod 4097, K = K mod 33,
                      H = 128 * (low 32 bits of H mod 65) + (high 32 bits of H) mod 128,
                      so small(H) = H // 128 | (H % 128) << 32);
                    bit1 is_padding present; bit2 shared_x_sf present; bit3 shared_block_m
                    present; bit4 global_scale present; bit5 x_scales present;
                    bit6 nonfinite_count present; bit7 extension block present
  i64  T, H, K
  u8   elem         QuantElem value (0 fp8 e4m3, 1 e5m2, 2 int8, 3 fp4 e2m1; others invalid)
  u8   scale        ScaleType value (0 UE8M0, 1 fp32, 2 fp16, 3 fp8 e4m3; others invalid)
  u8   qflags       bit0 is_static, bit1 asymmetric (symmetric = not bit1)
  u8   scale2       Scale2 value (0 none, 1 static, 2 per-token, 3 online; others invalid)
  u8   rounding     Rounding value (0 default, 1 nearest even, 2 ties toward zero)
  u32  amax_floor   fp32 bits; 0 = the default 1e-4
  i64  group_k, group_m, shared_block_m      (raw)

Tensor descriptor (49 bytes), in slot order
  hidden_states, topk_weights, topk_ids, is_padding, global_scale,
  x_q, x_sf, topk_idx_out, topk_weights_out, shared_x_sf, x_scales, nonfinite_count
  (descriptors of absent optional tensors are read and ignored)
  u8 dtype      0 natural; 1..199: DType((v-1) % 9) (0 bf16, 1 fp16, 2 fp32, 3 fp8 e4m3,
                4 uint8, 5 bool, 6 int32, 7 int64, 8 int8); 200..255: the raw (invalid) value
  u8 rank       0 natural; else (-1, 0, 1, 2, 3)[(v-1) % 5]
  u8 shape      (v % 4) 0 natural [R, C]; 1 explicit (a, b); 2 natural + (a, b); 3 swapped
                natural shapes: [T,H] hidden/x_q (x_q [T,H/2] for fp4), [T,K] top-k,
                [T] is_padding/x_scales, [1] global_scale/nonfinite_count,
                [T, H/(4G) or H/G] x_sf, [ceil(T/bm)*align(bm,128), H/(4G)] shared_x_sf
  u8 layout     (v % 10) strides for shape [r, c] (1-D: rows only):
                0 contig (c, 1); 1 padded (c+pad, 1); 2 transposed (1, r+pad);
                3 rows reversed (-(c+pad), 1); 4 columns reversed (c+pad, -1);
                5 every other (2c+pad, 2); 6 MN-major (1, align4(r)+pad); 7 zero (0, 0);
                8 explicit (s0, s1); 9 broadcast row (0, 1)
  u8 pad        the pad above (elements)
  u8 place      (v % 32) 1 null pointer; 2..13 inside the buffer of slot (v%32 - 2) when that
                slot comes earlier, at a byte offset picked by `off` among every position
                from "ends just before that tensor's span" to "starts just after it";
                else its own buffer
  u8 misalign   byte shift (mod 64) of its own buffer's start
  u8 device     (v % 6) 0 cpu; 1 cuda:0; 2 cuda:1; 3 cpu:1; 4 cuda:-1; 5 device type 7
  u8 fill       byte its buffer is filled with before inputs are written (output poison)
  i64 a, b      explicit shape or shape deltas
  i64 s0, s1    explicit strides
  i64 off       placement offset (see place)

Extension block (58 bytes, then 10 descriptors as above), only with mode bit 7
  u8   entry        (v % 4) 0 prepare_inputs, 1 stage_routing, 2 route, 3 route_and_stage
  u8   xflags       bit0 full_buffer (not route); bit1 StageArgs / RoutingArgs
                    routed_scaling_factor given (route_and_stage must reject it); bit2
                    e_score_correction_bias; bit3 hash layer (tid2eid + input_ids); bit4
                    EPLB (map, replica count, load, record flag); bit5 the router's
                    nonfinite_count; bit6 RouterArgs::is_padding (route_and_stage must reject
                    it); bit7 partial: input_ids / record_enabled left out (a rejection)
  i64  max_tokens   M, the outputs' rows in full-buffer mode (small sizes: M = T + v mod 4097)
  u32  alpha        fp32 bits of the staging / routing scaling factor
  u32  router alpha fp32 bits of RouterArgs::routed_scaling_factor; 0 = absent (no scaling)
  i64  E, top_k, V, R, P   experts, the router's top-k (its K: the top-k shapes' columns),
                    tid2eid rows, replica slots, expert_load_view length (small sizes: E mod
                    513, top_k mod 18, V mod 65, R mod 9, P mod 1025; T mod 257 for router
                    entries)
  descriptors       router_logits [T, E] fp32, e_score_correction_bias [E] fp32,
                    tid2eid [V, K] int32, input_ids [T] int64,
                    logical_to_physical_map [E, R] int32, logical_replica_count [E] int32,
                    expert_load_view [P] int64, record_enabled [1] int32,
                    nonfinite_count (router) [1] int64, is_padding (router) [T] bool
  (place codes 2..23 name any earlier slot, these included; the router writes topk_ids and
  topk_weights, which are then outputs, [T, top_k] int64 / fp32)

Payload: the bytes of the input elements (hidden_states, topk_weights, topk_ids,
is_padding, global_scale, nonfinite_count's initial value, then the router's inputs and
in/out tensors in slot order), element by element, cycled; with no payload a fixed
pseudo-random stream is used (is_padding then mostly 0). The router's indices (tid2eid,
input_ids, the map, the replica counts; int32/int64 only) and record flag take one byte
each: below 0xF0 the byte modulo the index range (E, V, P, R + 1), above it an extreme
value (-1, the range, INT32_MIN, INT64_MAX, ...); the record flag is 0 when the byte's low
two bits are.
"""
import os
import struct
import sys

SLOTS = ["hidden_states", "topk_weights", "topk_ids", "is_padding", "global_scale", "x_q",
         "x_sf", "topk_idx_out", "topk_weights_out", "shared_x_sf", "x_scales", "nonfinite_count"]
ROUTER_SLOTS = ["router_logits", "bias", "tid2eid", "input_ids", "l2p", "replicas", "load",
                "record", "router_nonfinite", "router_pad"]
ENTRY = {"stage": 0, "routing": 1, "route": 2, "fused": 3}
FULL, ALPHA, BIAS, HASH, EPLB, RNONFINITE, RPAD, PARTIAL = 1, 2, 4, 8, 16, 32, 64, 128
EXT = 128
DT = {"bf16": 0, "fp16": 1, "fp32": 2, "fp8": 3, "uint8": 4, "bool": 5, "int32": 6, "int64": 7,
      "int8": 8}
RAW, PADDING, SHARED, BLOCKM, GLOBAL, XSCALES, NONFINITE = 1, 2, 4, 8, 16, 32, 64
INT64_MAX = (1 << 63) - 1


def dtype(name):
    """Descriptor code of an explicit dtype."""
    return DT[name] + 1


def small_h(h):
    """The H field that decodes to h in small-size mode."""
    return h // 128 | (h % 128) << 32


def desc(dtype=0, rank=0, shape=0, layout=0, pad=0, place=0, misalign=0, device=0, fill=0,
         a=0, b=0, s0=0, s1=0, off=0):
    return struct.pack("<9B5q", dtype, rank, shape, layout, pad, place, misalign, device, fill,
                       a, b, s0, s1, off)


def f32_bits(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


def make(T, H, K, mode=0, elem=0, scale=0, qflags=0, scale2=0, rounding=0, floor_bits=0,
         group_k=32, group_m=1, bm=0, tensors=None, payload=b"", ext=None):
    """One input. In small-size mode (mode without RAW) H is given as the real hidden size
    and max_tokens as the real M. ext (a dict: entry, xflags, max_tokens, alpha,
    router_alpha, E, top_k, V, R, P) adds the extension block."""
    small = not mode & RAW
    tensors = tensors or {}
    unknown = set(tensors) - set(SLOTS) - set(ROUTER_SLOTS)
    assert not unknown, unknown
    if ext is not None:
        mode |= EXT
    head = struct.pack("<B3q5BI3q", mode, T, small_h(H) if small else H, K, elem, scale, qflags,
                       scale2, rounding, floor_bits, group_k, group_m, bm)
    assert len(head) == 58
    body = b"".join(desc(**tensors.get(s, {})) for s in SLOTS)
    assert len(body) == 12 * 49
    if ext is not None:
        e = dict(ext)
        m = e.pop("max_tokens", T)
        alpha = e.pop("alpha", None)
        ralpha = e.pop("router_alpha", None)
        block = struct.pack("<BBqII5q", ENTRY[e.pop("entry", "stage")], e.pop("xflags", 0),
                            m - T if small else m,
                            0 if alpha is None else f32_bits(alpha),
                            0 if ralpha is None else f32_bits(ralpha),
                            *(e.pop(n, 0) for n in ("E", "top_k", "V", "R", "P")))
        assert not e, e
        assert len(block) == 58
        body += block + b"".join(desc(**tensors.get(s, {})) for s in ROUTER_SLOTS)
    return head + body + payload


def bf16(*vals):
    out = b""
    for v in vals:
        out += struct.pack("<f", v)[2:]  # truncation is exact for these values
    return out


def seeds():
    s = {}
    # Plain valid calls (must be accepted and match the reference).
    s["valid_mxfp8_small"] = make(7, 256, 4, tensors={"x_q": {"fill": 0xFF}})
    s["valid_fp32_g128_mn_major_sf"] = make(
        33, 384, 6, mode=PADDING, scale=1, group_k=128,
        tensors={"hidden_states": {"dtype": dtype("fp16"), "layout": 2, "pad": 3},
                 "x_sf": {"layout": 6, "fill": 0xAA},
                 "x_q": {"layout": 3, "pad": 5, "misalign": 1},
                 "topk_weights": {"dtype": dtype("bf16"), "layout": 4, "pad": 1},
                 "topk_ids": {"dtype": dtype("int32"), "layout": 2},
                 "is_padding": {"dtype": dtype("uint8"), "layout": 3, "pad": 2}})
    s["valid_ue8m0_g128_stride2"] = make(
        5, 512, 3, group_k=128,
        tensors={"x_q": {"layout": 5, "pad": 1}, "x_sf": {"layout": 4, "pad": 2},
                 "topk_idx_out": {"layout": 2, "misalign": 3},
                 "topk_weights_out": {"layout": 5, "misalign": 7},
                 "hidden_states": {"layout": 9}})  # a broadcast row: zero stride on an input
    s["shared_bm64_exact_rows"] = make(
        100, 256, 2, mode=SHARED | BLOCKM, bm=64, tensors={"shared_x_sf": {"fill": 0x5A}})
    s["shared_bm200_more_rows_transposed"] = make(
        300, 128, 2, mode=SHARED | BLOCKM, bm=200,
        tensors={"shared_x_sf": {"shape": 2, "a": 7, "layout": 2, "pad": 1, "fill": 0x11}})
    s["shared_bm128_too_few_rows"] = make(
        129, 128, 1, mode=SHARED | BLOCKM, bm=128, tensors={"shared_x_sf": {"shape": 2, "a": -1}})
    # CPU worker threads: T * (H + K) >= 2^18.
    s["threaded_T2048"] = make(2048, 256, 8, mode=PADDING | NONFINITE | SHARED | BLOCKM, bm=96)
    # Hostile sizes and strides (must be rejected, nothing written).
    s["shared_bm_int64max_rows0"] = make(
        4, 128, 2, mode=RAW | SHARED | BLOCKM, bm=INT64_MAX,
        tensors={"shared_x_sf": {"shape": 1, "a": 0, "b": 1}})
    s["shared_bm_int64max_rows128"] = make(
        4, 128, 2, mode=RAW | SHARED | BLOCKM, bm=INT64_MAX,
        tensors={"shared_x_sf": {"shape": 1, "a": 128, "b": 1}})
    s["idx_out_strides_2p61_plus_1"] = make(
        4, 128, 2, mode=RAW, tensors={"topk_idx_out": {"layout": 8, "s0": (1 << 61) + 1, "s1": 1}})
    s["idx_out_strides_2p61_minus_256"] = make(
        2, 128, 2, mode=RAW, tensors={"topk_idx_out": {"layout": 8, "s0": (1 << 61) - 256, "s1": 1}})
    s["x_strides_2p62"] = make(
        2, 128, 2, mode=RAW, tensors={"hidden_states": {"layout": 8, "s0": 1 << 62, "s1": 1}})
    s["x_q_strides_int64min"] = make(
        3, 128, 2, mode=RAW, tensors={"x_q": {"layout": 8, "s0": -(1 << 63), "s1": 1}})
    s["null_pointers_T2p57_H128"] = make(
        1 << 57, 128, 1, mode=RAW, tensors={name: {"place": 1} for name in SLOTS})
    s["x_q_zero_strides"] = make(3, 128, 1, tensors={"x_q": {"layout": 7}})
    s["x_q_inside_hidden"] = make(  # x_q's span starts where hidden_states' does
        2, 128, 1, tensors={"x_q": {"place": 2, "off": 2 * 128}})
    # Interleaved: x_q rows in the gaps of a padded hidden_states (bf16 rows of 128 + 128
    # elements = 512 bytes, the last 256 bytes of each a gap): spans meet, no element shared.
    s["x_q_in_hidden_gaps"] = make(
        3, 128, 1,
        tensors={"hidden_states": {"layout": 1, "pad": 128},
                 "x_q": {"layout": 8, "s0": 512, "s1": 1, "place": 2,
                         "off": 256 + (2 * 512 + 128)}})
    # Empty tensors: K = 0 with (0, 0) strides and null pointers, T = 0.
    s["k0_zero_strides"] = make(
        6, 128, 0, tensors={n: {"layout": 7} for n in
                            ("topk_weights", "topk_ids", "topk_idx_out", "topk_weights_out")})
    s["k0_null_pointers"] = make(
        2, 256, 0, tensors={n: {"place": 1, "layout": 8, "s0": -(1 << 63), "s1": INT64_MAX}
                            for n in ("topk_weights", "topk_ids", "topk_idx_out", "topk_weights_out")})
    s["t0"] = make(0, 256, 4)
    s["t0_bad_everything_else"] = make(
        0, 384, 3, mode=SHARED, elem=1, group_k=0,
        tensors={"x_q": {"dtype": 230, "place": 1}, "topk_ids": {"rank": 1}})
    # Devices: CUDA tensors in a CPU-only build; one tensor on another device.
    s["all_cuda0"] = make(2, 128, 2, tensors={n: {"device": 1} for n in SLOTS})
    s["x_sf_on_cpu1"] = make(2, 128, 2, tensors={"x_sf": {"device": 3}})
    # Scheme fields: group_k 0 / negative / huge, static, asymmetric, e5m2.
    s["group_k_0"] = make(2, 128, 1, group_k=0)
    s["group_k_negative"] = make(2, 128, 1, group_k=-32)
    s["group_k_huge"] = make(2, 128, 1, mode=RAW, group_k=INT64_MAX)
    s["scheme_static_asym_e5m2"] = make(2, 128, 1, elem=1, qflags=3)
    s["h_not_multiple_of_128"] = make(3, 200, 2)
    # Formats beyond the fp8 reference (generic output checks).
    s["mxfp4"] = make(4, 256, 2, elem=3, rounding=2)
    s["mxfp4_dropin_uint8_x_q"] = make(
        4, 256, 2, tensors={"x_q": {"dtype": dtype("uint8"), "shape": 2, "a": 0, "b": -128}})
    s["nvfp4_static"] = make(3, 256, 2, mode=GLOBAL, elem=3, scale=3, scale2=1, group_k=16,
                             payload=struct.pack("<f", 0.5) + bf16(1.0, -2.0, 3.5, 0.25))
    s["nvfp4_per_token"] = make(3, 256, 2, mode=XSCALES, elem=3, scale=3, scale2=2, group_k=16)
    # NVFP4 online: global_scale is an output (the call writes gs), floor 1e-4 and 0.
    s["nvfp4_online"] = make(3, 256, 2, mode=GLOBAL, elem=3, scale=3, scale2=3, group_k=16,
                             payload=struct.pack("<f", 0.5) + bf16(1.0, -2.0, 3.5, 0.25))
    s["nvfp4_online_floor0"] = make(3, 256, 2, mode=GLOBAL, elem=3, scale=3, scale2=3, group_k=16,
                                    floor_bits=0x80000000, payload=struct.pack("<f", 0.5) + b"\0" * 64)
    s["fp8_amax_floor_1e-10"] = make(
        3, 128, 1, floor_bits=struct.unpack("<I", struct.pack("<f", 1e-10))[0])
    s["nonfinite_count_nan_inf"] = make(
        2, 128, 1, mode=NONFINITE,
        payload=bf16(float("nan"), float("inf"), -float("inf"), 1.0, 0.0, -0.0, 448.0, 1e-30))
    # Findings (reproducers of library bugs; see the report of the fuzzing session).
    # 1. bf16 hidden_states at an odd address, columns strided (every other element): the
    #    CPU backend's strided row loader reads it through a const uint16_t* (UBSan:
    #    misaligned load), though TensorRef::data "may be unaligned". (Contiguous rows take
    #    the SIMD path, which loads unaligned data correctly.)
    s["bug_unaligned_bf16_hidden"] = make(
        2, 128, 2, tensors={"hidden_states": {"misalign": 1, "layout": 5}})
    # 2. MXFP4 with a rounding value naming no Rounding enumerator (7) is accepted and staged
    #    as nearest-even; fp8 rejects the same field by name.
    s["bug_mxfp4_unknown_rounding"] = make(4, 256, 2, elem=3, rounding=7)
    # 3. nonfinite_count holding INT64_MAX and one NaN in hidden_states: the CPU backend adds
    #    the count in signed int64 (UBSan: signed overflow); device atomics wrap.
    s["bug_nonfinite_count_overflow"] = make(
        1, 128, 0, mode=NONFINITE,
        payload=bf16(float("nan")) + bf16(1.0) * 127 + struct.pack("<q", INT64_MAX))
    # 4. (a harness finding, 2026-12-02) H == 0 with an int8 x_q of width 0: the default
    #    scheme's x_q of width H/2 selects MXFP4 (the library, as SPEC words it); the harness
    #    had modelled the rule for H > 0 only and called the accepted call a violation.
    s["h0_int8_x_q_dropin"] = make(1974 % 4097, 0, 30, tensors={"x_q": {"dtype": dtype("int8")}})
    # Full-buffer mode: every output has M = max_tokens rows; the top-k tail becomes -1 /
    # +0.0, the x_q / x_sf / x_scales tail stays as it was (filled with a poison byte).
    poison = {"x_q": {"fill": 0xEE}, "x_sf": {"fill": 0xDD}, "topk_idx_out": {"fill": 0x77},
              "topk_weights_out": {"fill": 0x66}}
    s["fb_t0_m5"] = make(0, 256, 4, tensors=poison, ext={"xflags": FULL, "max_tokens": 5})
    s["fb_m_eq_t"] = make(7, 256, 4, mode=PADDING | SHARED | BLOCKM, bm=64, tensors=poison,
                          ext={"xflags": FULL, "max_tokens": 7})
    s["fb_m_much_larger"] = make(3, 128, 2, tensors=poison, ext={"xflags": FULL, "max_tokens": 3000})
    s["fb_m_less_than_t"] = make(4, 128, 2, mode=RAW, ext={"xflags": FULL, "max_tokens": 3})
    s["fb_nvfp4_per_token"] = make(3, 256, 2, mode=XSCALES, elem=3, scale=3, scale2=2, group_k=16,
                                   tensors={"x_scales": {"fill": 0x99}, **poison},
                                   ext={"xflags": FULL | ALPHA, "max_tokens": 6, "alpha": -0.75})
    # NaN weights on padded rows (they become +0.0) and on kept rows (bits kept) with a
    # scaling factor; a kept weight that overflows under it. Exact payload: hidden 4 x 128
    # bf16, weights 4 x 2 fp32, ids 4 x 2 int64, the mask.
    nan_w = [1.0, 0x7F800001, 0x7FC00001, 0xFFFFFFFF, 3.0e38, -2.0, 0x7FA00000, 0.0]
    wbytes = b"".join(struct.pack("<I", v) if isinstance(v, int) else struct.pack("<f", v)
                      for v in nan_w)
    nan_payload = (bf16(0.5, -1.0, 3.0, float("nan")) * 128 + wbytes +
                   struct.pack("<8q", 0, 1, 2, 3, 4, 5, -7, 1 << 40) + bytes([0, 1, 0, 7]))
    s["fb_nan_weights_padded_alpha"] = make(
        4, 128, 2, mode=PADDING, tensors=poison, payload=nan_payload,
        ext={"xflags": FULL | ALPHA, "max_tokens": 6, "alpha": 1.5})
    s["alpha_inf"] = make(2, 128, 2, ext={"xflags": ALPHA, "alpha": float("inf")})
    # +-Inf kept weights times a zero factor: the NaN the product makes is 0x7FC00000 on
    # every host (x86's own is 0xFFC00000). Payload: weights 4 x 2 fp32, ids, the mask.
    inf_w = [float("inf"), -float("inf"), 1.0, -2.0, 0x7FC00001, -float("inf"), float("inf"), 0.0]
    inf_payload = (b"".join(struct.pack("<I", v) if isinstance(v, int) else struct.pack("<f", v)
                            for v in inf_w) +
                   struct.pack("<8q", 0, 1, 2, 3, 4, 5, 6, 7) + bytes([0, 0, 0, 1]))
    s["bug_inf_weight_times_zero_alpha"] = make(
        4, 128, 2, mode=PADDING, tensors=poison, payload=inf_payload,
        ext={"entry": "routing", "xflags": FULL | ALPHA, "max_tokens": 6, "alpha": 0.0})
    # stage_routing (routing only).
    s["routing_plain"] = make(6, 128, 2, ext={"entry": "routing"})
    s["routing_t0"] = make(0, 128, 3, ext={"entry": "routing"})
    s["routing_t0_fb_m4"] = make(0, 128, 3, ext={"entry": "routing", "xflags": FULL, "max_tokens": 4})
    s["routing_fb_alpha_bf16"] = make(
        5, 128, 3, mode=PADDING, tensors={"topk_weights": {"dtype": dtype("bf16")}, **poison},
        ext={"entry": "routing", "xflags": FULL | ALPHA, "max_tokens": 9, "alpha": 1.5})
    # route(): selection with a bias and a router scaling factor; ties and non-finite logits
    # (a cycled bf16 payload); hash layers; EPLB with 1..4 replica slots, with a hash layer.
    ties = bf16(1.0, 1.0, -3.0, 0.5, 25.0, float("nan"), float("inf"), -float("inf"), 0.0, -0.0)
    s["route_bias_alpha"] = make(16, 128, 0, ext={"entry": "route", "xflags": BIAS | RNONFINITE,
                                                  "router_alpha": 2.5, "E": 64, "top_k": 6})
    s["route_bf16_ties"] = make(
        10, 128, 0, tensors={"router_logits": {"dtype": dtype("bf16")},
                             "bias": {"dtype": dtype("bf16")}, "topk_ids": {"dtype": dtype("int32")}},
        payload=ties, ext={"entry": "route", "xflags": BIAS | RNONFINITE, "E": 10, "top_k": 3})
    s["route_hash_padding"] = make(9, 128, 0, ext={"entry": "route", "xflags": HASH | RPAD,
                                                   "E": 32, "top_k": 4, "V": 5})
    for r in range(1, 5):
        s[f"route_eplb_r{r}"] = make(
            12, 128, 0, tensors={"load": {"dtype": dtype("int32") if r % 2 else 0}},
            ext={"entry": "route", "xflags": EPLB, "E": 16, "top_k": 4, "R": r, "P": 40})
    s["route_hash_eplb_r3"] = make(20, 128, 0, ext={"entry": "route", "xflags": HASH | EPLB | RNONFINITE,
                                                    "E": 24, "top_k": 8, "V": 7, "R": 3, "P": 72})
    s["route_eplb_partial"] = make(4, 128, 0, ext={"entry": "route", "xflags": EPLB | PARTIAL,
                                                   "E": 8, "top_k": 2, "R": 2, "P": 16})
    s["route_t0"] = make(0, 128, 0, ext={"entry": "route", "E": 8, "top_k": 2})
    # CPU worker threads: T * E >= 2^14.
    s["route_threaded_T256_E128"] = make(256, 128, 0, ext={"entry": "route", "xflags": EPLB | BIAS,
                                                           "E": 128, "top_k": 8, "R": 4, "P": 512})
    # route_and_stage(): staged bytes = route() then prepare_inputs().
    s["fused_mxfp8_bias"] = make(8, 256, 0, mode=PADDING | NONFINITE,
                                 ext={"entry": "fused", "xflags": BIAS | RNONFINITE, "E": 32, "top_k": 4})
    s["fused_fb_hash_eplb_shared"] = make(
        5, 256, 0, mode=PADDING | SHARED | BLOCKM, bm=32, tensors=poison,
        ext={"entry": "fused", "xflags": FULL | HASH | EPLB, "max_tokens": 20, "router_alpha": 1.5,
             "E": 16, "top_k": 6, "V": 9, "R": 2, "P": 32})
    s["fused_t0_fb_m3"] = make(0, 128, 0, tensors=poison,
                               ext={"entry": "fused", "xflags": FULL, "max_tokens": 3, "E": 8, "top_k": 2})
    s["fused_router_padding"] = make(3, 128, 0, ext={"entry": "fused", "xflags": RPAD, "E": 8, "top_k": 2})
    s["fused_stage_alpha"] = make(3, 128, 0, ext={"entry": "fused", "xflags": ALPHA, "alpha": 1.0,
                                                  "E": 8, "top_k": 2})
    s["fused_mxfp4_fb"] = make(6, 256, 0, elem=3, tensors=poison,
                               ext={"entry": "fused", "xflags": FULL | EPLB, "max_tokens": 8,
                                    "E": 12, "top_k": 3, "R": 4, "P": 48})
    # 4. Full buffer, K = 0 and max_tokens = 2^62: every top-k output is empty (valid), yet
    #    the CPU repack looped over all 2^62 rows (a call that never returned).
    s["bug_fb_k0_huge_max_tokens"] = make(5, 128, 0, mode=RAW,
                                          ext={"entry": "routing", "xflags": FULL, "max_tokens": 1 << 62})
    # H == 0 with NVFP4 per-token: nothing to quantize, yet x_scales [T] is written (from
    #    the amax floor); a shortcut for H == 0 must not skip it.
    s["h0_nvfp4_per_token_x_scales"] = make(3, 0, 8, mode=XSCALES, elem=3, scale=3, scale2=2,
                                            group_k=16, tensors={"x_scales": {"fill": 0x11}})
    # A subnormal amax floor: a zero group's fp8 scale fl(floor / 448) underflows to 0, whose
    #    UE8M0 byte is 1 (log2 0 = -Inf, clamped); the reference once read frexp(0)'s
    #    exponent 0 as 2^0 and expected 127 (found by the CI fuzzing run). fp32 scales: s = 0,
    #    r = 1/0 = +Inf, every code NaN (0x7F). MXFP4: amax = floor, byte 1.
    zeros = b"\0" * 4
    s["floor_denorm_min_ue8m0_zero_groups"] = make(3, 256, 2, floor_bits=1, payload=zeros)
    s["floor_denorm_min_fp32_zero_groups"] = make(3, 256, 2, scale=1, group_k=128, floor_bits=1,
                                                 payload=zeros)
    s["floor_denorm_min_mxfp4_zero_groups"] = make(3, 256, 2, elem=3, floor_bits=1, payload=zeros)
    return s


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    if len(sys.argv) > 1:
        out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(seeds().items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds())} seeds to {out}")


if __name__ == "__main__":
    main()
