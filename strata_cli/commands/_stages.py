"""verify-bench's report of the layer split (--gpus): each record's rows per stage (engine/layer_split.py's
stage_report: device, layers, weight bytes, window ms, hand-off ms; plus the bytes a window reads from the stage's
layers and, for a tiered stage, its own tiers' columns, tiers/stats.py), and the table / md printers' table of them
(one row per T and stage). csv / json / jsonl print the same values as the record's flat stageI_* keys
(report/records.py: BenchRecord.stage_rows, the one place a stage row is flattened)."""

from __future__ import annotations

# (key, table header, display format) of a stage row; a tiered run adds tiers/stats.TIER_COLUMNS after them
STAGE_COLUMNS = [("window", "T", None), ("stage", "stage", None), ("device", "device", None),
                 ("layers", "layers", None), ("ms_median", "ms/window", ".3f"),
                 ("read_bytes", "GB read", lambda v: f"{v / 1e9:.3f}"),
                 ("weight_bytes", "weight GB", lambda v: f"{v / 1e9:.3f}"),
                 ("handoff_ms_median", "hand-off ms", ".3f")]


def add_stages(records, engine, model, repetitions: int) -> None:
    """Each record's stage rows over its last `repetitions` windows: the stage report, the bytes a window of the
    record's T reads from each stage's layers, and each tiered stage's tier columns."""
    from ..analysis.traffic import window_bytes
    from ..tiers.stats import add_stage_tier_stats

    for rec in records:
        rec.stages = engine.stage_report(rec.window, repetitions)
        for stage, p in zip(rec.stages, engine.plan):
            stage["read_bytes"] = int(round(window_bytes(model, rec.window, p.layers)["total"]))
    add_stage_tier_stats(records, engine.stages, repetitions)


def emit_stage_table(records, fmt: str) -> None:
    """The table / md printers' stage rows (every T, every stage), with the tier columns when a stage has tiers."""
    from ..report.present import Column, emit
    from ..tiers.stats import TIER_COLUMNS

    rows = [row for rec in records for row in rec.stage_rows()]
    tiered = any(stage.get("tiers") for rec in records for stage in rec.stages)
    columns = [Column(k, h, f) for k, h, f in STAGE_COLUMNS + (TIER_COLUMNS if tiered else [])]
    emit(rows, columns, fmt, title="layer split: per stage")
