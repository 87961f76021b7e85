"""`strata logprobs`: per-position log-probs of a token sequence, fed through verify windows."""

from __future__ import annotations

import json

import click

from ..report.present import RECORD_FORMATS
from ._common import (SEED, STDIN, STDOUT, FileParam, FiniteFloatRange, StrataCommand, context_hint, ctx_option,
                      device_option, format_option, load_engine, load_model, model_argument, run_provenance)
from ._split import split_config, split_options
from ._tiers import tier_config, tier_options

TABLE_COLUMNS = [("pos", None), ("target", None), ("lp_target", ".6f"), ("top_id", None), ("lp_top", ".6f"),
                 ("match", None), ("lp_extra", ".6f"), ("lp_target_renorm", ".6f")]
FLAT_KEYS = ["pos", "target", "lp_target", "top_id", "lp_top", "match", "lp_extra", "lp_target_renorm", "topk"]


def token_options(command=None, *, with_random: bool = True):
    """--tokens FILE | --random N | --text STR | --text-file FILE (and --seed of --random); with_random=False leaves
    --random out (verify-bench draws random ids when no source is given). tokens.tokens_from_options reads them."""

    def add(command):
        for option in reversed([
            click.option("--tokens", "token_file", type=FileParam(STDIN),
                         help="File of token ids (whitespace/commas, UTF-8; - = stdin)."),
            *([click.option("--random", "n_random", type=click.IntRange(min=2),
                            help="Use N random token ids instead.")] if with_random else []),
            click.option("--text", help="Text, tokenized by the model's own tokenizer (tokenizer.ggml.*)."),
            click.option("--text-file", type=FileParam(STDIN),
                         help="A UTF-8 text file (- = stdin), tokenized by the model's own tokenizer."),
        ]):
            command = option(command)
        return command

    return add if command is None else add(command)


