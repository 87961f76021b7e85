"""The CPU expert pool against the numpy reference on every weight type it has a kernel for: the C dequantizers
bit for bit against gguf-py, the pooled SwiGLU experts against float64 numpy on odd row counts, several rows per
expert and more rows than one pass serves; untouched output rows stay as they were (NaN-poisoned)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as GT
from gguf import quants as gq

from strata_cli.ops import moe
from strata_cli.tiers import native
from strata_cli.tiers.plan import build_plan
from strata_cli.tiers.pool import ExpertPool

# (f16 scale fields' byte offsets in a block) for random valid blocks
SCALES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "IQ4_NL": (0,),
          "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,),
          "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,),
          "IQ1_M": (), "TQ1_0": (52,), "TQ2_0": (64,), "MXFP4": (), "NVFP4": ()}
FLOATS = ("F32", "F16", "BF16")


def native_block(type_name: str) -> int:
    return 1 if type_name in FLOATS else GGML_QUANT_SIZES[GT[type_name]][0]


def random_raw(type_name: str, rows: int, n: int, rng) -> np.ndarray:
    """[rows, row bytes | n] raw data of a valid tensor of `rows` rows of n weights."""
    if type_name == "F32":
        return rng.standard_normal((rows, n)).astype(np.float32) * 0.1
    if type_name == "F16":
        return (rng.standard_normal((rows, n)) * 0.1).astype(np.float16)
    if type_name == "BF16":
        return gq.quantize(rng.standard_normal((rows, n)).astype(np.float32) * 0.1, GT.BF16)
    block, size = GGML_QUANT_SIZES[GT[type_name]]
    raw = rng.integers(0, 256, size=(rows, n // block, size), dtype=np.uint8)
    for off in SCALES[type_name]:
        d = (rng.uniform(0.0002, 0.002, size=raw.shape[:2]) * rng.choice([-1, 1, 1, 1], size=raw.shape[:2]))
        d.reshape(-1)[::17] = 0.0
        raw[:, :, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
    if type_name == "IQ1_M":  # the fp16 d lives in the top nibbles of the four u16 scale words at 48..55
        d = (rng.uniform(0.0002, 0.002, size=raw.shape[:2]) * rng.choice([-1, 1], size=raw.shape[:2]))
        bits = d.astype(np.float16).view(np.uint16)
        words = raw[:, :, 48:56].copy().view(np.uint16) & 0x0FFF
        for i in range(4):
            words[..., i] |= ((bits >> (4 * i)) & 0xF) << 12
        raw[:, :, 48:56] = words.view(np.uint8)
    if type_name == "MXFP4":  # e8m0 exponents near 2^-8 (0 and 1 decode to subnormal halves: kept in)
        raw[:, :, 0] = rng.choice(np.r_[0, 1, np.arange(110, 125)], size=raw.shape[:2])
    if type_name == "NVFP4":  # ue4m3 scales, small and subnormal ones, zero and 0x7F (both decode to 0)
        raw[:, :, 0:4] = rng.choice(np.r_[0, 1, 5, 0x7F, np.arange(0x20, 0x38)], size=(*raw.shape[:2], 4))
    return raw.reshape(rows, -1)


def dequant_ref(raw: np.ndarray, type_name: str) -> np.ndarray:
    """gguf's numpy dequantization (the format reference) of rows of raw data."""
    if type_name in ("F32", "F16"):
        return raw.astype(np.float32)
    return gq.dequantize(raw, GT[type_name])


ALL_TYPES = sorted(native.NATIVE_TYPES, key=native.NATIVE_TYPES.get)
needs_native = pytest.mark.skipif(native.load() is None, reason="no C compiler: the pool runs on numpy here")
# every ISA build this CPU runs (AVX-512, AVX2) and the scalar twin (-DSTRATA_NO_SIMD): all must decode bit for bit
# and agree with numpy
BUILDS = pytest.mark.parametrize("build", [isa for isa in native.host_isas() if isa != "scalar"] + ["no-simd"])


def library(build):
    if build == "no-simd":
        return native.load_variant(("STRATA_NO_SIMD=1",))
    return native.load_variant((), isa=build)


