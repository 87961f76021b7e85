"""The generated C/CUDA type tables (model/quant_tables.py) say what the quant table (model/quants.py) says: the
host header compiled with the system C compiler reports every type's id, block elements and bytes and its tables'
sizes, and no kernel file keeps a hand-written copy of a type id or block size (skipped without a C compiler)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

from strata_cli.gpu.compile import kernels_dir
from strata_cli.model import quant_tables as QT
from strata_cli.model import quants as Q

# The generated header expanded into arrays a test reads through ctypes: QUANT_TYPES' entries in order, the tables'
# sizeof, and the T_<NAME> macros by name (each checked against the X-macro's entry of the same type).
PROBE = r"""
#include <stdint.h>
#include "expert_pool_tables.h"
#define ENTRY(TYPE, QK, BYTES) {TYPE, QK, BYTES},
const int32_t probe_types[][3] = {QUANT_TYPES(ENTRY)};
const int32_t probe_count = sizeof probe_types / sizeof probe_types[0];
const int32_t probe_qk_k = QK_K;
%s
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    cc = next((shutil.which(n) for n in ("cc", "gcc", "clang") if shutil.which(n)), None)
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("quant_tables")
    (out / "expert_pool_tables.h").write_text(QT.host_header())
    ids = "".join(f"const int32_t probe_id_{t.name} = T_{t.name};\n" for t in Q.QUANT_TYPES.values())
    sizes = "".join(f"const int64_t probe_sizeof_{name} = sizeof {name};\n"
                    for name in (*QT.HOST_TABLES.values(), "ksigns_iq2xs"))
    (out / "probe.c").write_text(PROBE % (ids + sizes))
    result = subprocess.run([cc, "-std=c11", "-shared", "-fPIC", f"-I{out}", "-o", str(out / "probe.so"),
                             str(out / "probe.c")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return ctypes.CDLL(str(out / "probe.so"))


def _int(lib, name, ctype=ctypes.c_int32):
    return ctype.in_dll(lib, name).value


def test_host_header_types_are_the_tables(probe):
    n = _int(probe, "probe_count")
    entries = np.ctypeslib.as_array((ctypes.c_int32 * (3 * n)).in_dll(probe, "probe_types")).reshape(n, 3)
    assert [tuple(e) for e in entries.tolist()] == [(t.id, t.block, t.nbytes) for t in Q.QUANT_TYPES.values()]
    assert {t.name: _int(probe, f"probe_id_{t.name}") for t in Q.QUANT_TYPES.values()} == Q.TYPE_IDS
    assert _int(probe, "probe_qk_k") == Q.QK_K


def test_host_tables_have_ggufs_sizes(probe):
    by_name = {c_name: owner for owner, c_name in QT.HOST_TABLES.items()}
    for c_name, owner in by_name.items():
        reader = next(t.id for t in Q.QUANT_TYPES.values() if owner in (t.grid, t.values))
        table = QT.grid_values(reader) if c_name.startswith("grid_") else np.array(QT.kvalues(reader))
        assert _int(probe, f"probe_sizeof_{c_name}", ctypes.c_int64) == table.size, c_name
    assert _int(probe, "probe_sizeof_ksigns_iq2xs", ctypes.c_int64) == 128


def test_device_prefix_carries_the_type_table():
    for t in Q.BLOCK_TYPES:
        head = QT.device_prefix(t)
        assert head.count(QT.types_header()) == 1 and f"#define QTYPE {t}\n" in head
        assert ("QGRID[" in head) == bool(Q.QUANT_TYPES[t].grid)
        assert ("QKVALUES[16]" in head) == bool(Q.QUANT_TYPES[t].values)


HAND_KEPT = re.compile(r"#define\s+T_[A-Z0-9_]+\s+\d|\bT_[A-Z0-9_]+\s*=\s*\d|QBLOCK\s*\(\s*T_\w+\s*,\s*\d"
                       r"|\*elems\s*=\s*\d")


def test_no_kernel_file_keeps_its_own_type_table():
    """Type ids and block sizes live in model/quants.py only: adding a type is the table, its decoders, its tests."""
    files = [p for p in sorted(kernels_dir().iterdir()) if p.suffix in (".c", ".h", ".cu", ".cuh")]
    assert any(p.name == "quant_decode.cuh" for p in files)
    offenders = [f"{p.name}: {m.group(0)}" for p in files for m in HAND_KEPT.finditer(p.read_text())]
    assert offenders == []


def test_host_tables_name_exactly_the_tables_the_types_read(monkeypatch):
    QT.host_header.cache_clear()
    monkeypatch.setitem(QT.HOST_TABLES, "IQ4_XS", "kvalues_iq4xs")
    with pytest.raises(ValueError, match="HOST_TABLES names the tables of"):
        QT.host_header()


def test_kernel_cache_key_follows_the_table_and_the_headers(tmp_path):
    """CuPy keys compiled modules on the source text: the generated table is in it, and so is a hash of the headers
    (quant_decode.cuh's decoders), so a change to either compiles anew."""
    from strata_cli.gpu import compile as C

    assert QT.types_header() in C.source("gemv_quant.q4_k")
    (tmp_path / "a.cuh").write_text("int a;\n")
    before = C.headers_tag(tmp_path)
    (tmp_path / "a.cuh").write_text("int b;\n")
    assert C.headers_tag(tmp_path) != before and C.headers_tag(tmp_path).startswith("\n// ")
