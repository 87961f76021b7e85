"""Per kernel of kernels/*.cu: its SASS size, registers and local memory, compiled on the CPU (no GPU needed).

    python3 bench/kernel_sass.py [MODULE ...] [--rev REV] [--base REV] [--arch sm_90] [--min N] [--quant]

Each module (compile.module_names()'s: 'hyper', 'gemv.f16', ...; default every one but the gemv_quant variants,
--quant adds them) is compiled by NVRTC for --arch with compile.nvrtc_compile, the options and headers a window
loads (compile.nvrtc_options); the cubin is read back with cuobjdump (-sass: instructions, -res-usage: registers,
stack, local and static shared bytes). An instruction is 16 bytes on sm_90, so instructions x 16 is the kernel's
code; the SM's instruction cache holds far less than a big unrolled kernel (tens of KB, not hundreds), so a kernel
grown 5-10x stalls on fetches though it issues the same work.
--rev REV reads kernels/ of a git revision instead of the working tree; --base REV adds REV's numbers and the ratio
(e.g. --base 58d476b: before the latency1 merge). --min N lists only kernels of N or more instructions (either
side). A module missing from a tree, or failing to compile there, shows as '-'.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from strata_cli.gpu import compile as C  # noqa: E402
from strata_cli.gpu import quant_source  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(\S.*?)\s*;")
RESOURCES = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


@dataclass
class KernelSize:
    instructions: int  # every SASS instruction of the function (its subroutines and end padding included)
    nops: int
    registers: int
    stack: int  # bytes a thread
    local: int  # bytes a thread (spills and arrays indexed at run time land here or on the stack)
    shared: int  # static bytes a block


def tool(name: str) -> str:
    """cuobjdump on PATH, else the nvidia-cuda-cuobjdump wheel's."""
    found = shutil.which(name)
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(root).glob(f"*/bin/{name}")):
            return str(candidate)
    raise SystemExit(f"kernel_sass: {name} not found (pip install nvidia-cuda-cuobjdump)")


def tree_modules(src_dir: Path, quant: bool) -> list[str]:
    """compile.module_names() of the kernels/ folder src_dir (gemv_quant's variants only with quant)."""
    stems = sorted(p.stem for p in src_dir.glob("*.cu"))
    names = [f"{C.GEMV}.{v}" for v in C.GEMV_VARIANTS] if C.GEMV in stems else []
    if quant and quant_source.BASE in stems:
        names += [f"{quant_source.BASE}.{quant_source.variant(t)}" for t in quant_source.TYPES]
    return names + [s for s in stems if s not in (C.GEMV, quant_source.BASE)]


def parse(sass: str, resources: str) -> dict[str, KernelSize]:
    counts: dict[str, list[int]] = {}
    current = None
    for line in sass.splitlines():
        if "Function : " in line:
            current = counts.setdefault(line.split("Function : ", 1)[1].strip(), [0, 0])
            continue
        m = INSTRUCTION.match(line)
        if m and current is not None:
            current[0] += 1
            current[1] += m.group(1).startswith("NOP")
    out = {}
    for name, reg, stack, shared, local in RESOURCES.findall(resources):
        n, nops = counts.get(name, (0, 0))
        out[name] = KernelSize(n, nops, int(reg), int(stack), int(local), int(shared))
    return out


def measure(job: tuple[str, str, Path]) -> tuple[str, dict[str, KernelSize] | str]:
    """(module, {kernel: size}) or (module, why it has none)."""
    name, arch, src_dir = job
    if not (src_dir / f"{name.partition('.')[0]}.cu").is_file():
        return name, "missing"
    try:
        _, cubin = C.nvrtc_compile(name, arch, src_dir=src_dir)
    except RuntimeError as exc:
        return name, str(exc).splitlines()[0]
    cuobjdump = tool("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return name, parse(sass, res)


def rev_kernels(rev: str, into: Path) -> Path:
    """kernels/ of git revision rev, extracted under into."""
    try:
        data = subprocess.run(["git", "-C", str(REPO), "archive", rev, "kernels"], capture_output=True,
                              check=True).stdout
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"kernel_sass: git archive {rev}: {exc.stderr.decode().strip()}") from None
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "kernels"


def measure_tree(modules: list[str], arch: str, src_dir: Path) -> dict[str, dict[str, KernelSize] | str]:
    with ProcessPoolExecutor() as pool:
        return dict(pool.map(measure, [(m, arch, src_dir) for m in modules]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="modules (default: every one of the tree but gemv_quant's)")
    ap.add_argument("--rev", help="measure kernels/ of this git revision (default: the working tree)")
    ap.add_argument("--base", help="also measure this git revision and show it next to the first")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--min", type=int, default=0, help="only kernels of at least N instructions (either side)")
    ap.add_argument("--quant", action="store_true", help="with the gemv_quant variants")
    args = ap.parse_args(argv)
    tool("cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        head_dir = rev_kernels(args.rev, Path(tmp) / "head") if args.rev else C.kernels_dir()
        base_dir = rev_kernels(args.base, Path(tmp) / "base") if args.base else None
        modules = args.modules or sorted(set(tree_modules(head_dir, args.quant))
                                         | set(tree_modules(base_dir, args.quant) if base_dir else ()),
                                         key=lambda m: (m.partition(".")[0], m))
        unknown = [m for m in modules if m.partition(".")[0] not in {p.stem for p in head_dir.glob("*.cu")}
                   and not (base_dir and (base_dir / f"{m.partition('.')[0]}.cu").is_file())]
        if unknown:
            raise SystemExit(f"kernel_sass: no kernels/{unknown[0].partition('.')[0]}.cu")
        head = measure_tree(modules, args.arch, head_dir)
        base = measure_tree(modules, args.arch, base_dir) if base_dir else None
    report(modules, head, base, args)
    return 0


def report(modules, head, base, args) -> None:
    here = args.rev or "tree"
    cols = f"{'module':<14} {'kernel':<28} {'instr':>7} {'KB':>6} {'reg':>4} {'stack':>5} {'local':>5}"
    if base is not None:
        cols += f" | {args.base + ' instr':>14} {'reg':>4} {'stack':>5} {'local':>5} {'x':>6}"
    print(f"# {args.arch}, {here}" + (f" vs {args.base}" if base is not None else ""))
    print(cols)
    for m in modules:
        now, before = head[m], (base[m] if base is not None else {})
        for why, side in ((now, here), (before, args.base)):
            if isinstance(why, str) and why != "missing":
                print(f"{m:<14} ({side}: {why})")
        kernels = sorted(set(now if isinstance(now, dict) else ()) | set(before if isinstance(before, dict) else ()))
        for k in kernels:
            a = now.get(k) if isinstance(now, dict) else None
            b = before.get(k) if isinstance(before, dict) else None
            if max(a.instructions if a else 0, b.instructions if b else 0) < args.min:
                continue
            row = f"{m:<14} {k:<28} " + (f"{a.instructions:>7} {a.instructions * 16 / 1024:>6.1f} {a.registers:>4} "
                                         f"{a.stack:>5} {a.local:>5}" if a else f"{'-':>7} {'-':>6} {'-':>4} "
                                         f"{'-':>5} {'-':>5}")
            if base is not None:
                row += (f" | {b.instructions:>14} {b.registers:>4} {b.stack:>5} {b.local:>5}" if b
                        else f" | {'-':>14} {'-':>4} {'-':>5} {'-':>5}")
                row += f" {a.instructions / b.instructions:>6.2f}" if a and b else f" {'-':>6}"
            print(row)


if __name__ == "__main__":
    sys.exit(main())