@needs_native
@BUILDS
@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_dequant_row_is_bit_identical_to_gguf(type_name, build):
    rng = np.random.default_rng(native.NATIVE_TYPES[type_name])
    n = 128 if native_block(type_name) <= 64 else 512
    raw = np.ascontiguousarray(random_raw(type_name, 6, n, rng))
    lib = library(build)
    out = np.full(n, np.nan, dtype=np.float32)
    for r in range(raw.shape[0]):
        assert lib.strata_dequant_row(native.NATIVE_TYPES[type_name], raw[r].ctypes.data, n, out.ctypes.data) == 0
        np.testing.assert_array_equal(out.view(np.uint32), dequant_ref(raw[r:r + 1], type_name)[0].view(np.uint32))
    assert lib.strata_dequant_row(native.NATIVE_TYPES[type_name], raw[0].ctypes.data, n - 1, out.ctypes.data) in (
        0 if type_name in ("F32", "F16", "BF16") else -1,)


class FakeModel:
    """What ExpertPool reads from a GGUFModel: geometry and blk.L.ffn_{gate,up,down}_exps infos."""

    def __init__(self, types, n_layers=2, E=6, H=64, F=96, k=3, seed=0):
        rng = np.random.default_rng(seed)
        self.geometry = SimpleNamespace(n_layers=n_layers, n_expert=E, n_embd=H, n_ff_exp=F, n_expert_used=k)
        self.tensors = {}
        for layer in range(n_layers):
            for role, t, rows, n in (("gate", types[0], F, H), ("up", types[1], F, H), ("down", types[2], H, F)):
                raw = random_raw(t, E * rows, n, rng)
                raw = raw.reshape(E, rows, raw.shape[-1])
                self.tensors[f"blk.{layer}.ffn_{role}_exps.weight"] = SimpleNamespace(
                    raw=raw, ggml_type=native.NATIVE_TYPES[t], n_bytes=raw.nbytes, shape=(n, rows, E))

    def info(self, name):
        return self.tensors[name]


def reference(model, layer, x, plan_cpu, types):
    """float64 numpy SwiGLU on gguf-dequantized weights, per entry."""
    out = {}
    for i, e in enumerate(plan_cpu.experts):
        w = []
        for role, t in zip(("gate", "up", "down"), types):
            info = model.info(f"blk.{layer}.ffn_{role}_exps.weight")
            w.append(dequant_ref(info.raw[e], t).astype(np.float64))
        tok, dst = plan_cpu.entries(i)
        y = moe.swiglu(x[tok], *w)
        out.update({int(d): y[j] for j, d in enumerate(dst)})
    return out


def check_pool(model, pool, types, ids, layer=1, table=None, seed=1):
    g = model.geometry
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ids.shape[0], g.n_embd)).astype(np.float32)
    table = np.full(g.n_expert, -1, np.int32) if table is None else table
    plan = build_plan(layer, ids, table)
    out = np.full((ids.shape[0] * g.n_expert_used, g.n_embd), np.nan, dtype=np.float32)
    pool.compute(layer, x, plan.cpu, out=out)
    ref = reference(model, layer, x, plan.cpu, types)
    scale = max(np.abs(np.stack(list(ref.values()))).max(), 1e-6)
    for dst, y in ref.items():
        np.testing.assert_allclose(out[dst], y, rtol=1e-4, atol=2e-5 * scale, err_msg=f"row {dst}")
    untouched = sorted(set(range(out.shape[0])) - set(ref))
    assert np.isnan(out[untouched]).all()
    # the tier host's call (compute_step: the pointers made in C) writes the same bits and nothing else
    step = np.full_like(out, np.nan)
    pool.compute_step(layer, x, plan.cpu, step)
    np.testing.assert_array_equal(step, out)
    return plan


def routed(n, E, k, rng):
    return np.stack([rng.choice(E, k, replace=False) for _ in range(n)])


@needs_native
@BUILDS
@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_native_pool_matches_numpy(type_name, build):
    big = native_block(type_name) > 32
    model = FakeModel((type_name,) * 3, H=256 if big else 64, F=256 if big else 128 if native_block(type_name) == 64
                      else 96)
    pool = ExpertPool(model, n_threads=3, lib=library(build))
    assert pool.native_layers == [True, True]
    rng = np.random.default_rng(3)
    table = np.full(6, -1, np.int32)
    table[4] = 0  # one resident expert: its rows are not the pool's
    for n in (1, 5):
        plan = check_pool(model, pool, (type_name,) * 3, routed(n, 6, 3, rng), table=table)
        assert 4 not in plan.cpu.experts


