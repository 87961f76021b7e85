"""`strata make-model`: write a random-weight qwen4exp GGUF of a preset geometry."""

from __future__ import annotations

import shutil
from contextlib import nullcontext

import click
from rich.console import Console

from ..errors import InputError, OptionError
from ..report.progress import byte_progress
from ..synth import estimate_size, load_preset, write_model
from ..synth.presets import PRESET_NAMES
from ..synth.recipes import FILE_TYPES, RECIPE_NAMES
from ..synth.writer import size_lower_bound
from ..sysio.files import check_output_path, stdout_text
from ..sysio.memory import available_memory
from ._common import MODEL_OUT, SEED, STDIN, FileParam, StrataCommand, format_option

GIB = 1 << 30
DISK_MARGIN = 1 * GIB
BAR_MIN_BYTES = 64 << 20  # below this the write takes well under a second


@click.command("make-model", cls=StrataCommand, short_help="Write a synthetic random-weight qwen4exp GGUF.")
@click.argument("out", type=MODEL_OUT)  # a str (FileParam keeps the trailing '/' of `out/newdir/`)
@click.option("--preset", default="tiny", show_default=True, type=FileParam(STDIN),
              metavar="|".join(PRESET_NAMES) + "|PATH.yaml|-",
              help="Model geometry: a preset name (profiles/presets/<name>.yaml) or the path of a preset YAML file.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the random weights.")
@click.option("--type", "ggml_type", type=click.Choice(list(FILE_TYPES), case_sensitive=False),
              help="Output type of every matrix, as the converter's --outtype or llama-quantize's type "
                   "[default: Q8_0 for flash-next, else F32]")
@click.option("--recipe", metavar="NAME|PATH", type=FileParam(STDIN),
              help=f"Per-tensor type mix instead of --type: {', '.join(RECIPE_NAMES)} (profiles/recipes/) or a "
                   "YAML file of your own.")
@click.option("--layers", type=int, help="Fewer layers (the attention interval is kept).")
@click.option("--experts", type=int, help="Fewer routed experts (experts used is clamped to it).")
@click.option("--vocab", type=int, help="Smaller token vocabulary.")
@click.option("--ngram-vocab", type=int,
              help="PLE n-gram vocab base per head; flash-next's 20000000 makes a 320M-row table (~54 GB at Q8_0).")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@format_option()
def command(out: str, preset: str, seed: int, ggml_type: str | None, recipe: str | None, layers: int | None,
            experts: int | None, vocab: int | None, ngram_vocab: int | None, force: bool, fmt: str) -> None:
    """Write a random-weight qwen4exp model to OUT (a GGUF that strata loads like a converted one), then print
    what was written (path, bytes, preset, type, seed)."""
    from ..report.present import emit, warn
    from ..synth.plan import fallbacks
    from ..synth.recipes import load_recipe

    if preset not in PRESET_NAMES and not preset.endswith((".yaml", ".yml")) and preset != "-":
        raise OptionError(f"--preset '{preset}': expected one of {', '.join(PRESET_NAMES)}, a path ending in .yaml "
                          "or - (YAML on stdin)")
    stdout_text()  # the summary goes there at the end: refuse a closed stdout before writing gigabytes
    out = check_output_path(out, what="model", force=force)
    geometry = load_preset(preset).with_overrides(layers=layers, experts=experts, vocab=vocab,
                                                  ngram_vocab=ngram_vocab)
    if recipe is not None and ggml_type is not None:
        raise OptionError("--type and --recipe: give one of them")
    choice = load_recipe(recipe) if recipe is not None else \
        (ggml_type or ("Q8_0" if geometry.name.startswith("flash-next") else "F32")).upper()
    type_label = choice.name if recipe is not None else choice
    target_dir = out.absolute().parent
    free = shutil.disk_usage(target_dir).free
    # refuse absurd sizes from arithmetic alone, before the plan (tensor list, tokenizer, primes) is built
    least_bytes, plan_memory = size_lower_bound(geometry, choice)
    if least_bytes > free:
        raise InputError(f"{out}: the model needs at least {_gib(least_bytes)} (a lower bound from --layers/"
                         f"--experts/--vocab/--ngram-vocab), {target_dir} has {_gib(free)} free")
    available = available_memory()
    if available is not None and plan_memory > available // 2:
        raise InputError(f"{out}: planning this model needs at least {_gib(plan_memory)} of memory (vocabulary "
                         f"{geometry.vocab_size}, {geometry.num_hidden_layers} layers), {_gib(available)} is "
                         "available")
    size = estimate_size(geometry, choice)
    err = Console(stderr=True, highlight=False)
    err.print(f"{geometry.summary_line()}, {type_label}", soft_wrap=True, markup=False)
    for role, wanted, got, ne0, count in fallbacks(geometry, choice if recipe is not None else FILE_TYPES[choice]):
        err.print(f"fallback: {role} ({count}x) {wanted} -> {got}: rows of {ne0} do not hold whole {wanted} blocks "
                  "(as llama-quantize does)", soft_wrap=True)
    if not any(geometry.layer_is_attn):
        warn(f"{geometry.name}: no attention layer in {geometry.num_hidden_layers} layers (full attention every "
             f"{geometry.full_attention_interval}): the model has no QSA/attention path to run or test")
    err.print(f"will write {size / GIB:.2f} GiB ({size} bytes) to {out}", soft_wrap=True, markup=False)
    if free < size + DISK_MARGIN:
        raise InputError(f"{target_dir}: {free / GIB:.2f} GiB free, the model needs {size / GIB:.2f} GiB "
                         f"+ {DISK_MARGIN / GIB:.0f} GiB margin")

    bar = byte_progress(f"writing {out.name}", err) if size >= BAR_MIN_BYTES else nullcontext(None)
    with bar as progress:
        path = write_model(out, geometry, seed=seed, ggml_type=choice, progress=progress)
    written = path.stat().st_size
    row = {"path": str(path), "bytes": written, "preset": geometry.name, "type": type_label, "seed": seed,
           "layers": geometry.num_hidden_layers, "experts": geometry.num_experts, "vocab": geometry.vocab_size}
    emit([row], None, fmt, title="make-model", meta=row)


def _gib(n: int) -> str:
    """A size for a message: MiB below 1 GiB, GiB below 1 EiB, else bytes in powers of ten."""
    if n < GIB:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / GIB:.2f} GiB" if n < 1 << 60 else f"{n:.3g} bytes"
