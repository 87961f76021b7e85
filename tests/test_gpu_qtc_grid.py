"""The qtc_* grouped expert GEMVs' persistent grid (kernels/gemv_quant.cu qtc_grouped: at most the resident blocks,
each taking a contiguous run of the live groups' row sets, the last chunk at more warps a set) against numpy: odd
expert counts and widths, T = 3, 4, 8, 16, routings with empty group slots, one group holding every row, a bad
expert id, grids forced down to 1 .. 7 blocks (many chunks a block, straddling groups, partial last chunks), the
old grid (launch_quant.LEGACY_GRID_DEFINES) and the T = 8 gate/up kernel at 4 blocks an SM (BLOCKS4_DEFINES), the
device A/B's other sides, on the same cases; NaN-poisoned outputs,
graph replay equal to eager (skipped without a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import assert_close, assert_replay_equals_eager, poisoned, to_dev

from strata_cli.gpu import launch_util as U
from strata_cli.model import quants as Q
from strata_cli.ops import gemv as ref
from strata_cli.ops import moe
from strata_cli.synth.blocks import random_tensor

pytestmark = pytest.mark.gpu

# the benchmark file's gate/up (Q2_K: 4 m tiles a warp from T = 3) and down (Q4_0: 2) types
GRID_TYPES = (Q.Q2_K, Q.Q4_0)
GRID_IDS = [Q.TYPE_NAMES[t] for t in GRID_TYPES]


@pytest.fixture(autouse=True)
def _fresh_resident():
    """launch_quant caches each kernel's resident blocks: the forced grids below must not outlive their test."""
    from strata_cli.gpu import launch_quant

    launch_quant._resident.clear()
    yield
    launch_quant._resident.clear()


def _routing(rng, case: str, T: int, E: int, K: int) -> np.ndarray:
    """ids [T, K]: 'random' (top-K of random logits: repeated experts, so empty group slots), 'one' (every row's
    first slot expert 0: one group of all T rows), 'bad' (random, the last entry out of range)."""
    ids = moe.router_topk(rng.standard_normal((T, E)).astype(np.float32), K)[0]
    if case == "one":
        for t in range(T):  # expert 0 first in every row, the row's other experts kept distinct
            row = [0] + [int(e) for e in ids[t] if e != 0][:K - 1]
            ids[t] = row + [e for e in range(1, E) if e not in row][:K - len(row)]
    elif case == "bad":
        ids[-1, -1] = E + 3
    return ids.astype(np.int32)


def _run(ggml_type, gate, up, gd, ud, E, D, F, T, K, ids, rng):
    """Both qtc_* kernels on one routing (gate/up, then the expert GEMV of gate with silu * mul) against numpy."""
    import cupy as cp

    from strata_cli.gpu import launch_moe, launch_quant

    J = T * K
    groups = [cp.empty((J,), cp.int32), cp.empty((J,), cp.int32), cp.empty((J, U.GEMV_MAXT), cp.int32)]
    launch_moe.group_entries(to_dev(ids), J, groups)
    x = rng.standard_normal((T, D)).astype(np.float32)
    rows, e = np.repeat(np.arange(T), K), ids.reshape(-1)
    ok = (e >= 0) & (e < E)
    g = np.zeros((J, F), np.float32)
    u = np.zeros((J, F), np.float32)
    G = np.stack([ref.gemv(gate[i], ggml_type, D, x) for i in range(E)])  # [E, T, F]: every expert on every row
    Up = np.stack([ref.gemv(up[i], ggml_type, D, x) for i in range(E)])
    g[ok], u[ok] = G[e[ok], rows[ok]], Up[e[ok], rows[ok]]
    mul = rng.standard_normal((J, F)).astype(np.float32)
    stride = gate.nbytes // E
    h = poisoned((J, F))
    launch_quant.launch_gateup_quant(gd, ud, ggml_type, stride, E, groups, J, T, to_dev(x), K, D, h)
    y = poisoned((J, F))
    launch_quant.launch_expert_gemv_quant(gd, ggml_type, stride, E, groups, J, T, to_dev(x), K, D, y,
                                          act=U.ACT_SILU, mul=to_dev(mul), mul_strides=(F, 1))
    with np.errstate(over="ignore"):
        silu = g / (1.0 + np.exp(-g))
    return [(what, got.get(), want, ok) for what, got, want in (("gateup", h, silu * u),
                                                                ("expert silu*mul", y, silu * mul))]


