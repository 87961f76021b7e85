"""Model weights on the device: matrices as their GGUF bytes (the kernels dequantize), small tensors as f32.

Q8_0 GEMV matrices whose rows come in whole groups of 32 are repacked once, on the device, into the Q8_0_R32
layout (strata_cli/model/packed.py): same bytes, read with 16-byte loads. Gathered tables (token and PLE
embeddings) stay raw: their kernels read single rows. So do the hyper-connection up matrices (kernels/hyper.cu
hc_up_mix reads them element-wise); each read's down and inject matrices are stacked into one (hc(prefix)), and
the projections of a layer's mixed rows (the same input) into one GEMV where their types agree (STACKS: a GDN
layer's qkv and z; a QSA layer's k, v, q and indexer q and k; the PLE's key and value of its gathered rows;
stack(layer, name)). A shared expert of the routed
experts' types and width is appended to their tensors as one more expert (shared_expert_id).
"""

from __future__ import annotations

import numpy as np

from ...gpu.launch_hyper import UP_TYPES, HcWeights
from ...gpu.launch_moe import router_fuses
from ...gpu.runtime import cupy
from ...model import packed, quants
from ...model.gguf_file import GGUFModel
from ...model.names import GATHERED, PLE_TABLE, blk_tensor
from ...ops.hyper import down_inject_rows

# 2-D tensors the kernels read as float32 arrays rather than raw rows (conv taps; tiny and always F32 in files)
F32_MATRICES = ("ssm_conv1d.weight", "ple_conv1d.weight")
HC_READS = ("hc_attn", "hc_ffn")  # blk.N.<read>_*: the two reads of a layer; output_hc: the head's
# a layer's projections of its mixed rows stacked into one matrix, rows in this order (the roles a layer has: the
# indexer's q only with the indexer); window.py reads the GEMV's output rows at these offsets
QKVZ, KVQ, PLE_KV = "attn_qkvz.weight", "attn_kvq.weight", "ple_kv.weight"
# routed expert tensor -> its shared expert's: the shared expert joins the routed launches as one more expert where
# each pair agrees in type and shape (shared_expert_id)
SHARED_AS_EXPERT = {"ffn_gate_exps.weight": "ffn_gate_shexp.weight", "ffn_up_exps.weight": "ffn_up_shexp.weight",
                    "ffn_down_exps.weight": "ffn_down_shexp.weight"}
STACKS = {QKVZ: ("attn_qkv.weight", "attn_gate.weight"),
          KVQ: ("attn_k.weight", "attn_v.weight", "attn_q.weight", "indexer.q_proj.weight", "indexer.k_proj.weight"),
          PLE_KV: ("ple_key.weight", "ple_value.weight")}


def hc_prefix(name: str) -> str | None:
    """The read a hyper-connection tensor belongs to ("blk.3.hc_ffn", "output_hc"), or None."""
    head, _, role = name.rpartition("_")
    if role not in ("norm.weight", "down.weight", "up.weight", "inject.weight"):
        return None
    return head if head == "output_hc" or head.endswith(HC_READS) else None


