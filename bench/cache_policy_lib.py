"""The Python half of bench/cache_policy.sh (issue 20's benchmark): token files of a bounded length, the slot count
each expert-cache size gives, and the summary table built from what the runs left in the work folder.

  python3 bench/cache_policy_lib.py tokens MODEL TEXT N OUT     the first N ids of TEXT (the model's tokenizer)
  python3 bench/cache_policy_lib.py slots MODEL PROFILE SIZES   the pairs --expert-cache SIZE holds by PROFILE
  python3 bench/cache_policy_lib.py table WORK SIZES POLICIES   the summary (Markdown) of the runs in WORK

The work folder holds, per run NAME (the script's run()): NAME.out (its CSV on stdout), NAME.err (stderr) and
NAME.rc ("RC LIMIT_S" once it ended; "skipped" when the budget had no room for it, "stopped" when the script was
stopped while it ran); no NAME.rc: it never started. Runs: profile (make-profile of the training tokens), held (of the held-out
tokens, with its trace), slots, sim (cache-sim of the held-out trace), info (profile-info --holdout), and
bench-SIZE-POLICY (verify-bench T = 1 and 8 on the held-out tokens)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

TIMED_OUT = (124, 137)  # timeout(1)'s exit status, and SIGKILL's after its -k grace


def status(work: Path, name: str) -> str:
    """'ok', or why run NAME has no results: not run, skipped, cut at its limit, or failed (its last stderr line)."""
    rc_file = work / f"{name}.rc"
    if not rc_file.exists():
        return "not run (an earlier run failed, or the step was stopped)"
    text = rc_file.read_text().split()
    if not text or text[0] == "skipped":
        return "skipped (no time left in the budget)"
    if text[0] == "stopped":
        return "stopped while it ran (the step's limit or a signal)"
    rc, limit = int(text[0]), (text[1] if len(text) > 1 else "?")
    if rc == 0:
        return "ok"
    if rc in TIMED_OUT:
        return f"cut at its {limit} s limit"
    err = work / f"{name}.err"
    lines = [line.strip() for line in err.read_text(errors="replace").splitlines() if line.strip()] \
        if err.exists() else []
    return f"failed (rc {rc}): {lines[-1][:160] if lines else 'no message'}"


def rows(work: Path, name: str) -> list[dict]:
    """The CSV rows run NAME printed (none when it printed no whole table)."""
    path = work / f"{name}.out"
    if not path.exists():
        return []
    try:
        return list(csv.DictReader(path.read_text(errors="replace").splitlines()))
    except csv.Error:
        return []


def _num(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _pct(value) -> str:
    v = _num(value)
    return "-" if v is None else f"{v:.1%}"


def _ms(value) -> str:
    v = _num(value)
    return "-" if v is None else f"{v:.2f}"


def expert_cache_line(work: Path, name: str) -> str:
    """The engine's `expert cache: ...` line of run NAME's stderr (make-profile: all resident or not)."""
    err = work / f"{name}.err"
    for line in err.read_text(errors="replace").splitlines() if err.exists() else ():
        if line.strip().startswith("expert cache:"):
            return line.strip()
    return "(no expert cache line: numpy engine, or the run did not get that far)"


def table(work: Path, sizes: list[str], policies: list[str]) -> list[str]:
    """The summary: one row per (size, policy) with cache-sim's and the engine's hit rates and t_verify at T = 1
    and 8, then cache-sim's static hit rate against profile-info --holdout's per size. A row whose run did not
    finish says why in its status column."""
    slots = {r.get("size"): r.get("slots") for r in rows(work, "slots")}
    sim = {(r.get("policy"), r.get("slots")): r for r in rows(work, "sim")}
    info = {r.get("slots"): r for r in rows(work, "info")}
    out = [f"make-profile (training tokens): {status(work, 'profile')}; {expert_cache_line(work, 'profile')}",
           f"make-profile (held-out tokens, trace): {status(work, 'held')}; {expert_cache_line(work, 'held')}",
           f"cache-sim: {status(work, 'sim')}; profile-info --holdout: {status(work, 'info')}", "",
           "| experts | slots | policy | cache-sim hit | engine hit T=1 | engine hit T=8 | t_verify T=1 ms | "
           "t_verify T=8 ms | swaps/window T=8 | fill MB/window T=8 | fill late T=1 | fill gather ms T=1 | status |",
           "|:---|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|"]
    for size in sizes:
        n = slots.get(size, "-")
        for policy in policies:
            name = f"bench-{size}-{policy}"
            by_t = {r.get("window"): r for r in rows(work, name)}
            one, eight = by_t.get("1", {}), by_t.get("8", {})
            got = status(work, name)
            if got == "ok" and not (one and eight):
                got = "no T = 1 / T = 8 rows in its output"
            out.append(f"| {size} | {n} | {policy} | {_pct(sim.get((policy, n), {}).get('hit_rate'))} | "
                       f"{_pct(one.get('vram_share'))} | {_pct(eight.get('vram_share'))} | "
                       f"{_ms(one.get('ms_median'))} | {_ms(eight.get('ms_median'))} | "
                       f"{_ms(eight.get('swaps'))} | {_ms(eight.get('fill_mb'))} | {_ms(one.get('fill_late'))} | "
                       f"{_ms(one.get('fill_gather_ms'))} | {got} |")
    out += ["", "| experts | slots | cache-sim static hit | profile-info --holdout hit | equal |",
            "|:---|---:|---:|---:|:---|"]
    for size in sizes:
        n = slots.get(size, "-")
        a = _num(sim.get(("static", n), {}).get("hit_rate"))
        b = _num(info.get(n, {}).get("holdout_hit"))
        same = "-" if a is None or b is None else ("yes" if abs(a - b) <= 1e-9 else f"NO ({a - b:+.2e})")
        out.append(f"| {size} | {n} | {_pct(a)} | {_pct(b)} | {same} |")
    return out


def write_tokens(model_path: str, text_file: str, n: int, out: str) -> str:
    """The first n ids of text_file through the model's tokenizer, written to out; the line saying how many."""
    from strata_cli.model.gguf_file import open_model
    from strata_cli.model.tokens import tokens_from_options

    ids, _ = tokens_from_options(open_model(model_path), text_file=text_file)
    Path(out).write_text(" ".join(str(int(i)) for i in ids[:n]) + "\n")
    return f"{out}: {min(n, len(ids))} tokens (of {len(ids)} in {text_file})"