@pytest.mark.parametrize("variant", ("persistent", "legacy", "blocks4"))
@pytest.mark.parametrize("ggml_type", GRID_TYPES, ids=GRID_IDS)
def test_qtc_grid_matches_reference(ggml_type, variant, monkeypatch):
    """Also the device A/B's variants: the old grid, and the T = 8 gate/up kernel at 4 blocks an SM."""
    from strata_cli.gpu import launch_quant

    defines = {"persistent": (), "legacy": launch_quant.LEGACY_GRID_DEFINES, "blocks4": launch_quant.BLOCKS4_DEFINES}
    monkeypatch.setattr(launch_quant, "qtc_defines", defines[variant])
    rng = np.random.default_rng(7 * ggml_type + len(variant))
    E, F, D, K = 13, 67, 1280, 3  # odd experts, 67 rows (a last row set part empty), 5 steps of 256
    gate = random_tensor(rng, ggml_type, (E, F, D), 0.05)
    up = random_tensor(rng, ggml_type, (E, F, D), 0.05)
    gd, ud = to_dev(gate), to_dev(up)
    for resident in (None, 1, 2, 7):  # None: the device's; else a grid of that many blocks at most
        launch_quant._resident.clear()
        if resident is not None:
            monkeypatch.setattr(launch_quant, "qtc_resident", lambda kernel, smem, r=resident: r)
        for T in (3, 4, 8, 16):
            for case in ("random", "one", "bad"):
                ids = _routing(rng, case, T, E, K)
                name = f"{Q.TYPE_NAMES[ggml_type]} {variant} resident={resident} T={T} {case}"
                for what, got, want, ok in _run(ggml_type, gate, up, gd, ud, E, D, F, T, K, ids, rng):
                    assert np.isnan(got[~ok]).all(), f"{what} {name}: a bad id's entry is not NaN"
                    assert_close(f"{what} {name}", want[ok], got[ok], floor=0.05)


@pytest.mark.parametrize("ggml_type", GRID_TYPES, ids=GRID_IDS)
def test_qtc_grid_full_chunks_are_the_old_grids_bits(ggml_type, monkeypatch):
    """Where every block's units are whole chunks (all groups live, the row sets a multiple of a block's sets, a grid
    of the old block count) each row set runs at the launch's ksplit as on the old grid: the same bits."""
    import cupy as cp

    from strata_cli.gpu import launch_moe, launch_quant

    rng = np.random.default_rng(ggml_type + 40)
    E, F, D, K, T = 11, 256, 1280, 4, 1  # T = 1: K distinct experts, K live groups; 256 rows: whole row blocks
    gate = random_tensor(rng, ggml_type, (E, F, D), 0.05)
    up = random_tensor(rng, ggml_type, (E, F, D), 0.05)
    gd, ud = to_dev(gate), to_dev(up)
    ids = _routing(rng, "random", T, E, K)
    J = T * K
    groups = [cp.empty((J,), cp.int32), cp.empty((J,), cp.int32), cp.empty((J, U.GEMV_MAXT), cp.int32)]
    launch_moe.group_entries(to_dev(ids), J, groups)
    x = to_dev(rng.standard_normal((T, D)).astype(np.float32))
    out = {}
    for legacy in (True, False):
        monkeypatch.setattr(launch_quant, "qtc_defines", launch_quant.LEGACY_GRID_DEFINES if legacy else ())
        h, y = poisoned((J, F)), poisoned((J, F))
        launch_quant.launch_gateup_quant(gd, ud, ggml_type, gate.nbytes // E, E, groups, J, T, x, K, D, h)
        launch_quant.launch_expert_gemv_quant(gd, ggml_type, gate.nbytes // E, E, groups, J, T, x, K, D, y)
        out[legacy] = (h.get(), y.get())
    for a, b in zip(out[True], out[False]):
        assert not np.isnan(a).any()
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("ggml_type", GRID_TYPES, ids=GRID_IDS)
def test_qtc_grid_graph_replay_is_eager(ggml_type, monkeypatch):
    """The work list is derived on the device (the live groups from g_count): a captured graph replays to the eager
    bits, also on a grid of 5 blocks (partial last chunks)."""
    import cupy as cp

    from strata_cli.gpu import launch_moe, launch_quant

    rng = np.random.default_rng(ggml_type + 90)
    E, F, D, K = 13, 67, 1280, 3
    gd, ud = (to_dev(random_tensor(rng, ggml_type, (E, F, D), 0.05)) for _ in range(2))
    stride = gd.nbytes // E
    for resident in (None, 5):
        launch_quant._resident.clear()
        if resident is not None:
            monkeypatch.setattr(launch_quant, "qtc_resident", lambda kernel, smem, r=resident: r)
        for T in (3, 8, 16):
            J = T * K
            ids = to_dev(_routing(rng, "random", T, E, K))
            x = to_dev(rng.standard_normal((T, D)).astype(np.float32))
            groups = [cp.empty((J,), cp.int32), cp.empty((J,), cp.int32), cp.empty((J, U.GEMV_MAXT), cp.int32)]
            h, y = cp.empty((J, F), cp.float32), cp.empty((J, F), cp.float32)

            def record(stream, T=T, J=J, ids=ids, x=x, groups=groups, h=h, y=y):
                with stream:  # (moe_group inside: the groups are the graph's own)
                    launch_moe.group_entries(ids, J, groups)
                    launch_quant.launch_gateup_quant(gd, ud, ggml_type, stride, E, groups, J, T, x, K, D, h)
                    launch_quant.launch_expert_gemv_quant(gd, ggml_type, stride, E, groups, J, T, x, K, D, y)

            assert_replay_equals_eager(record, (h, y))
