"""strata's own dequantizers and encoders are bit-identical to gguf-py's (the format reference)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import GGUFReader, quants as gq

from strata_cli.model import quants

TYPES = [(quants.F16, GT.F16), (quants.BF16, GT.BF16), (quants.Q8_0, GT.Q8_0)]


@pytest.mark.parametrize("ours,theirs", TYPES, ids=["F16", "BF16", "Q8_0"])
@pytest.mark.parametrize("shape", [(1, 32), (7, 96), (3, 5, 160)])
def test_encode_and_decode_match_gguf(ours, theirs, shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1, 300], size=shape)).astype(np.float32)
    x.reshape(-1)[:32] = 0  # an all-zero Q8_0 block (scale 0)
    raw = gq.quantize(x, theirs)
    if ours != quants.F16:
        np.testing.assert_array_equal(quants.quantize(x, ours), raw)
    np.testing.assert_array_equal(quants.dequantize(raw, ours), gq.dequantize(raw, theirs))


def test_fixture_tensors_dequantize_like_gguf(fixture_dir):
    for kind in ("bf16", "q8_0"):
        reader = GGUFReader(fixture_dir / f"model-{kind}.gguf")
        checked = 0
        for t in reader.tensors:
            if int(t.tensor_type) in (quants.F16, quants.BF16, quants.Q8_0):
                raw = np.asarray(t.data)
                np.testing.assert_array_equal(quants.dequantize(raw, int(t.tensor_type)),
                                              gq.dequantize(raw, t.tensor_type), err_msg=t.name)
                checked += 1
        assert checked > 100


# ---------------------------------------------------------------- every block type

from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

from strata_cli.synth import blocks  # noqa: E402

BLOCK_TYPES = list(quants.BLOCK_TYPES)
BLOCK_IDS = [quants.TYPE_NAMES[t] for t in BLOCK_TYPES]


def test_type_table_is_ggufs():
    """Every type gguf.quants dequantizes is in strata's table, with gguf's block sizes and ids."""
    dequantizable = {t for t in GT if t in gq._type_traits} | {GT.F32, GT.F16}
    assert {int(t) for t in dequantizable} == set(quants.QUANT_TYPES)
    for t in dequantizable:
        qt = quants.QUANT_TYPES[int(t)]
        assert (qt.name, qt.block, qt.nbytes) == (t.name, *GGML_QUANT_SIZES[t])


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=BLOCK_IDS)
@pytest.mark.parametrize("lead", [(1,), (7,), (3, 5)])
def test_every_block_type_decodes_like_gguf(ggml_type, lead):
    """Random bytes (any scale bit pattern, NaN and inf included) and realistic random blocks: the same floats."""
    elems, size = quants.BLOCK[ggml_type]
    rng = np.random.default_rng([ggml_type, *lead])
    n = elems * int(rng.integers(1, 5))
    raw_any = rng.integers(0, 256, size=(*lead, n // elems * size), dtype=np.uint8)
    raw_real = blocks.random_tensor(rng, ggml_type, (*lead, n), 0.05)
    for raw in (raw_any, raw_real):
        with np.errstate(invalid="ignore", over="ignore"):  # NaN / inf scales in raw_any
            want = gq.dequantize(raw, GT(ggml_type))
            got = quants.dequantize(raw, ggml_type)
        assert got.dtype == np.float32 and got.shape == (*lead, n)
        np.testing.assert_array_equal(got, want)
        rows = rng.integers(0, lead[0], size=3)  # the embedding / PLE gather path: rows decoded alone
        with np.errstate(invalid="ignore", over="ignore"):
            np.testing.assert_array_equal(quants.dequantize(raw[rows], ggml_type), want[rows])


@pytest.mark.parametrize("ggml_type", BLOCK_TYPES, ids=BLOCK_IDS)
def test_random_blocks_have_the_target_spread(ggml_type):
    rng = np.random.default_rng(ggml_type)
    for std in (0.02, 1.0):
        values = quants.dequantize(blocks.random_tensor(rng, ggml_type, (16, 1024), std), ggml_type)
        assert np.isfinite(values).all()
        assert 0.7 * std < values.std() < 1.4 * std, (quants.TYPE_NAMES[ggml_type], std, values.std())
        assert abs(values.mean()) < 0.5 * std


def _set_type_id(path, tensor: str, type_id: int) -> None:
    """Overwrite one tensor's GGML type id in the header (name bytes, n_dims u32, dims u64[n], type u32)."""
    data = bytearray(path.read_bytes())
    key = tensor.encode()
    at = data.index(len(key).to_bytes(8, "little") + key) + 8 + len(key)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    at += 4 + 8 * n_dims
    data[at:at + 4] = type_id.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def test_unknown_type_id_is_one_line_naming_the_tensor(tmp_path):
    from click.testing import CliRunner

    from strata_cli.cli import main
    from strata_cli.synth import load_preset, write_model

    path = write_model(tmp_path / "m.gguf", load_preset("tiny"), seed=0, ggml_type="Q4_0")
    _set_type_id(path, "blk.1.ffn_up_exps.weight", 77)
    result = CliRunner().invoke(main, ["info", str(path)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "blk.1.ffn_up_exps.weight" in lines[0] and "77" in lines[0], result.output
