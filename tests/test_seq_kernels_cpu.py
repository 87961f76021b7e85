"""CPU checks of the sequence-mixer GPU code: the topk replay port (kernels/topk_replay.cuh, built for the host)
against strata_cli/ops/topk_ties.py, and the launchers' argument checks (they run before any device call)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from strata_cli.gpu import launch_embed, launch_gdn, launch_hyper, launch_ple, launch_qsa
from strata_cli.gpu.compile import kernels_dir
from strata_cli.ops import topk_ties

HARNESS = r"""
#define __device__
#include <cstdio>
#include <vector>
#include "topk_replay.cuh"
int main() {
    int n, k;
    while (std::scanf("%d %d", &n, &k) == 2) {
        std::vector<unsigned> key(n);
        std::vector<int> idx(n);
        for (int i = 0; i < n; ++i) { std::scanf("%u", &key[i]); idx[i] = i; }
        tk_replay(TkPairs{key.data(), idx.data()}, n, k);
        for (int i = 0; i < n; ++i) std::printf("%d ", idx[i]);
        std::printf("\n");
    }
}
"""


def order_key(v: np.float32) -> int:
    """kernels/qsa_select.cu order_key: order-preserving uint32 image, -0 == +0."""
    u = int(np.float32(v).view(np.uint32))
    u = 0 if u & 0x7FFFFFFF == 0 else u
    return (~u & 0xFFFFFFFF) if u & 0x80000000 else u | 0x80000000


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the replay for the host")
def test_topk_replay_port_matches_python(tmp_path):
    src = tmp_path / "harness.cpp"
    src.write_text(HARNESS)
    exe = tmp_path / "harness"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{kernels_dir()}", str(src), "-o", str(exe)], check=True)
    rng = np.random.default_rng(0)
    cases = []
    for trial in range(600):
        n = int(rng.integers(2, 300))
        k = max(1, n // 64 - int(rng.integers(0, 2))) if trial % 4 == 0 else int(rng.integers(1, n))  # both paths
        vals = ((rng.integers(0, int(rng.integers(1, 6)), n) - 2) * 0.5).astype(np.float32)  # heavy ties
        vals[rng.random(n) < 0.1] = -0.0
        if trial % 5 == 0:
            vals = np.sort(vals)[:: 1 if trial % 10 else -1].copy()
        cases.append((vals, k))
    stdin = "".join(f"{len(v)} {k} " + " ".join(str(order_key(x)) for x in v) + "\n" for v, k in cases)
    lines = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(lines) == len(cases)
    for (vals, k), line in zip(cases, lines):
        q = [(float(x), i) for i, x in enumerate(vals)]
        if k * 64 <= len(vals):
            topk_ties._heap_select(q, 0, k, len(vals))
        else:
            topk_ties._nth_element(q, k - 1)
        assert [int(x) for x in line.split()] == [i for _, i in q], (vals, k)  # the whole permutation


def f32(*shape):
    return np.zeros(shape, np.float32)


def ple_mix(T=2, **given):
    """launch_ple.PleMix of a T-row window (C = 3 streams of D = 8, 3 conv taps at dilation 2) with the operands
    `given` replaced."""
    args = dict(key=f32(T, 24), value=f32(T, 8), history=f32(4, 24), norm_key=f32(24), norm_query=f32(24),
                norm_conv=f32(24), conv_w=f32(24, 3), dilation=2, normed=f32(T, 24))
    args.update(given)
    return launch_ple.PleMix(**args)


def gdn_mix(nk=1, nv=2, dk=2, dv=2, **given):
    """launch_gdn.gdn_mix of a 3-row window (Ch = 10, 3 conv taps, n_in 16) with the operands `given` replaced."""
    Ch = 2 * nk * dk + nv * dv
    args = dict(qkv=f32(3, Ch), conv_state=f32(2, Ch), conv_w=f32(Ch, 3), state=f32(nv, dk, dv), x=f32(3, 16),
                dt_bias=f32(nv), ssm_a=f32(nv), z=f32(3, nv, dv), norm_w=f32(dv), eps=1e-6, nk=nk, dk=dk, nv=nv, dv=dv,
                ab_proj=(f32(3, nv), f32(3, nv)))
    args.update(given)
    return launch_gdn.gdn_mix(**args)


def qsa_indexer(**given):
    """launch_qsa.Indexer of a 2-row window (2 heads of 12, ratio 3, 5 pooled blocks) with `given` replaced."""
    args = dict(qr=f32(2, 2, 12), qi_w=f32(12), keys=f32(2, 12), k_norm_w=f32(12), tail=f32(3, 12),
                pooled=f32(5, 12), budget=6, raw=None, scratch=None)
    args.update(given)
    return launch_qsa.Indexer(**args)


def scratch(T=2, NB=5, C=8):
    z = np.zeros
    return launch_qsa.SelectScratch(f32(T, NB), z((T, C), np.int32), z(T, np.int32), z((T, NB), np.uint32),
                                    z((T, NB), np.int32), z((T, NB), np.int32), *(z(n, np.int32) for n in (T, T, T, 1)))


def qsa_mix(**given):
    """launch_qsa.qsa_mix of a 2-row window (4 query / 2 kv heads of 40, 8 rotated dims) with `given` replaced."""
    args = dict(k=f32(2, 2, 40), v=f32(2, 2, 40), q=f32(2, 4, 40), gate=f32(2, 4, 40), k_w=f32(40), q_w=f32(40),
                k_cache=f32(9, 2, 40), v_cache=f32(9, 2, 40), cos=f32(9, 8), sin=f32(9, 8),
                positions=np.zeros(2, np.int32), eps=1e-6, indexer=None)
    args.update(given)
    return launch_qsa.qsa_mix(**args)


@pytest.mark.parametrize("call, name", [
    (lambda: gdn_mix(conv_state=f32(2, 9)), "conv_state"),
    (lambda: gdn_mix(conv_w=f32(10, 1), conv_state=f32(0, 10)), "conv_w"),
    (lambda: gdn_mix(qkv=f32(3, 9)), "qkv"),
    (lambda: gdn_mix(r0=3), "r0"),
    (lambda: gdn_mix(nk=3, nv=1, qkv=f32(3, 6 * 2 + 2), conv_state=f32(2, 14), conv_w=f32(14, 3)), "nv"),
    (lambda: gdn_mix(x=f32(2, 16)), "x"),
    (lambda: gdn_mix(z=f32(3, 2, 3)), "z"),
    (lambda: gdn_mix(ab_proj=None), "ab_raw"),
    (lambda: gdn_mix(ab_proj=None, ab_raw=(np.zeros((2, 144), np.uint8), 12, np.zeros((2, 144), np.uint8), 12)),
     "alpha_raw"),
    (lambda: gdn_mix(ab_proj=(f32(2, 2), f32(3, 2))), "alpha"),
    (lambda: launch_gdn.gdn_recurrence(f32(2, 128, 512), f32(1, 1, 128), f32(1, 1, 128), f32(1, 2, 512), f32(1, 2),
                                       f32(1, 2)), "state"),
    (lambda: launch_gdn.gdn_commit_state(f32(2, 8, 8), f32(3, 1, 8), f32(3, 1, 8), f32(3, 2, 8), f32(3, 2),
                                         f32(3, 2), 4), "n_keep"),
    (lambda: launch_gdn.gdn_conv_commit(f32(2, 9), f32(3, 9), 0, n_keep_dev=np.zeros(1, np.int64)), "n_keep_dev"),
    (lambda: launch_qsa.norm_rope(f32(2, 3, 80)[..., ::2], f32(40), 1e-6, f32(9, 8), f32(9, 8)), "x"),
    (lambda: launch_qsa.norm_rope(f32(2, 3, 40), f32(40), 1e-6, f32(9, 7), f32(9, 7)), "cos"),
    (lambda: qsa_mix(k=f32(2, 1, 40)), "k"),
    (lambda: qsa_mix(gate=f32(2, 3, 40)), "gate"),
    (lambda: qsa_mix(q=f32(2, 3, 40), gate=f32(2, 3, 40)), "q"),
    (lambda: qsa_mix(cos=f32(9, 7), sin=f32(9, 7)), "cos"),
    (lambda: qsa_mix(positions=np.zeros(2, np.int64)), "positions"),
    (lambda: qsa_mix(indexer=qsa_indexer(qr=f32(2, 2, 6))), "cos"),
    (lambda: qsa_mix(indexer=qsa_indexer(keys=f32(2, 24)[:, ::2])), "indexer.keys"),
    (lambda: qsa_mix(indexer=qsa_indexer(budget=-1)), "indexer.budget"),
    (lambda: qsa_mix(indexer=qsa_indexer(raw=f32(1, 12))), "indexer.raw"),
    (lambda: qsa_mix(indexer=qsa_indexer(scratch=scratch(C=4))), "scratch.cells"),
    (lambda: qsa_mix(k=f32(32, 1, 256), v=f32(32, 1, 256), q=f32(32, 2, 256), gate=f32(32, 2, 256),
                     positions=np.zeros(32, np.int32), k_cache=f32(9, 1, 256), v_cache=f32(9, 1, 256),
                     k_w=f32(256), q_w=f32(256)), "k"),  # 32 rows of 256: the window's keys exceed shared memory
    (lambda: launch_qsa.indexer_commit(f32(3, 40), f32(5, 40), f32(2, 40), np.zeros(2, np.int32), 3, f32(40), 1e-6,
                                       f32(9, 8), f32(9, 8)), "n_keep"),
    (lambda: launch_ple.ngram_rows(np.zeros(3, np.int64), np.zeros(8, np.int64), 0, np.zeros(9, np.int64), 1,
                                   np.zeros(8, np.int64), np.zeros(8, np.int64)), "prev"),
    (lambda: launch_ple.ngram_gather(np.zeros(3, np.int64), np.zeros(2, np.int64), 0, np.zeros(3, np.int64), 2,
                                     np.zeros(3, np.int64), np.zeros(4, np.int64), f32(5, 24), 0, 24), "vocab_sizes"),
    (lambda: launch_embed.gather_rows(np.zeros((2, 3), np.int32), f32(5, 24), 0, 24), "rows"),
    (lambda: launch_hyper.hc_write(f32(2, 3, 8), ple_mix()), "pending"),
    (lambda: launch_ple.ple_mix_norm(f32(2, 3, 8), ple_mix(history=f32(3, 24)), f32(24), f32(2, 24), 1e-6),
     "mix.history"),
    (lambda: launch_ple.ple_mix_norm(f32(2, 3, 8), ple_mix(key=f32(2, 32)[:, :20]), f32(24), f32(2, 24), 1e-6),
     "mix.key"),
    (lambda: launch_ple.ple_mix_norm(f32(2, 3, 8), ple_mix(value=f32(2, 16)[:, ::2]), f32(24), f32(2, 24), 1e-6),
     "mix.value"),
    (lambda: launch_ple.ple_mix_norm(f32(2, 3, 8), ple_mix(conv_w=f32(24, 1), history=f32(0, 24)), f32(24),
                                     f32(2, 24), 1e-6), "mix.conv_w"),
    (lambda: launch_ple.ple_mix_norm(f32(3, 3, 8), ple_mix(T=3), f32(24), f32(3, 24), 1e-6), "mix.sync"),
    (lambda: launch_ple.ple_mix_norm(f32(3, 3, 8), ple_mix(T=3, sync=np.zeros(9, np.uint32)), f32(24),
                                     f32(3, 24), 1e-6), "mix.sync"),
    (lambda: launch_ple.ple_mix_norm(f32(2, 3, 8), ple_mix(), f32(24), f32(1, 24), 1e-6), "xn"),
    (lambda: launch_ple.ple_kv(f32(2, 16), 3, kv=(f32(30, 16), 0)), "kv"),
    (lambda: launch_ple.ple_kv(f32(2, 16), 3, f32(20, 16), f32(8, 16)), "w_key"),
])
def test_launcher_checks_name_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        call()


@pytest.mark.parametrize("T,D,kernel,block,synced", [(1, 2560, "ple_mix_norm", 512, False),
                                                     (2, 40, "ple_mix_norm", 32, False),
                                                     (8, 2560, "ple_mix_norm", 512, True),
                                                     (3, 2600, "ple_mix_norm_passes", 512, True)])
def test_ple_mix_norm_launch(monkeypatch, T, D, kernel, block, synced):
    """launch_ple.ple_mix_norm's launch (the lookup behind compile.kernel replaced, host arrays): grid T*C blocks of
    the read's norm threads, the one-pass kernel where a stream's row fits 5 elements a thread, and the sync words
    only where a row's conv reads an earlier row of the window (T > dilation 2), else a null pointer."""
    from strata_cli.gpu import compile as nvrtc

    launched = []
    monkeypatch.setattr(nvrtc, "_function", lambda module, function, defines=(): (
        lambda grid, block, args, **kw: launched.append((module, function, grid, block, args))))
    C = 2
    sync = np.zeros(launch_ple.sync_words(T, C), np.uint32)
    mix = launch_ple.PleMix(f32(T, C * D), f32(T, D), f32(4, C * D), f32(C * D), f32(C * D), f32(C * D),
                            f32(C * D, 3), 2, f32(T, C * D), sync=sync)
    launch_ple.ple_mix_norm(f32(T, C, D), mix, f32(C * D), f32(T, C * D), 1e-6)
    (module, function, grid, threads, args), = launched
    assert (module, function, grid, threads) == ("ple", kernel, (T * C, 1, 1), (block, 1, 1))
    assert any(a is sync for a in args) == synced
    # no pending write: bo, parts, route_w, shared and inj_prev null, and sync where nothing waits
    assert sum(isinstance(a, np.uint64) and a == 0 for a in args) == 5 + (not synced)
