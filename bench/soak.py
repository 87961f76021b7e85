"""Issue 17's load test: many verify windows on one tiered engine, then the last window against a fresh engine's;
and a tiered `strata verify-bench` stopped by SIGINT / SIGTERM in the middle of a window.

    python3 bench/soak.py [MODEL] --windows N --window T [--expert-cache 24GiB --expert-profile P --pcie-frac F]
        [--depth D] [--ctx C] [--acceptance A] [--sample-every K] [--warmup W] [--seed S] [--device gpu|cpu]
        [--json OUT]
    python3 bench/soak.py [MODEL] --signal INT|TERM --after S [the same engine options] [--device gpu|cpu]

The soak: the engine is built as verify-bench builds it (commands/_common.load_model / load_engine,
commands/_tiers.tier_config), D tokens of context are committed (analysis/window_timing.prefill, refilled when the
next window would pass the context, as time_window does), then N windows of T seeded random ids run through the
engine's own window timer (window + commit, CUDA events on the GPU), each committing the rows an assumed
acceptance A draws (speculation.Acceptance, as verify-bench). Every K windows one sample: host RSS (VmRSS, and its
anonymous and file parts from /proc/self/status), the GPU's used memory (cudaMemGetInfo: the whole device, every
process on it) and CuPy's pool (used / held), the watchdog's releases, the tier host's last window (shares, pool,
copies). Then one more window with its logits, the engine closed, a fresh engine of the same configuration built,
the windows run since the last refill replayed on it (the same tokens in the same windows, the same rows committed)
and the same last window run: its logits must match (max |a - b| / max |b| <= 1e-4) with the same greedy ids.

Flat: after the warm-up (the first W windows: graphs captured, pools grown), the largest sample minus the first one
is at most max(64 MB, 1 % of the first), for host RSS, GPU used and CuPy's pool each. A release: the process's
watchdog fired (tiers/watchdog.py, STRATA_WATCHDOG_S) or the tier host was released (TierHost.released: the
watchdog, a signal, an error; a released engine refuses every later window). ok: all N windows ran, no release,
memory flat, the last window equal (`failed` names the criteria not met). cudaMemGetInfo counts every process on
the device: the soak of record runs alone on it. Last line: one JSON document (--json OUT also writes it, with the
samples).
Exit 0 when ok, 1 when not, 2 without a GPU for --device gpu (one line).

The signals check: `strata verify-bench MODEL` with the same engine options and -r 1000000 as a child in a session
of its own; S seconds after its `engine built in` line (the numpy engine prints none: then S seconds after the
start) it gets the signal; reported in one JSON line: its exit status (128 + the signal expected), the seconds it
took to exit, its stderr's last line, the processes left in its process group (/proc), the child's pid among the
GPU's compute apps (nvidia-smi) and the GPU's utilisation a second after (a spin kernel left running would hold it
at 100 %). ok: exit 128 + signal within 30 s, nothing left.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: the tree's strata_cli, not another install's
    sys.path.insert(0, str(ROOT))

REL_TOL = 1e-4
FLAT_MB, FLAT_FRAC = 64.0, 0.01
EXIT_WITHIN_S = 30.0
READY_LINE = re.compile(r"engine built in")


# ---- samples
def proc_status_mb(pid: int | str = "self") -> dict:
    """VmRSS, RssAnon, RssFile of /proc/PID/status in MB (None where the kernel has no such line)."""
    want = {"VmRSS": "rss_mb", "RssAnon": "rss_anon_mb", "RssFile": "rss_file_mb"}
    out = dict.fromkeys(want.values())
    try:
        text = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in want:
            out[want[key]] = int(rest.split()[0]) / 1024  # kB
    return out


def gpu_memory_mb() -> dict:
    """cudaMemGetInfo's used (the device's, all processes) and CuPy's default pool used / held, MB."""
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    pool = cupy.get_default_memory_pool()
    return {"gpu_used_mb": (total - free) / 2**20, "pool_used_mb": pool.used_bytes() / 2**20,
            "pool_total_mb": pool.total_bytes() / 2**20}


