"""Options and loading shared by the commands that run a model."""

from __future__ import annotations

import click

model_argument = click.argument("model", required=False, metavar="[MODEL]")
device_option = click.option("--device", type=click.Choice(["cpu", "gpu", "auto"]), default="auto",
                             show_default=True, help="cpu = numpy reference; gpu = CUDA graph engine; auto = gpu if "
                             "one is usable, else cpu.")
ctx_option = click.option("--ctx", "n_ctx", type=click.IntRange(min=1), default=None,
                          help="Context cells to allocate (default: min(model context, 4096)).")


def load_model(model_arg: str | None):
    """Open MODEL, or the embedded default tiny model (generated once into the cache)."""
    from ..default_model import resolve_model
    from ..model.gguf_file import open_model
    from ..present import warn

    model = open_model(resolve_model(model_arg))
    for message in model.geometry.warnings:
        warn(f"{model.path}: {message}")
    return model
