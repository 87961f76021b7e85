"""Helpers shared by the GPU kernel tests: raw weight encoding, NaN-poisoned outputs, one closeness check."""

from __future__ import annotations

import numpy as np

from strata_cli.model import quants

TYPES = (quants.F32, quants.F16, quants.BF16, quants.Q8_0)
TYPE_IDS = [quants.TYPE_NAMES[t] for t in TYPES]


def raw_weight(rng, shape, ggml_type, scale=0.5):
    """Random float32 weights of `shape` (numpy order) encoded as the raw array a GGUF file holds."""
    return quants.quantize((rng.standard_normal(shape) * scale).astype(np.float32), ggml_type)


def to_dev(a):
    import cupy as cp

    return cp.asarray(a)


def poisoned(shape, dtype=np.float32):
    """An output buffer every kernel must overwrite: NaN for floats, a sentinel -7 for ints."""
    import cupy as cp

    return cp.full(shape, np.nan if np.dtype(dtype).kind == "f" else -7, dtype=dtype)


def assert_close(name, ref, got, rtol=1e-4, atol=1e-4, floor=1e-30):
    """got (CuPy or numpy) matches ref within rtol, and atol relative to ref's scale (at least `floor`: a lone
    output that happens to land near zero would otherwise get a tolerance far below float32 rounding); no NaN."""
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != reference {ref.shape}"
    assert not np.isnan(got).any(), f"{name}: {int(np.isnan(got).sum())} NaN left (unwritten or bad math)"
    scale = max(float(np.abs(ref).max()), floor)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * scale, err_msg=name)


def poison(dtype):
    """What an output is filled with before a replay: NaN for floats; for integer outputs (selected indices, counts)
    the type's most negative value, which no kernel writes as an index or a count."""
    dtype = np.dtype(dtype)
    return np.nan if dtype.kind == "f" else np.iinfo(dtype).min


def assert_replay_equals_eager(record, outputs, replays: int = 3) -> list[np.ndarray]:
    """record(stream) launched eagerly, then captured into a graph replayed `replays` times with every device array of
    `outputs` NaN-filled first: each replay writes the eager bits, and the eager outputs hold no NaN. Returns the
    eager outputs (host copies)."""
    import cupy as cp

    from strata_cli.gpu.graphs import CapturedGraph, new_stream

    stream = new_stream()
    cp.cuda.Device().synchronize()
    record(stream)
    stream.synchronize()
    eager = [out.get() for out in outputs]
    graph = CapturedGraph(record, stream)
    for _ in range(replays):  # every replay finds the z-split tile counters reset
        for out in outputs:
            out.fill(poison(out.dtype))
        cp.cuda.Device().synchronize()
        graph.launch()
        stream.synchronize()
        for out, want in zip(outputs, eager):
            np.testing.assert_array_equal(out.get(), want)
    assert not any(np.isnan(want).any() for want in eager)
    graph.destroy()
    return eager


def hc_weights(norm_w, down, down_type, up, up_type, inject, inject_type, pack: bool = False):
    """launch_hyper.HcWeights on the device from host raw matrices as DeviceWeights builds them: down and inject
    stacked (ops/hyper.down_inject_rows); pack: that matrix repacked to Q8_0_R32 when it is Q8_0 (model/packed.py,
    the numpy reference of the device packer)."""
    from strata_cli.gpu.launch_hyper import HcWeights
    from strata_cli.model import packed
    from strata_cli.ops.hyper import down_inject_rows

    n_in = norm_w.shape[0]
    dn, dn_type = down_inject_rows(down, down_type, inject, inject_type, n_in)
    if pack and packed.packable(dn.shape, dn_type):
        dn, dn_type = packed.pack_q8_0(dn, n_in), packed.Q8_0_R32
    L = down.shape[0]  # raw matrices in numpy order: [rows, *]
    n_inj = 0 if inject is None else inject.shape[0]
    return HcWeights(to_dev(norm_w), to_dev(dn), dn_type, L, n_inj, to_dev(up), up_type)