def watchdog_releases() -> int:
    """Verifiers the process's own watchdog released (tiers/watchdog.py: it fires once, one line per verifier)."""
    from strata_cli.tiers import watchdog

    dog = watchdog._env_watchdog
    return len(dog.lines) if dog is not None and dog.fired.is_set() else 0


def tier_sample(engine) -> dict:
    """The tier host's last window (tiers/host.window_stats) and its release text; {} without tiers."""
    host = getattr(engine, "tier_host", None)
    if host is None:
        return {}
    last = host.history[-1] if host.history else {}
    keys = ("vram_share", "pcie_share", "cpu_share", "pool_ms", "copy_ms", "issue_ms", "wait_b_ms", "wait_flag_ms")
    return {"released": host.released, "history_len": len(host.history),
            **{k: last.get(k) for k in keys}}


def sample(engine, window: int, ms: float | None) -> dict:
    s = {"window": window, "ms": ms, "t": time.time(), **proc_status_mb(), "watchdog_releases": watchdog_releases(),
         **tier_sample(engine)}
    if engine.device == "gpu":
        s.update(gpu_memory_mb())
    return s


def say(s: dict, ms: list[float]) -> None:
    """One progress line per sample on stderr (a run cut by its time limit still shows how far it got)."""
    gpu = f", GPU used {s['gpu_used_mb']:.0f} MB, pool {s['pool_used_mb']:.0f} MB" if "gpu_used_mb" in s else ""
    share = f", PCIe share {s['pcie_share']:.1%}" if s.get("pcie_share") is not None else ""
    print(f"soak: window {s['window']}: {statistics.median(ms[-100:]):.2f} ms (median of the last 100), RSS "
          f"{s['rss_mb']:.0f} MB{gpu}{share}, watchdog releases {s['watchdog_releases']}", file=sys.stderr,
          flush=True)


def flat(values: list[float]) -> tuple[bool, float]:
    """(flat, tolerance MB): max - first <= max(FLAT_MB, FLAT_FRAC * first)."""
    tol = max(FLAT_MB, FLAT_FRAC * values[0])
    return max(values) - values[0] <= tol, tol


def spread(values: list[float]) -> dict:
    return {"first": values[0], "last": values[-1], "max": max(values)}


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30))


# ---- the soak
class Recorder:
    """The engine, with every window it runs since its last reset logged as (tokens, n_keep): prefill() runs through
    this, the timed windows log themselves (log()), so the fresh engine can replay exactly what was committed."""

    def __init__(self, engine):
        self.engine, self.segment = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def reset(self):
        self.segment.clear()
        self.engine.reset()

    def run(self, tokens, pos0=None):
        self.segment.append([np.asarray(tokens).copy(), 0])
        return self.engine.run(tokens, pos0)

    def commit(self, n_keep: int):
        self.segment[-1][1] = int(n_keep)
        self.engine.commit(n_keep)

    def log(self, tokens, n_keep: int):
        self.segment.append([np.asarray(tokens).copy(), int(n_keep)])


def build(args, pcie_frac=None):
    """The model and its engine, as verify-bench builds them (one place: strata_cli's own builders); pcie_frac: the
    share the first engine resolved (--pcie-frac auto measures its rates at each build: the fresh engine takes the
    same share, so both split every step alike)."""
    from strata_cli.commands._common import load_engine, load_model
    from strata_cli.commands._tiers import tier_config

    model = load_model(args.model)
    tiers = tier_config(expert_profile=args.expert_profile, expert_cache=args.expert_cache,
                        pcie_frac=args.pcie_frac if pcie_frac is None else str(pcie_frac),
                        tier_wait="spin")
    return model, tiers, load_engine(model, args.device, args.ctx, tiers=tiers)


def replay(engine, segment, tokens) -> object:
    """The logged windows since the last reset (their tokens, their committed rows), then `tokens` with logits."""
    engine.reset()
    timer = engine.window_timer()
    for window_tokens, n_keep in segment:
        timer(engine, window_tokens, engine.n_past, n_keep)
    return engine.run(tokens, engine.n_past)