class DeviceWeights:
    """raw(name): a matrix as its GGUF rows on the device and its GGML type (the kernels dequantize); f32(name): a
    vector (or conv taps) as a float32 device array. blk_raw / blk_f32 name a layer's tensor by role."""

    def __init__(self, model: GGUFModel, pack_q8: bool = True, skip=None):
        """skip(name) -> True leaves that tensor in the file (the expert tiers upload resident experts only)."""
        cp = cupy()
        self.model = model
        self.packed = 0  # bytes repacked to Q8_0_R32
        self._raw: dict[str, tuple[object, int]] = {}
        self._f32: dict[str, object] = {}
        self._hc: dict[str, HcWeights] = {}
        self._stack_rows: dict[str, int] = {}
        self._shared_id: dict[str, int] = {}  # "blk.N.": the expert id the shared expert has in the routed tensors
        reads = []
        for name in list(model.specs) + ([PLE_TABLE] if model.geometry.ple is not None else []):
            if skip is not None and skip(name):
                continue
            prefix = hc_prefix(name)
            if prefix is not None:
                if name.endswith("_norm.weight"):
                    reads.append(prefix)
                continue
            if _stacked_role(model, name):
                blk = name[:name.index(".", 4) + 1]
                for stack in STACKS:
                    if blk + stack not in self._raw and _stack_roles(model, blk, stack):
                        self._stack(model, blk, stack, pack_q8)
                continue
            blk = name[:name.index(".", 4) + 1] if name.startswith("blk.") else ""
            if name[len(blk):] in SHARED_AS_EXPERT.values() or name[len(blk):] in SHARED_AS_EXPERT:
                if _merges_shared(model, blk, skip):
                    if blk not in self._shared_id:
                        self._merge_shared(model, blk, pack_q8)
                    continue
            info = model.info(name)
            if name.endswith("ffn_gate_inp_shexp.weight"):  # a [D] or [D, 1] gate row, read as one GEMV row
                arr = cp.asarray(np.ascontiguousarray(model.f32(name), dtype=np.float32).reshape(1, -1))
                self._raw[name] = (arr, 0)
            elif len(info.shape) == 1 or name.endswith(F32_MATRICES):
                arr = cp.asarray(np.ascontiguousarray(model.f32(name), dtype=np.float32))
                self._f32[name] = arr
            else:
                arr = cp.asarray(np.ascontiguousarray(info.raw))
                ggml_type = info.ggml_type
                if pack_q8 and name not in GATHERED and packed.packable(tuple(arr.shape), ggml_type):
                    from ...gpu.launch_pack import pack_q8_0

                    arr = pack_q8_0(arr, _n_in(info), out=cp.empty_like(arr))
                    ggml_type = packed.Q8_0_R32
                    self.packed += arr.nbytes
                self._raw[name] = (arr, ggml_type)

        for prefix in reads:
            self._hc[prefix] = self._hc_read(model, prefix, pack_q8)
        cp.cuda.Device().synchronize()  # the packing ran on the current stream; engines use their own

    def _hc_read(self, model: GGUFModel, prefix: str, pack_q8: bool) -> HcWeights:
        cp = cupy()
        down, up = model.info(f"{prefix}_down.weight"), model.info(f"{prefix}_up.weight")
        inject = model.info(f"{prefix}_inject.weight") if f"{prefix}_inject.weight" in model.specs else None
        n_in, L = _n_in(down), _n_in(up)
        raw, ggml_type = down_inject_rows(down.raw, down.ggml_type, None if inject is None else inject.raw,
                                          None if inject is None else inject.ggml_type, n_in)
        dn = cp.asarray(raw)
        if pack_q8 and packed.packable(tuple(dn.shape), ggml_type):
            from ...gpu.launch_pack import pack_q8_0

            dn = pack_q8_0(dn, n_in, out=cp.empty_like(dn))
            ggml_type = packed.Q8_0_R32
            self.packed += dn.nbytes
        norm = cp.asarray(np.ascontiguousarray(model.f32(f"{prefix}_norm.weight"), dtype=np.float32))
        n_inj = 0 if inject is None else int(inject.shape[1])
        up_raw, up_type = up.raw, up.ggml_type
        if up_type not in UP_TYPES:  # hc_up_mix reads W_up element-wise: a block type (a recipe's IQ4_NL) is
            # uploaded as its exact dequantized values (the truth of a quantized file; W_up is C*D x L, small)
            up_raw, up_type = np.ascontiguousarray(model.f32(f"{prefix}_up.weight"), dtype=np.float32), quants.F32
        return HcWeights(norm, dn, ggml_type, L, n_inj, cp.asarray(np.ascontiguousarray(up_raw)), up_type)

    def _stack(self, model: GGUFModel, blk: str, stack: str, pack_q8: bool) -> None:
        """Upload blk's roles of `stack` as one matrix (their rows in STACKS order)."""
        cp = cupy()
        infos = [model.info(blk + role) for role in _stack_roles(model, blk, stack)]
        arr = cp.asarray(np.concatenate([np.ascontiguousarray(i.raw) for i in infos]))
        ggml_type = infos[0].ggml_type
        if pack_q8 and packed.packable(tuple(arr.shape), ggml_type):
            from ...gpu.launch_pack import pack_q8_0

            arr = pack_q8_0(arr, _n_in(infos[0]), out=cp.empty_like(arr))
            ggml_type = packed.Q8_0_R32
            self.packed += arr.nbytes
        self._raw[blk + stack] = (arr, ggml_type)
        self._stack_rows[blk + stack] = sum(int(i.shape[1]) for i in infos)

    def _merge_shared(self, model: GGUFModel, blk: str, pack_q8: bool) -> None:
        """Upload blk's routed gate / up / down experts with the shared expert appended as one more expert (assembled
        on the device: no host copy of the routed tensors)."""
        cp = cupy()
        for exps, shexp in SHARED_AS_EXPERT.items():
            routed, shared = model.info(blk + exps), model.info(blk + shexp)
            raw = routed.raw
            arr = cp.empty((raw.shape[0] + 1, *raw.shape[1:]), dtype=raw.dtype)
            _fill(arr[:-1], np.ascontiguousarray(raw))
            _fill(arr[-1], np.ascontiguousarray(shared.raw).reshape(raw.shape[1:]))
            ggml_type = routed.ggml_type
            if pack_q8 and packed.packable(tuple(arr.shape), ggml_type):
                from ...gpu.launch_pack import pack_q8_0

                arr = pack_q8_0(arr, _n_in(routed), out=cp.empty_like(arr))
                ggml_type = packed.Q8_0_R32
                self.packed += arr.nbytes
            self._raw[blk + exps] = (arr, ggml_type)
            self._shared_id[blk] = int(raw.shape[0])

    def shared_expert_id(self, layer: int) -> int | None:
        """The expert id layer's shared expert has in its routed expert tensors (appended last), or None (its types
        or width differ from the routed experts', or the routed ones are tiered: its own launches)."""
        return self._shared_id.get(f"blk.{layer}.")

    def stack(self, layer: int, name: str):
        """(raw, type, rows) of layer's stacked projection `name` (QKVZ, KVQ, PLE_KV), or None (their types
        differ, or the layer has no such projections: a GEMV each)."""
        key = f"blk.{layer}.{name}"
        return (*self._raw[key], self._stack_rows[key]) if key in self._raw else None

    def hc(self, prefix: str) -> HcWeights:
        """The weights of one hyper-connection read ("blk.3.hc_attn", "output_hc")."""
        return self._hc[prefix]

    def raw(self, name: str):
        """(raw device array in numpy order, GGML type)."""
        return self._raw[name]

    def f32(self, name: str):
        return self._f32[name]

    def arrays(self):
        """(name, device array) of every upload: matrices and stacks under their names (a stack as blk.N.<stack>),
        f32 tensors, each HC read's "<prefix>_norm.weight", "<prefix>_down_inject" and "<prefix>_up.weight"
        (the profiling graph's byte ledger, engine/stage_bytes.py, knows the weights a launch reads by them)."""
        yield from ((name, arr) for name, (arr, _) in self._raw.items())
        yield from self._f32.items()
        for prefix, hc in self._hc.items():
            yield from ((f"{prefix}_norm.weight", hc.norm_w), (f"{prefix}_down_inject", hc.dn_raw),
                        (f"{prefix}_up.weight", hc.up_raw))

    def blk_raw(self, layer: int, role: str):
        return self._raw[blk_tensor(layer, role)]

    def blk_f32(self, layer: int, role: str):
        return self._f32[blk_tensor(layer, role)]