def slot_counts(model_path: str, profile: str, sizes: list[str]) -> list[int]:
    """The (layer, expert) pairs --expert-cache SIZE --expert-profile PROFILE keeps in VRAM (the engine's own
    choice, tiers/residency.choose_residency), so cache-sim and profile-info replay the slots the engine has."""
    from strata_cli.model.gguf_file import open_model
    from strata_cli.tiers.config import TierConfig
    from strata_cli.tiers.residency import choose_residency

    model = open_model(model_path)
    return [int((choose_residency(model, TierConfig(cache=size, profile=profile), None, 0)[0] >= 0).sum())
            for size in sizes]


def main(argv: list[str]) -> int:
    usage = __doc__.split("\n\n")[1]
    if not argv or argv[0] not in ("tokens", "slots", "table"):
        print(f"cache_policy_lib: usage:\n{usage}", file=sys.stderr)
        return 2
    cmd, args = argv[0], argv[1:]
    want = {"tokens": 4, "slots": 3, "table": 3}[cmd]
    if len(args) != want:
        print(f"cache_policy_lib {cmd}: {want} arguments, got {len(args)}", file=sys.stderr)
        return 2
    if cmd == "tokens":
        print(write_tokens(args[0], args[1], int(args[2]), args[3]))
    elif cmd == "slots":  # CSV, as the table reads it back
        sizes = args[2].split(",")
        print("\n".join(["size,slots"] + [f"{s},{n}" for s, n in zip(sizes, slot_counts(args[0], args[1], sizes))]))
    else:
        print("\n".join(table(Path(args[0]), args[1].split(","), args[2].split(","))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