def soak(args) -> dict:
    from strata_cli.analysis.speculation import Acceptance
    from strata_cli.analysis.window_timing import TokenStream, prefill

    model, _, engine = build(args)
    T, N = args.window, args.windows
    if engine.max_t is not None and T > engine.max_t:
        raise SystemExit(f"soak: --window {T} exceeds the engine's max_t {engine.max_t}")
    if args.depth + T > engine.n_ctx:
        raise SystemExit(f"soak: --depth {args.depth} + --window {T} past the context {engine.n_ctx}")
    rng = np.random.default_rng(args.seed)
    stream = TokenStream(rng, model.geometry.n_vocab)
    accept = Acceptance.assumed(args.acceptance)
    chunk = engine.max_t or 64
    rec = Recorder(engine)
    timer = engine.window_timer()
    prefill(rec, args.depth, stream, chunk)
    warmup = min(args.warmup, N)
    ms, samples, refills, error = [], [], 0, None
    t0 = time.perf_counter()
    try:
        for i in range(N):
            if engine.n_past + T > engine.n_ctx:
                prefill(rec, args.depth, stream, chunk)
                refills += 1
            tokens = stream.take(T)
            n_keep = accept.draw_keep(rng, T)
            rec.log(tokens, n_keep)
            ms.append(float(timer(engine, tokens, engine.n_past, n_keep)[0]))
            done = i + 1
            if done == warmup or (done > warmup and (done - warmup) % args.sample_every == 0) or done == N:
                if not samples or samples[-1]["window"] != done:
                    samples.append(sample(engine, done, ms[-1]))
                    say(samples[-1], ms)
        if engine.n_past + T > engine.n_ctx:
            prefill(rec, args.depth, stream, chunk)
            refills += 1
        last_tokens = stream.take(T)
        last = engine.run(last_tokens, engine.n_past)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - a released engine, a failed window, a step's time
        # limit (SIGINT, or SIGTERM as strata's Terminated): reported with the samples so far, not a traceback
        error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        samples.append(sample(engine, len(ms), ms[-1] if ms else None))
    loop_s = time.perf_counter() - t0
    final = tier_sample(engine)
    share = engine.tiers.cfg.pcie_frac if getattr(engine, "tiers", None) is not None else None  # auto: resolved
    engine.close()
    doc = {"model": str(model.path), "device": engine.device, "windows": len(ms), "windows_asked": N, "window": T,
           "depth": args.depth, "n_ctx": engine.n_ctx, "acceptance": args.acceptance, "seed": args.seed,
           "expert_cache": args.expert_cache, "pcie_frac": share,
           "tier_note": engine.tier_note, "refills": refills, "loop_s": loop_s, "error": error,
           "released": final.get("released"), "watchdog_releases": watchdog_releases(),
           "ms_median_first100": statistics.median(ms[:100]) if ms else None,
           "ms_median_last100": statistics.median(ms[-100:]) if ms else None,
           "flat_rule": f"max - first <= max({FLAT_MB:g} MB, {FLAT_FRAC:.0%} of first), after {warmup} windows"}
    host = [s for s in samples if s["window"] >= warmup] or samples
    for key in ("rss_mb", "rss_anon_mb", "rss_file_mb", "gpu_used_mb", "pool_used_mb", "pool_total_mb"):
        values = [s[key] for s in host if s.get(key) is not None]
        doc[key] = spread(values) if values else None
        if values and key in ("rss_mb", "gpu_used_mb", "pool_used_mb"):
            ok, tol = flat(values)
            doc[f"{key.removesuffix('_mb')}_flat"], doc[f"{key.removesuffix('_mb')}_tol_mb"] = ok, tol
    for key in ("pcie_share", "cpu_share", "vram_share"):
        values = [s[key] for s in samples if s.get(key) is not None]
        doc[f"{key}_mean"] = float(np.mean(values)) if values else None
    doc["last_window_rel_err"] = doc["same_ids"] = None
    if error is None:  # the engine closed first: the fresh one is built as the next command's would be
        t1 = time.perf_counter()
        try:
            _, _, fresh = build(args, share)
            try:
                again = replay(fresh, rec.segment, last_tokens)
            finally:
                fresh.close()
            doc.update(last_window_rel_err=rel_err(last.logits, again.logits),
                       same_ids=bool(np.array_equal(last.ids, again.ids)))
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - reported in the document
            error = doc["error"] = f"the fresh engine: {type(exc).__name__}: {exc}".rstrip(": ")
        doc.update(replayed_windows=len(rec.segment), replayed_tokens=int(sum(k for _, k in rec.segment)),
                   fresh_s=time.perf_counter() - t1)
    err = doc["last_window_rel_err"]
    criteria = {"error": error is None, "windows": doc["windows"] == N, "released": not doc["released"],
                "watchdog_releases": not doc["watchdog_releases"], "last_window_rel_err": err is not None and
                err <= REL_TOL, "same_ids": bool(doc["same_ids"]),
                **{f"{key}_flat": doc[f"{key}_flat"] for key in ("rss", "gpu_used", "pool_used") if f"{key}_flat" in doc}}
    doc["failed"] = [name for name, met in criteria.items() if not met]
    doc["ok"] = not doc["failed"]
    doc["samples"] = samples
    return doc


