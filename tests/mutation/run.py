"""Mutation check: apply each canonical one-line bug (mutants.py) to a copy of the tree and run its CPU tests there.

    python tests/mutation/run.py                    # every mutant; a markdown table on stdout
    python tests/mutation/run.py --only router-ties,context-bound --out /tmp/mutation.md

A mutant is "killed" when its tests fail (pytest exit 1), "SURVIVED" when they pass, "error" when pytest cannot
run them (collection or usage error: the mutant broke an import, which also counts as caught but is reported).
The unmutated copy runs every subset first and must pass. Exit status: 0 when nothing survived and nothing was an
error, 1 otherwise. Not collected by pytest (conftest.py ignores this folder); CI does not run it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

from mutants import MUTANTS, Mutant  # noqa: E402

IGNORE = shutil.ignore_patterns(".git", "__pycache__", ".devcarry", ".pytest_cache", "*.egg-info", ".whl")


def copy_tree(dest: Path) -> Path:
    shutil.copytree(REPO, dest, ignore=IGNORE)
    return dest


def apply(tree: Path, mutant: Mutant) -> None:
    path = tree / mutant.path
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise SystemExit(f"mutant {mutant.name}: the text to replace occurs {count} times in {mutant.path} "
                         f"(the tree changed: update tests/mutation/mutants.py)")
    path.write_text(text.replace(mutant.old, mutant.new))


def pytest(tree: Path, tests, timeout: int) -> tuple[int, float, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    env.pop("STRATA_REQUIRE_GPU", None)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, time.perf_counter() - t0, "timeout"
    tail = [line for line in done.stdout.splitlines() if line.strip()][-1:] or [""]
    return done.returncode, time.perf_counter() - t0, tail[0]


def verdict(rc: int) -> str:
    return {0: "SURVIVED", 1: "killed"}.get(rc, "error")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated mutant names")
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per pytest run")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    mutants = MUTANTS
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m.name for m in MUTANTS}
        if unknown:
            parser.error(f"unknown mutants: {', '.join(sorted(unknown))}")
        mutants = [m for m in MUTANTS if m.name in wanted]
    if args.list:
        for m in mutants:
            print(f"{m.name:22} {m.path:32} {m.what}")
        return 0

    with tempfile.TemporaryDirectory(prefix="strata-mutation-") as tmp:
        base = copy_tree(Path(tmp) / "base")
        subsets = sorted({t for m in mutants for t in m.tests})
        rc, secs, tail = pytest(base, subsets, args.timeout)
        print(f"baseline (unmutated): {verdict(rc) if rc else 'passed'} in {secs:.0f} s: {tail}", file=sys.stderr)
        if rc != 0:
            print("the unmutated tree fails its tests: fix that first", file=sys.stderr)
            return 2
        rows = []
        for m in mutants:
            tree = copy_tree(Path(tmp) / m.name)
            apply(tree, m)
            rc, secs, tail = pytest(tree, m.tests, args.timeout)
            rows.append((m, verdict(rc), secs, tail))
            print(f"{m.name:22} {verdict(rc):9} {secs:5.0f} s  {tail}", file=sys.stderr)
            shutil.rmtree(tree, ignore_errors=True)

    lines = ["| mutant | bug | file | tests run | result | s |", "|---|---|---|---|---|---|"]
    for m, result, secs, _ in rows:
        tests = " ".join(Path(t).name for t in m.tests)
        lines.append(f"| `{m.name}` | {m.what} | `{m.path}` | {tests} | {result} | {secs:.0f} |")
    survived = [m.name for m, result, _, _ in rows if result != "killed"]
    lines.append("")
    lines.append(f"{len(rows) - len(survived)} of {len(rows)} killed"
                 + (f"; not killed: {', '.join(survived)}" if survived else "; no survivors"))
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