@click.command(cls=StrataCommand, short_help="Dump per-position logprobs of a token sequence.")
@model_argument
@token_options
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of --random and of --draft-noise.")
@click.option("--topk", type=click.IntRange(0, 256), default=0, show_default=True, help="Top-K id:logprob fields.")
@click.option("--window", "window", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Verify window size T (1 last accepted token + T-1 drafts).")
@click.option("--extra-id", type=int, default=None, help="Extra token reported per row (default: the model's EOS).")
@click.option("--draft-noise", type=FiniteFloatRange(0, 1), default=0.0, show_default=True,
              help="Probability of replacing each draft by a wrong token (the dump must not change).")
@click.option("--full-dist", is_flag=True, help="json/jsonl: also write each row's whole log-prob distribution "
              "(`strata compare` then reports KLD).")
@format_option(("tsv",) + RECORD_FORMATS, default="tsv")
@click.option("-o", "--output", default="-", show_default=True, type=FileParam(STDOUT),
              help="Write the dump here (- = stdout); a file appears only when complete.")
@click.option("--force", is_flag=True, help="Overwrite the -o file if it exists.")
@click.option("--allow-nonfinite", is_flag=True,
              help="Write windows whose values went NaN/Inf (warned and marked) instead of stopping (exit 4).")
@device_option
@ctx_option
@tier_options
@split_options
def command(model, token_file, n_random, text, text_file, seed, topk, window, extra_id, draft_noise, full_dist, fmt,
            output, force, allow_nonfinite, device, n_ctx, gpus, layer_split, **tier_args):
    """One row per position p = 0..N-2: the distribution after tokens[0..p], target tokens[p+1].

    TSV columns: pos, target, logprob(target), top_id, logprob(top_id), match, logprob(extra_id),
    logprob(target) renormalised without extra_id, then K fields id:logprob (most likely first). The loop's
    acceptance (histogram of accepted drafts, mean accepted drafts, per-position acceptance) goes to stderr and
    into the dump (TSV: a `# speculation {json}` line after the rows; JSON: meta.speculation), for verify-bench
    --acceptance-from. TSV rows are written as each window produces them.
    """
    from ..analysis.dumps import format_row, rows_to_json
    from ..analysis.logprobs import speculative_dump
    from ..analysis.speculation import DUMP_TAG
    from ..engine.state import resolve_ctx
    from ..errors import InputError, OptionError
    from ..model.tokens import check_range, tokens_from_options
    from ..report.envinfo import environment_record, header_line
    from ..report.present import Column, emit, err_console, warn
    from ..report.progress import step_progress
    from ..sysio.files import check_output_path, is_stdio, output_stream

    split = split_config(gpus, layer_split)
    if full_dist and fmt not in ("json", "jsonl"):
        raise OptionError("--full-dist writes whole distributions: it needs --format json or jsonl")
    if not is_stdio(output):
        check_output_path(output, what="logprob dump", force=force)
    m = load_model(model)
    g = m.geometry
    ctx = resolve_ctx(g, n_ctx)
    if n_random is not None:  # before a token is drawn
        check_positions(n_random, ctx, f"--random {n_random}", g.n_ctx)
    tokens, source = tokens_from_options(m, token_file=token_file, n_random=n_random, text=text,
                                         text_file=text_file, seed=seed)
    if len(tokens) < 2:
        raise InputError(f"{source}: need at least 2 tokens (one row needs a target)")
    check_range(tokens, g.n_vocab, source)
    if extra_id is None:
        extra_id = g.eos_token_id
    elif not 0 <= extra_id < g.n_vocab:
        raise OptionError(f"--extra-id {extra_id} out of range 0..{g.n_vocab - 1}")
    check_positions(len(tokens), ctx, source, g.n_ctx)  # before the engine allocates its caches
    engine = load_engine(m, device, n_ctx, tiers=tier_config(**tier_args), split=split)
    env = environment_record(engine.device)
    comments = [header_line(env), f"model {m.path} | tokens {source} ({len(tokens)}) | window {window} | "
                f"draft-noise {draft_noise} | extra_id {extra_id}"]

    def on_rows(new, nonfinite):
        if nonfinite:
            warn(f"non-finite values at positions {new[0].pos}..{new[-1].pos} (first in {nonfinite}): written "
                 "anyway (--allow-nonfinite), marked")
        if stream is not None:  # TSV: rows go out as each window produces them
            if nonfinite:
                stream.write(f"# nonfinite: positions {new[0].pos}..{new[-1].pos} (first in {nonfinite})\n")
            stream.write("".join(format_row(r) + "\n" for r in new))
            stream.flush()

    with output_stream(output, what="logprob dump") as out:
        stream = out if fmt == "tsv" else None
        if stream is not None:
            stream.write("".join(f"# {line}\n" for line in comments))
            stream.flush()
        with step_progress("logprobs", total=len(tokens) - 1) as progress:
            rows, stats = speculative_dump(engine, tokens, window, draft_noise=draft_noise, seed=seed, topk=topk,
                                           extra_id=extra_id, full_dist=full_dist,
                                           progress=lambda done, total: progress(done), on_rows=on_rows,
                                           allow_nonfinite=allow_nonfinite)
        spec = stats.as_dict()
        if fmt == "tsv":
            out.write(f"# {DUMP_TAG} {json.dumps(spec)}\n")
        elif fmt in ("json", "jsonl"):
            meta = {"env": env, "model": m.path, "tokens": source, "window": window, "draft_noise": draft_noise,
                    "extra_id": extra_id, "windows": stats.windows, "nonfinite_windows": stats.nonfinite_windows,
                    DUMP_TAG: spec, "provenance": run_provenance(env, seed, engine.n_ctx, model=m)}
            emit(rows_to_json(rows), None, fmt, out=out, meta=meta)
        elif fmt == "csv":  # raw numbers; top-k as space-separated id:logprob pairs
            flat = [dict(r.__dict__, topk=" ".join(f"{i}:{lp!r}" for i, lp in r.topk)) for r in rows]
            emit(flat, FLAT_KEYS + (["nonfinite"] if stats.nonfinite_windows else []), fmt, out=out)
        else:
            table = [dict(r.__dict__, topk=" ".join(f"{i}:{lp:.3f}" for i, lp in r.topk),
                          nonfinite="yes" if r.nonfinite else "") for r in rows]
            cols = [Column(k, fmt=f) for k, f in TABLE_COLUMNS] + (
                [Column("topk", justify="left")] if topk else []) + (
                [Column("nonfinite")] if stats.nonfinite_windows else [])
            emit(table, cols, fmt, header_lines=[*comments[:1], comments[1] + f" | windows {stats.windows}"],
                 out=None if is_stdio(output) else out)
    err_console().print(f"{len(rows)} rows through {stats.windows} windows of <= {window} tokens "
                        f"({stats.rows_fed} rows fed, {stats.rows_kept} kept); {stats.summary_line()}",
                        style="dim", highlight=False, soft_wrap=True)


def check_positions(n_tokens: int, n_ctx: int, source: str, model_ctx: int) -> None:
    """Refuse a sequence longer than the context before any token is drawn or any cache allocated."""
    from ..errors import InputError

    if n_tokens - 1 > n_ctx:
        hint = context_hint(n_ctx, model_ctx, "the number of tokens")
        raise InputError(f"{source}: {n_tokens} tokens need {n_tokens - 1} positions, past the context "
                         f"{n_ctx} ({hint})")
