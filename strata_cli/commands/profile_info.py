"""`strata profile-info P`: what an expert profile holds, its coverage and held-out hit rate per cache size."""

from __future__ import annotations

import click

from ._common import MODEL_IN, STDIN, FileParam, StrataCommand, ctx_option, format_option


def _slot_list(ctx, param, value):
    if value is None:
        return None
    try:
        slots = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of slot counts") from None
    if not slots or min(slots) < 0:
        raise click.BadParameter(f"{value!r}: slot counts are integers >= 0")
    return slots


@click.command(cls=StrataCommand, short_help="Show an expert profile: coverage and held-out hit rate per cache size.")
@click.argument("profile_path", metavar="P", type=FileParam(STDIN, dir_okay=False))
@click.argument("model_pos", metavar="[MODEL]", required=False, type=MODEL_IN)
@click.option("--slots", callback=_slot_list, help="Cache sizes to report, e.g. 0,1024,4096 (default: 10/25/50/75/"
              "100 % of the pairs and the profile's own).")
@click.option("--holdout", type=FileParam(STDIN, dir_okay=False),
              help="Held-out routing: another profile (.yaml/.bin, its counts) or a token file run through --model.")
@click.option("--model", "model_arg", type=MODEL_IN,
              help="Model for a token-file --holdout and for VRAM sizes (default: the "
              "embedded tiny model).")
@click.option("--window", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Tokens per window of a held-out run.")
@format_option()
@ctx_option
def command(profile_path, model_pos, slots, holdout, model_arg, window, fmt, n_ctx):
    """Print the profile's model, tokens seen and suggested slots, then per cache size N (the first N ranked pairs
    in VRAM): the share of pairs, the VRAM it takes (with --model), the coverage of the profile's own counts and
    the hit rate of held-out routing."""
    from pathlib import Path

    from ..engine.routing import count_routing
    from ..errors import InputError, OptionError
    from ..model.tokens import check_range, read_token_file
    from ..report.progress import step_progress
    from ..tiers.expert_profile import BINARY_SUFFIXES, STRP_MAGIC, YAML_SUFFIXES, load_profile, slot_counts
    from ._common import load_model

    if model_pos is not None and model_arg is not None and model_pos != model_arg:
        raise OptionError(f"MODEL {model_pos} and --model {model_arg}: give the model once")
    model_arg = model_pos if model_pos is not None else model_arg
    profile = load_profile(profile_path)
    model = None
    if model_arg is not None:
        model = load_model(model_arg)
        profile.check_model(model.geometry, profile_path)
    held = None
    if holdout is not None:
        path = Path(holdout)
        is_profile = path.suffix.lower() in YAML_SUFFIXES + BINARY_SUFFIXES or (
            path.is_file() and path.open("rb").read(4) == STRP_MAGIC)
        if is_profile:
            other = load_profile(path)
            if other.counts is None:
                raise InputError(f"{holdout}: a STRP profile has no counts to measure a hit rate on")
            if (other.n_layers, other.n_expert) != (profile.n_layers, profile.n_expert):
                raise InputError(f"{holdout}: held-out profile of another geometry ({other.n_layers} x "
                                 f"{other.n_expert}, {profile_path} is {profile.n_layers} x {profile.n_expert})")
            held = other.counts
        else:
            if model is None:
                model = load_model(None)
                profile.check_model(model.geometry, profile_path)
            tokens = read_token_file(holdout)
            check_range(tokens, model.geometry.n_vocab, holdout)
            with step_progress(f"routing {len(tokens)} held-out tokens", total=len(tokens)) as progress:
                held = count_routing(model, tokens, window, n_ctx, progress)
    for n in slots or ():
        if n > profile.n_pairs:
            raise OptionError(f"--slots {n}: the profile has {profile.n_pairs} (layer, expert) pairs")
    report(profile, profile_path, slots or slot_counts(profile.n_pairs, [profile.slots]), held, holdout, model, fmt)


def report(profile, path, slots, held, holdout, model, fmt, head=(), out=None):
    """One row per slot count: pairs, share, VRAM (with a model), coverage, held-out hit rate."""
    from ..report.present import Column, emit
    from ..tiers.residency import expert_bytes

    slot_bytes = int(expert_bytes(model).max()) if model is not None else None
    from pathlib import Path

    from ..tiers.expert_profile import BINARY_SUFFIXES

    kind = "STRP v1" if profile.counts is None or Path(path).suffix.lower() in BINARY_SUFFIXES else "YAML"
    routed = "-" if profile.counts is None else f"{int((profile.counts > 0).sum())} pairs routed"
    lines = list(head) + [
        f"profile {path} ({kind}): model {profile.model_file or '?'}, {profile.n_layers} layers x "
        f"{profile.n_expert} experts, {profile.tokens_seen} tokens seen, {routed}, {len(profile.ranked)} ranked, "
        f"suggests {profile.slots} slots"]
    rows = []
    for n in slots:
        row = {"slots": n, "share": n / profile.n_pairs, "coverage": profile.coverage(n)}
        if slot_bytes is not None:
            row["vram_gib"] = n * slot_bytes / 2**30
        if held is not None:
            row["holdout_hit"] = profile.hit_rate(held, n)
        rows.append(row)
    def pct(value):
        return f"{value:.2%}"

    cols = [Column("slots"), Column("share", fmt=pct)]
    if slot_bytes is not None:
        cols.append(Column("vram_gib", "VRAM GiB", fmt=".2f"))
    cols.append(Column("coverage", fmt=pct))
    if held is not None:
        cols.append(Column("holdout_hit", f"hit rate {holdout}", fmt=pct))
    meta = {"profile": str(path), "format": kind, "model": profile.model_file, "layers": profile.n_layers,
            "experts": profile.n_expert, "tokens_seen": profile.tokens_seen, "ranked": len(profile.ranked),
            "slots_suggested": profile.slots, "holdout": holdout}
    emit(rows, cols, fmt, title="expert cache by profile", header_lines=lines, meta=meta, out=out)