@needs_native
@BUILDS
@pytest.mark.parametrize("types", [("Q8_0", "BF16", "F16"), ("Q2_K", "Q2_K", "Q4_0"), ("IQ2_XS", "IQ3_XXS", "MXFP4"),
                                   ("Q4_K", "Q6_K", "IQ4_NL")], ids=lambda t: "+".join(t))
def test_mixed_types_and_more_rows_than_one_pass(types, build):
    """19 rows on expert 0: one work item serves 16 per pass over its weight rows (in column chunks of 256 at 16
    rows: 768 = 3 chunks, 544 = 256 + 256 + 32), a pass of the fused kernel 8 (AVX-512) or 4 (AVX2) rows, then
    the other 3 rows in smaller passes."""
    big = any(native_block(t) > 32 for t in types)
    model = FakeModel(types, E=4, k=2, H=768 if big else 544, F=512 if big else 96)
    pool = ExpertPool(model, n_threads=2, lib=library(build))
    ids = np.stack([[0, 1 + i % 3] for i in range(19)])
    check_pool(model, pool, types, ids, layer=0)


@needs_native
@BUILDS
def test_nvfp4_every_scale_byte(build):
    """The fused NVFP4 decoder reads its scales from a 256-entry table made when the library loads (no branches on
    the scale bytes): every ue4m3 byte (0 and 0x7F decode to 0; the subnormals; 0x80-0xFF, whose sign bit gguf
    ignores) is some sub-block's scale, and the row decodes bit for bit as gguf's (strata_dequant_row runs the
    passes' decoder), then the pool's SwiGLU on such experts matches numpy."""
    rng = np.random.default_rng(8)
    raw = random_raw("NVFP4", 4, 1024, rng)  # 4 rows x 16 blocks x 4 scales = 256 sub-blocks
    raw.reshape(4, 16, 36)[:, :, 0:4] = rng.permutation(256).astype(np.uint8).reshape(4, 16, 4)
    raw = np.ascontiguousarray(raw)
    lib = library(build)
    out = np.full(1024, np.nan, dtype=np.float32)
    for r in range(4):
        assert lib.strata_dequant_row(native.NATIVE_TYPES["NVFP4"], raw[r].ctypes.data, 1024, out.ctypes.data) == 0
        np.testing.assert_array_equal(out.view(np.uint32), dequant_ref(raw[r:r + 1], "NVFP4")[0].view(np.uint32))
    model = FakeModel(("NVFP4",) * 3, E=4, k=2, H=256, F=256, seed=5)
    for role in ("gate", "up", "down"):
        blocks = model.info(f"blk.0.ffn_{role}_exps.weight").raw.reshape(4, -1, 36)
        blocks[:, :, 0:4] = rng.integers(0, 256, size=(*blocks.shape[:2], 4), dtype=np.uint8)
    pool = ExpertPool(model, n_threads=2, lib=library(build))
    check_pool(model, pool, ("NVFP4",) * 3, routed(5, 4, 2, np.random.default_rng(7)), layer=0)


@needs_native
@BUILDS
def test_float_rows_of_odd_length(build):
    """rows that are no multiple of the fused kernels' 16 lanes take the scalar path and stay right"""
    types = ("F32", "F16", "BF16")
    model = FakeModel(types, E=3, k=2, H=72, F=40)
    pool = ExpertPool(model, n_threads=3, lib=library(build))
    check_pool(model, pool, types, routed(7, 3, 2, np.random.default_rng(4)), layer=1)