# ---- the signals check
def group_members(pgid: int) -> list[int]:
    """Pids whose process group is pgid (/proc/PID/stat field 5), zombies included."""
    out = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def gpu_apps() -> tuple[list[int] | None, float | None]:
    """The GPU's compute-app pids and its utilisation % (nvidia-smi), None where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None, None
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout
        util = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20).stdout
        pids = [int(p) for p in apps.split() if p.strip().isdigit()]
        return pids, max((float(u) for u in util.split()), default=None)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None, None


def _default_signals() -> None:
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


def child_command(args) -> list[str]:
    cmd = [sys.executable, "-m", "strata_cli", "verify-bench"] + ([args.model] if args.model else [])
    cmd += ["--device", args.device, "--window", str(args.window), "-r", "1000000", "--warmup", "0",
            "--format", "json"]
    for opt, value in (("--expert-cache", args.expert_cache), ("--expert-profile", args.expert_profile),
                       ("--pcie-frac", args.pcie_frac), ("--ctx", args.ctx)):
        if value is not None:
            cmd += [opt, str(value)]
    return cmd


def signals_check(args) -> dict:
    """The check, with the child's session killed whatever happens to this process meanwhile (it is ours)."""
    children: list = []
    try:
        return _signals_check(args, children)
    finally:
        for child in children:
            if child.poll() is None:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.wait()


def _signals_check(args, children: list) -> dict:
    sig = getattr(signal, f"SIG{args.signal}")
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ['PYTHONPATH']}"
               if os.environ.get("PYTHONPATH") else str(ROOT))
    cmd = child_command(args)
    start = time.monotonic()
    # the child's signals at their defaults: started from a background job (`cmd &` in a script: the device's
    # soak-bg), this process inherits SIGINT ignored and so would the child, which then never sees the signal
    # under test
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True, preexec_fn=_default_signals)
    children.append(child)
    lines: list[str] = []
    ready, ready_at = threading.Event(), [start]
    if args.device == "cpu":  # the numpy engine has no tiers and prints no load line: S seconds after the start
        ready.set()

    def read():
        for line in child.stderr:
            lines.append(line.rstrip("\n"))
            if READY_LINE.search(line) and not ready.is_set():
                ready_at[0] = time.monotonic()
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    doc = {"signal": f"SIG{args.signal}", "after_s": args.after, "pid": child.pid, "command": " ".join(cmd)}
    while not ready.wait(0.1):
        if child.poll() is not None or time.monotonic() - start > args.ready_within:
            break
    doc["built_s"] = ready_at[0] - start if ready.is_set() else None
    if not ready.is_set():
        exited = child.poll() is not None
        if not exited:
            os.killpg(child.pid, signal.SIGKILL)  # ours: the child's own session
        child.wait()
        reader.join(5)
        doc.update(rc=child.returncode, ok=False, error=f"the child {'exited' if exited else 'was killed'} before "
                   f"its engine was built: {lines[-1] if lines else '(no stderr)'}")
        return doc
    time.sleep(max(ready_at[0] + args.after - time.monotonic(), 0))
    running = child.poll() is None
    t_sig = time.monotonic()
    if running:
        os.kill(child.pid, sig)
    try:
        rc = child.wait(timeout=args.exit_within)
    except subprocess.TimeoutExpired:
        rc = None
    exit_s = time.monotonic() - t_sig
    reader.join(5)
    left = [p for p in group_members(child.pid) if p != child.pid or rc is None]
    time.sleep(1.0)  # a kernel left spinning would still hold the GPU a second later
    pids, util = gpu_apps()
    doc.update(running_at_signal=running, rc=rc, rc_expected=128 + sig, exit_s=exit_s,
               last_stderr=next((ln for ln in reversed(lines) if ln.strip()), ""),
               traceback=any(ln.startswith("Traceback") for ln in lines),
               group_left=left, gpu_pids=pids, gpu_pid_left=None if pids is None else child.pid in pids,
               gpu_util_after=util)
    if rc is None or left:  # ours to clean up: the child's own session
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
    doc["ok"] = bool(running and rc == 128 + sig and exit_s <= EXIT_WITHIN_S and not left
                     and not doc["traceback"] and not doc["gpu_pid_left"])
    return doc