def _stack_roles(model: GGUFModel, blk: str, stack: str) -> list[str] | None:
    """The roles of `stack` blk has (two at least), if they stack: one type, one input width; else None."""
    roles = [role for role in STACKS[stack] if blk + role in model.specs]
    if len(roles) < 2:
        return None
    infos = [model.info(blk + role) for role in roles]
    same = {(i.ggml_type, i.shape[0], np.dtype(i.raw.dtype)) for i in infos}
    return roles if len(same) == 1 else None


def _merges_shared(model: GGUFModel, blk: str, skip) -> bool:
    """Whether blk's shared expert joins its routed experts' tensors: all six tensors there and uploaded (not the
    tiers'), each routed tensor of its shared one's type and row shape, and a router that router_gemv_topk takes
    (the scalar gate is uploaded as F32, which it decodes)."""
    names = [blk + n for pair in SHARED_AS_EXPERT.items() for n in pair]
    if not blk or not all(n in model.specs for n in names) or (skip is not None and any(skip(n) for n in names)):
        return False
    router = model.info(blk + "ffn_gate_inp.weight")  # its launch gives the shared expert its slot (window._moe)
    if not router_fuses(router.ggml_type, model.geometry.n_expert):
        return False
    for exps, shexp in SHARED_AS_EXPERT.items():
        routed, shared = model.info(blk + exps), model.info(blk + shexp)
        if (routed.ggml_type != shared.ggml_type or routed.raw.dtype != shared.raw.dtype
                or tuple(routed.raw.shape[1:]) != tuple(np.shape(shared.raw)[-2:])):
            return False
    return True


def _fill(dst, host) -> None:
    """Copy host rows into a device array in place (CuPy's set: no device temporary) or a host one."""
    if hasattr(dst, "set"):
        dst.set(host)
    else:
        np.copyto(dst, host)


def _stacked_role(model: GGUFModel, name: str) -> bool:
    """Whether tensor `name` is uploaded only as part of a stack of its layer."""
    if not name.startswith("blk."):
        return False
    blk = name[:name.index(".", 4) + 1]
    role = name[len(blk):]
    return any(role in roles and _stack_roles(model, blk, stack) for stack, roles in STACKS.items())


def _n_in(info) -> int:
    """Input width of a GEMV matrix: the GGUF's ne0 (numpy's last axis holds its raw bytes)."""
    return int(info.shape[0])
