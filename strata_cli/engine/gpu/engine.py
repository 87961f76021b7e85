"""The GPU verify engine: one CUDA graph per window size T (captured on first use), one commit graph.

The contract of engine/contract.py, as ReferenceEngine, plus eager launches. run() stages tokens and positions in mapped
memory, launches the T graph and reads the greedy ids back from mapped memory; logits stay on the device
until asked for. Sampling runs after the replay (a graph never bakes in its parameters).

The commit is asynchronous (the seed's set_commit_async): commit(n_keep) launches the commit graph, records the
`commit_done` event and returns; the next window is launched on the same stream after it, so the GPU orders the two
and the host stages the next window (and drafts) while the commit runs. What the in-flight commit reads from the
host: the mapped n_keep only (tokens and positions it reads from the arena, where the next window's graph copies
them after the commit). So the host writes n_keep again only after commit_done (launch_commit waits), and whatever
reads committed state from the host (read_state, reset, close, the timers, a tiered window's host) calls
wait_commit() first.

Each T also has a profiling variant, captured separately on first use (graph(T, profile=True)): the same
launches plus one `%globaltimer` stamp per stage boundary (strata_cli/engine/stage_timing.py). With
STRATA_VERIFY_PROFILE set every window runs that variant and its stamps are kept for the one-line summary.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from ... import settings
from ...errors import InputError
from ...gpu import launch_sampling
from ...gpu.graphs import CapturedGraph, captured_nodes, new_stream
from ...gpu.launch_util import GEMV_MAXT, WindowPath, window_path
from ...gpu.launch_stamp import stamp_kernel
from ...gpu.runtime import capture_guard, cupy
from ...report.progress import timed_phase
from ...tiers.config import TierConfig
from ..contract import Capabilities, WindowResult, WindowTimer
from ..stage_timing import Accumulator, register
from ..state import check_n_keep, check_window, resolve_ctx
from .buffers import Staging, plan_buffers
from .stamps import Stamper, record_profiled
from .weights import DeviceWeights
from .window import record_commit, record_window

DEFAULT_MAX_T = GEMV_MAXT


def _stage_skip(layers: tuple[int, int], g, tiered: bool):
    """skip(name) for DeviceWeights: the routed experts when tiered (the tiers upload the resident ones), and for a
    stage of the layer split the tensors of other layers, the embedding unless it starts at layer 0, the head
    (output*) unless it ends at the last layer, the PLE table unless it holds the PLE layer. None: skip nothing."""
    from ...model.names import PLE_TABLE
    from ...tiers.residency import is_expert_tensor

    lo, hi = layers
    if not tiered and layers == (0, g.n_layers):
        return None

    def skip(name: str) -> bool:
        if tiered and is_expert_tensor(name):
            return True
        if name.startswith("blk."):
            return not lo <= int(name.split(".")[1]) < hi
        if name == PLE_TABLE:
            return not lo <= g.ple.layer < hi
        if name.startswith("output"):
            return hi < g.n_layers
        return lo > 0  # token_embd

    return skip


def _uploaded_bytes(model, skip) -> int:
    """The file bytes of the tensors DeviceWeights uploads (every tensor but those skip() leaves in the file)."""
    from ...model.names import PLE_TABLE

    names = list(model.specs) + ([PLE_TABLE] if model.geometry.ple is not None else [])
    return sum(model.info(n).n_bytes for n in names if skip is None or not skip(n))


class GPUEngine:
    device = "gpu"
    capabilities = Capabilities(graphs=True, eager=True)

    def __init__(self, model, n_ctx: int | None = None, max_t: int | None = None, pack_q8: bool = True,
                 tiers: TierConfig | None = None, window_paths: Callable[[int], WindowPath] = window_path,
                 layers: tuple[int, int] | None = None):
        """layers [lo, hi): a stage of the layer split (engine/gpu/layer_split.py) on the current device: its
        layers' weights and state only, the embedding iff lo == 0, the head iff hi == n_layers; its window starts
        from the residual stack in buf["R"] that the previous stage copied there. With tiers, its own expert cache,
        residency and tier host over its layers (tiers.py)."""
        try:
            self._build(model, n_ctx, max_t, pack_q8, tiers, window_paths, layers)
        except BaseException:
            # a half-built engine (the arena refused, a warm-up that failed) would keep the tier host's thread, its
            # watchdog entry and the pinned buffers until a garbage collection: released here
            try:
                self.close()
            except Exception:  # noqa: BLE001 - the construction's own error is the one to report
                pass
            raise

    def _build(self, model, n_ctx, max_t, pack_q8: bool, tiers: TierConfig | None,
               window_paths: Callable[[int], WindowPath], layers: tuple[int, int] | None) -> None:
        self.model, self.g = model, model.geometry
        g = self.g
        self.layers = (0, g.n_layers) if layers is None else (int(layers[0]), int(layers[1]))
        lo, hi = self.layers
        self.gdn_layers = [layer for layer in g.gdn_layers if lo <= layer < hi]
        self.attn_layers = [layer for layer in g.attn_layers if lo <= layer < hi]
        self.has_ple = g.ple is not None and lo <= g.ple.layer < hi
        self.n_ctx = resolve_ctx(g, n_ctx)
        self.max_t = DEFAULT_MAX_T if max_t is None else int(max_t)
        if not 1 <= self.max_t <= GEMV_MAXT:
            raise InputError(f"max_t {self.max_t} outside 1..{GEMV_MAXT} (the GPU kernels take up to {GEMV_MAXT} rows)")
        self.window_paths = window_paths  # the launch variant of each T (tests pick one for every T)
        # ---- expert tiers (tiers.py): the residency is chosen before anything is uploaded; None = all in VRAM. A stage
        # of the layer split chooses its own over its layers, with the whole --expert-cache budget (per GPU)
        from ...tiers.setup import residency_for

        self.tiers = None
        # a tiered load says where its time goes, one line per phase (#17: a PCIe-share build that printed nothing
        # for minutes); an untiered one shows the spinners only
        quiet = tiers is None
        self.load_phase = lambda text: timed_phase(text, quiet=quiet)
        self.arena = plan_buffers(g, self.n_ctx, self.max_t, self.layers)
        with self.load_phase("expert residency chosen") as phase:
            table, self.tier_note, tiers = residency_for(model, tiers, self.arena.planned_bytes(), self.max_t,
                                                          self.layers)
            if tiers is not None and tiers.rates is not None:  # --pcie-frac auto timed the pool first
                phase["what"] = f"expert residency chosen (CPU pool probe {tiers.rates.pool_gbs:.1f} GB/s)"
        skip = _stage_skip(self.layers, g, table is not None)
        with self.load_phase("dense weights uploaded") as phase:
            self.w = DeviceWeights(model, pack_q8=pack_q8, skip=skip)  # pack_q8=False keeps raw Q8_0 (comparisons)
            phase["what"] = f"dense weights uploaded ({_uploaded_bytes(model, skip) / 2**30:.2f} GiB)"
        self.stream = new_stream()
        if table is not None:
            from .tiers import attach_tiers

            attach_tiers(self, table, tiers or TierConfig(), pack_q8)
        with self.load_phase("device buffers allocated") as phase:
            self.buf = self.arena.allocate()
            phase["what"] = f"device buffers allocated ({self.arena.planned_bytes() / 2**30:.2f} GiB)"
        if self.tiers is not None:
            from .tiers import rebalance_share

            self.tiers.bind(self.buf)
            rebalance_share(self)  # --pcie-frac auto: the copy path measured, the share set by the two rates
        self.stage = Staging(self.max_t)
        if g.attn_layers:
            from ...ops.qsa import rope_tables
            from ...sysio.memory import available_memory
            from ..state import check_memory

            # the host builds the tables in float64 before they go to the device
            check_memory("the RoPE tables", 4 * self.n_ctx * g.n_rot * 8, self.n_ctx, available_memory())
            cos, sin = rope_tables(np.arange(self.n_ctx), g.n_rot, g.rope_base)
            self.buf["cos"].set(cos)
            self.buf["sin"].set(sin)
        if self.has_ple:
            for name, values in zip(("ple_mult", "ple_sizes", "ple_offsets"), g.ple.hash_arrays()):
                self.buf[name].set(values)
        cupy().cuda.Device().synchronize()  # the arena's zeroing and the tables above ran on the current stream
        self.graphs: dict[int, CapturedGraph] = {}
        self.capture_ms: dict[int, float] = {}
        self._commit_graph: CapturedGraph | None = None
        self.commit_done = cupy().cuda.Event(disable_timing=True)  # recorded after each commit launch
        self._commit_pending = False
        self.stamper: Stamper | None = None      # set only while a profiling window is recorded
        self.route_tap = None  # engine/routing.RouteTap of a counting run (all experts resident), before any capture
        self.profile_graphs: dict[int, CapturedGraph] = {}
        self.profile_plans: dict = {}            # T -> stage_timing.Plan of its profiling window
        self.profile_reads: dict = {}            # T -> what each of its stamped stages reads (stage_bytes.StageReads)
        self.verify_profile: Accumulator | None = None
        if settings.VERIFY_PROFILE.value():
            self.verify_profile = register(Accumulator())
        with self.load_phase("warm-up window (one eager window: every kernel loaded)"):
            self._warm_up()

    # ---- lifetime
    def close(self) -> None:
        """Release what this engine holds now, not at a garbage collection: the tier host's copy thread and
        events, the staging ring and every mapped buffer (pinned host memory), the captured graphs, the device arena
        and weights (back to CuPy's pool, whose unused blocks are returned). Idempotent; the engine runs no window
        afterwards. Commands and tests close an engine before they build the next one."""
        if getattr(self, "closed", False):
            return
        self.closed = True
        # getattr: also called on an engine whose construction failed part way (__init__)
        if getattr(self, "stream", None) is not None:
            self.stream.synchronize()  # the commit in flight too (it is on this stream)
        self._commit_pending = False
        if getattr(self, "tier_host", None) is not None:
            self.tier_host.close()
        if getattr(self, "tiers", None) is not None:
            self.tiers.close()
        graphs = [*getattr(self, "graphs", {}).values(), *getattr(self, "profile_graphs", {}).values(),
                  getattr(self, "_commit_graph", None)]
        for graph in graphs:
            if graph is not None:
                graph.destroy()
        self.graphs, self.profile_graphs, self._commit_graph = {}, {}, None
        if getattr(self, "stage", None) is not None:
            for buf in vars(self.stage).values():
                buf.free()
        self.buf = self.w = self.arena = None
        cupy().get_default_memory_pool().free_all_blocks()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- state
    def reset(self) -> None:
        """Zero every recurrent/conv/indexer/PLE state (KV cells need no reset: a query sees only its past)."""
        g, b = self.g, self.buf
        self.wait_commit()  # a commit in flight writes the states zeroed below
        # the fills go on the engine's own stream: it is non-blocking, so fills queued on the legacy default
        # stream would not be ordered before the next window, and self.stream.synchronize() would not wait for them
        with self.stream:
            for layer in self.gdn_layers:
                b[f"S.{layer}"].fill(0)
                b[f"conv.{layer}"].fill(0)
            for layer in self.attn_layers:
                if g.compress_ratios[layer]:
                    b[f"tail.{layer}"].fill(0)
                    b[f"pooled.{layer}"].fill(0)
            if self.has_ple:
                b["ple_history"].fill(0)
                b["ple_prev"].fill(g.ple.eos_token_id)
        self.stream.synchronize()
        self.n_past = 0
        self._pending: int | None = None
        self._pos0 = 0

    def _warm_up(self) -> None:
        """Load every kernel with one eager window and commit (nothing may load or allocate under capture)."""
        self.reset()
        self.stage.tokens.host[:1] = 0
        self.stage.positions.host[:1] = 0
        self.stage.n_keep.host[0] = 0
        self.launch_window(1, eager=True)
        with self.stream:
            record_commit(self, self.stream)
            launch_sampling.sample_rows(self.buf["logits"][:1], self.buf["positions"][:1], 1.0, 0,
                                        out=self.buf["ids"][:1])
        self.stream.synchronize()
        if self.tiers is not None:
            self.tier_host.after_warm_up()
        self.reset()

    # ---- graphs
    def graph(self, T: int, profile: bool = False) -> CapturedGraph:
        """The window graph of T rows; profile=True: its variant with stage stamps (captured apart)."""
        graphs = self.profile_graphs if profile else self.graphs
        if T not in graphs:
            if profile:
                stamp_kernel()  # loaded before the capture
            t0 = time.perf_counter()
            graphs[T] = CapturedGraph(lambda s: self._record(T, s, profile), self.stream)
            if not profile:
                self.capture_ms[T] = (time.perf_counter() - t0) * 1e3
        return graphs[T]

    def _record(self, T: int, stream, profile: bool) -> None:
        if not profile:
            record_window(self, T, stream)
            return
        self.profile_plans[T], self.profile_reads[T] = record_profiled(self, T, stream, record_window)

    def layer_nodes(self, T: int) -> list[int]:
        """The nodes each layer adds to the T-row window graph: a capture whose stage hook (in place of the
        profiling stamps, adding no node) counts the nodes so far at each layer's end ("embed", then each "gap")."""
        ends: list[int] = []

        def count(layer: int, stage: str, stream) -> None:
            if stage in ("embed", "gap"):
                ends.append(captured_nodes(stream))

        self.stamper = count
        try:
            CapturedGraph(lambda s: record_window(self, T, s), self.stream).destroy()
        finally:
            self.stamper = None
        return [b - a for a, b in zip(ends, ends[1:])]

    def read_stamps(self) -> np.ndarray:
        """The stamp slots as the last profiling window left them (uint64 ns; call after it finished)."""
        return cupy().asnumpy(self.buf["stamps"])

    def _collect(self, T: int, event_ms: float | None = None) -> None:
        if self.verify_profile is not None:
            self.verify_profile.add(T, self.profile_plans[T], self.read_stamps(), event_ms)

    def commit_graph(self) -> CapturedGraph:
        if self._commit_graph is None:
            self._commit_graph = CapturedGraph(lambda s: record_commit(self, s), self.stream)
        return self._commit_graph

    # ---- the asynchronous commit
    def wait_commit(self) -> None:
        """Block until the last commit launched has run (no-op when none is in flight): the committed state on the
        device is then the contract's, and the mapped n_keep may be written again."""
        if self._commit_pending:
            self.commit_done.synchronize()
            self._commit_pending = False

    def _synchronize(self) -> None:
        """Wait for the stream: every window and commit launched on it has run."""
        self.stream.synchronize()
        self._commit_pending = False

    def read_state(self, name: str) -> np.ndarray:
        """A host copy of the device buffer `name` (S.3, kc.1, ple_prev, ...), read after the commit in flight (the
        copy runs on the current stream, which is not ordered after this engine's non-blocking one)."""
        self.wait_commit()
        return cupy().asnumpy(self.buf[name])

    # ---- the verify contract
    def stage_window(self, tokens: np.ndarray) -> int:
        """Tokens and positions into mapped memory. Safe while a commit is in flight: it reads neither (only their
        arena copies, which the next window's graph rewrites after it on the stream)."""
        T = len(tokens)
        self.stage.tokens.host[:T] = tokens
        self.stage.positions.host[:T] = self.n_past + np.arange(T, dtype=np.int32)
        return T

    def launch_window(self, T: int, eager: bool = False, profile: bool | None = None) -> None:
        """Launch the window of T staged rows; profile None: the stamped variant iff STRATA_VERIFY_PROFILE."""
        profile = self.verify_profile is not None if profile is None else profile
        if self.tiers is not None:  # expert tiers: the host serves the window's doorbells until it finished
            return self._launch_tiered(T, eager, profile)
        if eager:
            with self.stream:
                self._record(T, self.stream, profile)
        else:
            self.graph(T, profile).launch(self.stream)

    def _launch_tiered(self, T: int, eager: bool, profile: bool = False) -> None:
        """Launch the window (graph, or eager launches from a helper thread) and serve its steps (tiers/host.py);
        returns when the window's stream is idle. Cyclic GC paused and device frees deferred meanwhile (as under
        capture): a finalizer's cudaFreeHost synchronises the device, which waits for the host's flags, so a free
        on the serving or launching thread would hold a spin-wait to its bound."""
        # the host's view: begin() marks the window served and starts the watchdog's clock, and "the stream is
        # idle" must mean "this window ended", so the commit in front of it has run first
        self.wait_commit()
        with capture_guard():
            self._serve_tiered(T, eager, profile)

    def _serve_tiered(self, T: int, eager: bool, profile: bool) -> None:
        host = self.tier_host
        if not eager:
            graph = self.graph(T, profile)  # captured (kernels compiled) before the window counts as served
            host.launched(T, lambda: graph.launch(self.stream))
            return
        failed: list[BaseException] = []
        tiers = self.tiers

        def launch():
            # each flagB wait is launched only after the host issued its step's copies (tiers/host.py says why)
            tiers.launch_gate = host.wait_issued
            try:
                with self.stream:
                    self._record(T, self.stream, profile)
            except BaseException as exc:  # noqa: BLE001 - re-raised by the serving thread below
                failed.append(exc)
            finally:
                tiers.launch_gate = None
                host.launch_done()

        thread = threading.Thread(target=launch, name="strata-eager-launch", daemon=True)

        def start():
            host.launching = True
            thread.start()

        try:
            host.launched(T, start)
        except BaseException:
            if thread.ident is not None:  # begin() may refuse (released) before the launcher starts
                thread.join()
            if failed:
                raise failed[0] from None
            raise
        thread.join()

    def launch_commit(self, n_keep: int, eager: bool = False) -> None:
        """Stage n_keep and launch the commit, then record commit_done (not synchronised); the caller advances
        n_past. The last commit's graph reads the mapped n_keep until it ran: waited for before the write."""
        self.wait_commit()
        self.stage.n_keep.host[0] = n_keep
        if eager:
            with self.stream:
                record_commit(self, self.stream)
        else:
            self.commit_graph().launch(self.stream)
        self.commit_done.record(self.stream)
        self._commit_pending = True

    def run(self, tokens, pos0: int | None = None, *, eager: bool = False, logits: bool = True) -> WindowResult:
        tokens = check_window(tokens, pos0, self.n_past, self.g.n_vocab, self.n_ctx, self.max_t)
        self._pending = None  # an uncommitted window is dropped: it wrote no committed state (state.py)
        T = self.stage_window(tokens)  # while the last commit may still run (stage_window says why that is safe)
        self.launch_window(T, eager)   # after that commit on the stream
        self._synchronize()
        self._collect(T)
        self._pending, self._pos0 = T, self.n_past
        ids = self.stage.out_ids.host[:T].copy()
        host_logits = cupy().asnumpy(self.buf["logits"][:T]) if logits else None
        return WindowResult(self._pos0, tokens, host_logits, ids, nonfinite=self._nonfinite_rows(T))

    def _nonfinite_rows(self, T: int) -> str | None:
        """The head's argmax flags (mapped memory, written by the window): where the window went non-finite.
        The GPU engine checks only the logits; the CPU engine names the first layer and stage."""
        bad = np.flatnonzero(self.stage.out_nonfinite.host[:T])
        if not bad.size:
            return None
        return (f"the logits (window rows {', '.join(map(str, bad[:8]))}{', ...' if bad.size > 8 else ''}; the GPU "
                "engine checks the logits only: --device cpu names the first layer and stage)")

    def commit(self, n_keep: int, *, eager: bool = False) -> None:
        if self._pending is None:
            raise InputError("commit without a window to commit (run a window first)")
        check_n_keep(n_keep, self._pending)
        self.launch_commit(n_keep, eager)  # asynchronous: no wait here (the module docstring)
        self.n_past += n_keep
        self._pending = None

    def sample(self, result: WindowResult, temperature: float, seed: int) -> np.ndarray:
        """Ids sampled from the device logits of the last window (ops/sampling.py draws the same numbers)."""
        T = len(result.tokens)
        if temperature <= 0:
            return result.ids.copy()
        out = launch_sampling.sample_rows(self.buf["logits"][:T], self.buf["positions"][:T], temperature, seed,
                                          out=self.buf["ids"][:T], stream=self.stream)
        self._synchronize()
        return cupy().asnumpy(out)

    # ---- benchmark hooks
    def window_timer(self, eager: bool = False) -> WindowTimer:
        """timer(engine, tokens, pos, n_keep) -> (GPU ms of window + commit from CUDA events, host ms)."""

        def timed(T, n_keep):
            self.launch_window(T, eager)
            self.launch_commit(n_keep, eager)

        if not eager:
            self.graph(1, self.verify_profile is not None)
        return self._event_timer(timed, lambda n_keep: None, self._collect)

    def window_only_timer(self, profile: bool, sink: list | None = None) -> WindowTimer:
        """timer(engine, tokens, pos, n_keep) -> (CUDA-event ms of the window graph alone, host ms); the commit
        runs after the end event. With a sink, appends (T, stamps, ms) of every window (profile=True)."""

        def record(T, ms):
            if profile:
                if sink is not None:
                    sink.append((T, self.read_stamps(), ms))
                self._collect(T, ms)

        self.graph(1, profile)
        return self._event_timer(lambda T, n_keep: self.launch_window(T, profile=profile), self.launch_commit, record)

    def _event_timer(self, timed, after, record) -> WindowTimer:
        """A WindowTimer of this engine: stages the window, times timed(T, n_keep) between two CUDA events (host ms:
        staging and those launches), launches after(n_keep) outside them, waits for the stream, advances n_past
        and hands (T, ms) to record."""
        cp = cupy()
        start, end = cp.cuda.Event(), cp.cuda.Event()

        def timer(engine, tokens, pos, n_keep):
            engine._pending = None  # a window run before is dropped (it wrote no committed state)
            engine.wait_commit()    # a commit() before is not this window's
            t0 = time.perf_counter()
            T = engine.stage_window(np.asarray(tokens, dtype=np.int64))
            start.record(engine.stream)
            timed(T, n_keep)
            end.record(engine.stream)
            host_ms = (time.perf_counter() - t0) * 1e3
            after(n_keep)
            engine._synchronize()
            engine.n_past += n_keep
            ms = cp.cuda.get_elapsed_time(start, end)
            record(T, ms)
            return ms, host_ms

        return timer