# ---- the command line
def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None, help="GGUF (default: strata's embedded tiny model)")
    ap.add_argument("--windows", type=int, default=1000, help="windows of the soak")
    ap.add_argument("--window", type=int, default=4, help="tokens per window T")
    ap.add_argument("--depth", type=int, default=32, help="tokens of context committed before the windows (-d)")
    ap.add_argument("--ctx", type=int, default=None, help="context cells (default: the engine's)")
    ap.add_argument("--acceptance", type=float, default=0.7, help="assumed per-draft acceptance (n_keep draws)")
    ap.add_argument("--sample-every", type=int, default=100, help="windows between two samples")
    ap.add_argument("--warmup", type=int, default=100, help="windows before the first (baseline) sample")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--expert-cache", default=None)
    ap.add_argument("--expert-profile", default=None)
    ap.add_argument("--pcie-frac", default=None)
    ap.add_argument("--json", default=None, help="also write the document (with its samples) here")
    ap.add_argument("--signal", choices=["INT", "TERM"], default=None,
                    help="the signals check: verify-bench as a child, stopped by this signal")
    ap.add_argument("--after", type=float, default=5.0, help="seconds after the child's engine is built")
    ap.add_argument("--ready-within", type=float, default=600.0, help="seconds the child may take to build")
    ap.add_argument("--exit-within", type=float, default=60.0, help="seconds the child may take to exit")
    args = ap.parse_args(argv)
    for name in ("windows", "window", "sample_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.depth < 0 or args.warmup < 0 or args.after < 0 or not 0 <= args.acceptance <= 1:
        ap.error("--depth, --warmup and --after must be >= 0, --acceptance in [0, 1]")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.device == "gpu":
        from strata_cli.engine import gpu_probe

        _, why = gpu_probe()
        if why is not None:
            print(f"soak: no GPU here ({why}); --device cpu runs the numpy engine", file=sys.stderr)
            return 2
    from strata_cli.errors import StrataError
    from strata_cli.sysio.signals import signal_handlers

    try:
        with signal_handlers():  # SIGTERM / SIGHUP as Ctrl-C (a KeyboardInterrupt), as in the strata CLI
            doc = signals_check(args) if args.signal else soak(args)
    except StrataError as exc:  # a bad model, profile or option: one line, as strata says it
        print(f"soak: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # the signals check cut (its child killed): one line, 128 + the signal
        from strata_cli.sysio.signals import exit_code_for_interrupt

        code = exit_code_for_interrupt(exc)
        print(f"soak: stopped by signal {code - 128}", file=sys.stderr)
        return code
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    doc.pop("samples", None)
    print(json.dumps(doc), flush=True)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