def test_pool_threads_setting(monkeypatch):
    from strata_cli.errors import InputError
    from strata_cli.tiers.pool import default_threads

    monkeypatch.setenv("STRATA_POOL_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("STRATA_POOL_THREADS", "0")
    with pytest.raises(InputError, match="STRATA_POOL_THREADS"):
        default_threads()


def test_numpy_fallback_is_the_reference_engine_arithmetic(monkeypatch):
    model = FakeModel(("Q8_0", "F32", "BF16"))
    pool = ExpertPool(model, use_native=False)
    assert pool.backend == "numpy"
    rng = np.random.default_rng(5)
    ids = routed(3, 6, 3, rng)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    plan = build_plan(0, ids, np.full(6, -1, np.int32))
    out = pool.compute(0, x, plan.cpu)
    for i, e in enumerate(plan.cpu.experts):
        w = [dequant_ref(model.info(f"blk.0.ffn_{r}_exps.weight").raw[e], t).astype(np.float64)
             for r, t in zip(("gate", "up", "down"), ("Q8_0", "F32", "BF16"))]
        tok, dst = plan.cpu.entries(i)
        np.testing.assert_array_equal(out[dst], moe.swiglu(x[tok], *w))


def test_unsupported_type_falls_back_per_layer():
    model = FakeModel(("Q8_0",) * 3)
    model.tensors["blk.0.ffn_up_exps.weight"].ggml_type = 99  # no kernel (and no dequantizer) for it
    pool = ExpertPool(model)
    assert pool.native_layers[0] is False
    if native.load() is not None:
        assert pool.native_layers[1] is True and "numpy on the rest" in pool.backend


@needs_native
def test_word_primitives():
    lib = native.load()
    words = np.zeros(2, dtype=np.uint32)
    addr = words.ctypes.data
    words[0] = 2
    assert lib.strata_wait_geq(addr, 2, 0) == 2
    assert lib.strata_wait_geq(addr, 9, 200_000) == 2  # times out after 0.2 ms, returns what it saw
    data = np.arange(3 << 20, dtype=np.uint8)
    ptrs = np.array([data.ctypes.data, data[5:].ctypes.data], dtype=np.uint64)
    sizes = np.array([data.nbytes, 1000], dtype=np.int64)
    total = lib.strata_stream_read(2, 2, ptrs.ctypes.data, sizes.ctypes.data)
    assert total == float(data.astype(np.uint64).sum() + data[5:1005].astype(np.uint64).sum())
    assert isinstance(ctypes.c_double(total).value, float)


def test_rows_are_checked_and_any_x_layout_works():
    model = FakeModel(("Q8_0",) * 3)
    pool = ExpertPool(model, n_threads=2)
    rng = np.random.default_rng(9)
    ids = routed(4, 6, 3, rng)
    plan = build_plan(1, ids, np.full(6, -1, np.int32))
    x = np.asfortranarray(rng.standard_normal((4, 64)))  # float64, column-major: converted, same result
    np.testing.assert_array_equal(pool.compute(1, x, plan.cpu), pool.compute(1, x.astype(np.float32), plan.cpu))
    with pytest.raises(ValueError, match="plan rows out of range"):
        pool.compute(1, x[:2], plan.cpu)
    with pytest.raises(ValueError, match="rows of 64 expected"):
        pool.compute(1, x[:, :32], plan.cpu)


@needs_native
def test_a_build_the_compiler_refuses_falls_back_to_the_next_isa(monkeypatch, capsys):
    monkeypatch.setattr(native, "ISAS", (("bogus", set(), ["-mno-such-isa-flag"]),) + native.ISAS)
    lib = native.load.__wrapped__()
    assert lib is not None and lib.isa == native.host_isas()[1]
    assert "cannot build expert_pool.c for bogus" in capsys.readouterr().err


def rows_dots(lib, type_name, raw, x, lane):
    """[rows, m] dot products of raw's weight rows with x's rows through the pool's kernel (lane order or not)."""
    raw, x = np.ascontiguousarray(raw), np.ascontiguousarray(x, dtype=np.float32)
    out = np.full((raw.shape[0], x.shape[0]), np.nan, np.float32)
    assert lib.strata_rows_dots(native.NATIVE_TYPES[type_name], raw.ctypes.data, raw.shape[1], raw.shape[0],
                                x.shape[1], x.ctypes.data, x.shape[0], lane, out.ctypes.data) == 0
    return out


# the AVX-512 lane-order kernels (expert_pool_groups.h: x or h permuted once per call, codes as 16 dwords) serve rows
# of n % 256 == 0 (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, TQ2_0, TQ1_0, IQ1_S, IQ1_M; in the avx512vbmi build the
# gate/up rows of IQ2_XXS, IQ3_XXS, IQ3_S, x as int8 limbs by blocks or pairs of blocks: expert_pool_limbs.h) or n % 128 == 0 (Q4_0,
# Q4_1, IQ4_NL, MXFP4, Q5_0, Q5_1, NVFP4); the shapes above are mostly not such
GRID_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
LANE_ORDER = ("Q2_K", "Q3_K", "Q4_1", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q4_0", "IQ4_NL", "MXFP4", "Q5_0",
              "TQ2_0", "TQ1_0", "IQ1_S", "IQ1_M", "NVFP4") + GRID_TYPES


@needs_native
@BUILDS
@pytest.mark.parametrize("type_name", LANE_ORDER)
@pytest.mark.parametrize("H,F", [(768, 384), (512, 512)], ids=["down-128", "down-256"])
def test_lane_order_kernels_match_numpy(type_name, H, F, build):
    """gate/up rows of 768 / 512 (lane order), down rows of 384 (lane order for the 128-weight types; the K types'
    down rows take the weight-table kernel, fed a plain h) and 512 (lane order for all): 1, 4 and 19 rows on an
    expert (a pass of 8 rows, of 4, 2 and 1) and odd routings; mixed with another type beside it"""
    down = type_name if int(F) % native_block(type_name) == 0 else "Q4_0"
    for types in ((type_name, type_name, down), (type_name, "Q8_0", down), ("Q6_K", type_name, "Q8_0")):
        if H % native_block(types[0]) or H % native_block(types[1]) or F % native_block(types[2]):
            continue
        model = FakeModel(types, E=4, k=2, H=H, F=F)
        pool = ExpertPool(model, n_threads=3, lib=library(build))
        rng = np.random.default_rng(native.NATIVE_TYPES[type_name])
        for n_rows in (1, 4, 19):
            check_pool(model, pool, types, np.stack([[0, 1 + i % 3] for i in range(n_rows)]), layer=0)
        check_pool(model, pool, types, routed(5, 4, 2, rng), layer=1)


@needs_native
@BUILDS
@pytest.mark.parametrize("type_name", GRID_TYPES)
@pytest.mark.parametrize("n", [256, 768, 1280])
def test_grid_kernels_yield_every_weight_bit_for_bit(type_name, n, build):
    """One-hot token rows through the fused kernels the pool runs (strata_rows_dots: the lane-order one where the pool
    takes it, in the avx512vbmi build IQ2_XXS's, IQ3_XXS's and IQ3_S's integer-product kernels at 1 and 2 rows, and the
    weight-table one), 1, 2 and 16 rows a call: each output is one weight, equal to gguf's (the scale times the
    exact grid value is gguf's product). Rows of 1, 3 and 5 blocks: the IQ2 pair
    kernels' lone last block, a pair and one, two pairs and one; 3 weight rows (IQ3's two-row passes at one token row
    and their lone last row)."""
    lib = library(build)
    raw = np.ascontiguousarray(random_raw(type_name, 3, n, np.random.default_rng(native.NATIVE_TYPES[type_name] + n)))
    ref = dequant_ref(raw, type_name)
    for lane in (1, 0):
        for m in (1, 2, 16):
            got = np.full((raw.shape[0], n), np.nan, dtype=np.float32)
            for k in range(0, n, m):
                cols = (k + np.arange(m)) % n
                x = np.zeros((m, n), dtype=np.float32)
                x[np.arange(m), cols] = 1.0
                got[:, cols] = rows_dots(lib, type_name, raw, x, lane)
            np.testing.assert_array_equal(got, ref, err_msg=f"lane {lane}, {m} rows a call")


@needs_native
@BUILDS
@pytest.mark.parametrize("type_name", ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0"])
def test_limb_kernels_hold_x_of_every_scale(type_name, build):
    """The grid i-quants' and TQ1_0's x rows at 1 and 2 token rows (in the avx512vbmi build: x as int8 limbs of a
    mantissa per dword lane, expert_pool_limbs.h) on rows of 5 blocks (two pairs and a lone one) whose x blocks lie decades
    apart (1e20, 1e-20, a zero block, subnormals, a block with one value 1e4 times its others): every dot within
    1e-5 of float64 relative to sum |w x| (each sub-block's x holds its own exponent, so the 1e4 value costs its
    15-31 neighbours 13 of their 23 bits: 2.6e-6 there, ~1e-7 elsewhere); a NaN or an infinity in one block of a
    row makes that row's outputs NaN and leaves the other row's right. TQ1_0 within 3e-5: a third of its weights are
    0, so where the 1e4 value's weight is 0 sum |w x| leaves it out while its 15 lane neighbours still lost their bits
    (1.5e-5 on these rows; float32 summation alone is ~3e-6)"""
    lib, n = library(build), 1280
    tol = 3e-5 if type_name == "TQ1_0" else 1e-5
    rng = np.random.default_rng(native.NATIVE_TYPES[type_name] + 7)
    raw = np.ascontiguousarray(random_raw(type_name, 24, n, rng))
    w = dequant_ref(raw, type_name).astype(np.float64)
    x = rng.standard_normal((2, n)).astype(np.float32)
    x[0, :256] *= 1e20
    x[0, 256:512] *= 1e-20
    x[0, 512:768] = 0.0
    x[0, 768:1024] = np.float32(1e-41) * np.sign(x[0, 768:1024])  # subnormals
    x[1, 1024 + 17] = 1e4
    for m in (1, 2):
        got = rows_dots(lib, type_name, raw, x[:m], 1)
        ref, bound = w @ x[:m].T.astype(np.float64), np.abs(w) @ np.abs(x[:m].T.astype(np.float64))
        assert np.isfinite(got).all()
        assert (np.abs(got - ref) <= tol * bound + 1e-37).all(), f"{m} rows: {np.max(np.abs(got - ref) / bound)}"
    for bad in (np.nan, np.inf):
        xb = x.copy()
        xb[1, 300] = bad
        got = rows_dots(lib, type_name, raw, xb, 1)
        assert np.isnan(got[:, 1]).all() or (bad == np.inf and not np.isfinite(got[:, 1]).any())
        ref = w @ x[0].astype(np.float64)
        assert (np.abs(got[:, 0] - ref) <= tol * (np.abs(w) @ np.abs(x[0].astype(np.float64))) + 1e-37).all()


@needs_native
@BUILDS
@pytest.mark.parametrize("types", [("IQ2_XXS", "IQ3_S", "IQ2_XS"), ("IQ3_XXS", "IQ2_S", "Q4_0")],
                         ids=lambda t: "+".join(t))
def test_grid_rows_of_the_released_width(types, build):
    """gate/up rows of 2560 (10 blocks: one column chunk of 4096 at 1 row, chunks of 2048 and 512 at 2), gate and up
    of two grid types (each its own order of x), down rows of 512 in a grid type (the weight-table kernel: h is
    written element by element, never in a pair-of-blocks order) or Q4_0; 1, 2 and 5 rows an expert"""
    model = FakeModel(types, E=3, k=2, H=2560, F=512 if types[2] != "Q4_0" else 640, n_layers=1)
    pool = ExpertPool(model, n_threads=2, lib=library(build))
    for n_rows in (1, 2, 5):
        check_pool(model, pool, types, np.stack([[0, 1 + i % 2] for i in range(n_rows)]), layer=0)


@needs_native
@BUILDS
@pytest.mark.parametrize("down", ["Q4_0", "Q2_K"])
@pytest.mark.parametrize("H", [69, 70, 71])
def test_one_row_passes_over_several_weight_rows(down, H, build):
    """At one token row an expert's lane-order rows run several weight rows a pass (Q4_0: 4, then 2, 1; Q2_K: 2,
    then 1): down rows of H = 69 / 70 / 71 (a work item of 64, then one of 5 / 6 / 7) leave every remainder; gate/up
    in F16 (rows of H are no multiple of 16: the scalar path); 1 row an expert and odd routings"""
    types = ("F16", "F16", down)
    model = FakeModel(types, E=4, k=2, H=H, F=256)
    pool = ExpertPool(model, n_threads=2, lib=library(build))
    check_pool(model, pool, types, np.array([[0, 1]]), layer=0)
    check_pool(model, pool, types, routed(5, 4, 2, np.random.default_rng(H)), layer=1)


@needs_native
def test_native_calls_count_their_kernel_and_wake_time():
    """verify-bench's pool C ms / pool wake ms: each native call adds the kernel's wall time and, of it, the team's
    wake-up; the numpy path adds nothing"""
    model = FakeModel(("Q4_0",) * 3)
    pool = ExpertPool(model, n_threads=2)
    rng = np.random.default_rng(8)
    plan = build_plan(1, routed(3, 6, 3, rng), np.full(6, -1, np.int32))
    x = rng.standard_normal((3, 64)).astype(np.float32)
    pool.compute(1, x, plan.cpu)
    first = pool.kernel_ns
    assert 0 < pool.wake_ns <= first
    pool.compute(1, x, plan.cpu)
    assert pool.kernel_ns > first
    numpy_pool = ExpertPool(model, use_native=False)
    numpy_pool.compute(1, x, plan.cpu)
    assert numpy_pool.kernel_ns == 0 and numpy_pool.wake_ns == 0


# the lane-order kernels of the few-valued types (expert_pool_few.h: TQ2_0, TQ1_0, IQ1_S, IQ1_M, NVFP4, and MXFP4's
# in expert_pool_groups.h) and the weight-table kernels beside them, one dot product at a time (strata_rows_dots)
FEW = ("TQ2_0", "TQ1_0", "IQ1_S", "IQ1_M", "MXFP4", "NVFP4")


@needs_native
@BUILDS
@pytest.mark.parametrize("lane", [1, 0], ids=["lane", "weight-table"])
@pytest.mark.parametrize("type_name", FEW)
def test_few_value_kernels_are_the_weights_bit_for_bit(type_name, lane, build):
    """With x one-hot (column j) every dot product is one weight times 1 plus exact zeros, so the kernels must give
    gguf's weight [i, j] exactly: the lane kernels' unscaled values times the block's or sub-block's scale are gguf's
    products (d * code, dl * (grid + delta), the e2m1 value times ue4m3 / e8m0 halves). m one-hot rows at a time: 1, 2,
    3, 4, 7, 8 and 16 (every pass of 8, 4, 2, 1 rows and their remainders; 16: two column chunks of 256 for rows of
    768); NVFP4's sub-blocks take every scale byte. Then random x against float64 numpy."""
    rng = np.random.default_rng(40 + native.NATIVE_TYPES[type_name])
    n, rows = 768, 7  # odd: the two-row passes at one token row (TQ1_0's limbs) and their lone last row
    raw = random_raw(type_name, rows, n, rng)
    if type_name == "NVFP4":  # 7 rows x 12 blocks x 4 scales: every ue4m3 byte, 0x7F and the subnormals among them
        scales = np.r_[rng.permutation(256), rng.integers(0, 256, rows * 48 - 256)].astype(np.uint8)
        raw.reshape(rows, -1, 36)[:, :, 0:4] = scales.reshape(rows, -1, 4)
    w = dequant_ref(raw, type_name)
    lib = library(build)
    for m in (1, 2, 3, 4, 7, 8, 16):
        cols = np.arange(n) if m == 16 else rng.permutation(n)[:8 * m]
        for j0 in range(0, len(cols) - m + 1, m):
            x = np.zeros((m, n), np.float32)
            x[np.arange(m), cols[j0:j0 + m]] = 1.0
            np.testing.assert_array_equal(rows_dots(lib, type_name, raw, x, lane), w[:, cols[j0:j0 + m]],
                                          err_msg=f"m={m} columns {cols[j0:j0 + m]}")
    x = rng.standard_normal((5, n)).astype(np.float32)
    want = w.astype(np.float64) @ x.astype(np.float64).T
    bound = np.abs(w).astype(np.float64) @ np.abs(x).astype(np.float64).T
    assert (np.abs(rows_dots(lib, type_name, raw, x, lane) - want) <= 1e-6 * bound + 1e-30).all()


@needs_native
@BUILDS
@pytest.mark.parametrize("type_name", FEW)
def test_few_value_rows_of_other_lengths(type_name, build):
    """Rows whose length the lane kernels do not take (TQ/IQ1: not a multiple of 256 is no row of whole blocks;
    MXFP4 / NVFP4 rows of 32 / 64 x odd: the weight-table kernel) and one of a single step, as the pool's SwiGLU:
    gate/up rows of 64 x 3 or 256, down rows of 32 x 7 / 64 x 5 or 256, experts of 1, 3 and 9 rows."""
    block = native_block(type_name)
    H, F = (256, 256) if block == 256 else (192, 224 if block == 32 else 320)
    down = type_name if F % block == 0 else "Q4_0"
    model = FakeModel((type_name, type_name, down), E=4, k=2, H=H, F=F, seed=9)
    pool = ExpertPool(model, n_threads=2, lib=library(build))
    for n_rows in (1, 3, 9):
        check_pool(model, pool, (type_name, type_name, down), np.stack([[0, 1 + i % 3] for i in range(n_rows)]),
                   layer=0)
    lib = library(build)
    raw = random_raw(type_name, 2, block, np.random.default_rng(1))
    x = np.zeros((1, block - 1), np.float32)
    assert lib.strata_rows_dots(native.NATIVE_TYPES[type_name], raw.ctypes.data, raw.shape[1], 2, block - 1,
                                x.ctypes.data, 1, 1, x.ctypes.data) == -1
