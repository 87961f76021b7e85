"""Per-tensor type mixes for make-model: a uniform `--type`, or a `--recipe` YAML (profiles/recipes/*.yaml or a
user's path) modelled on the published files.

A recipe names the type of every matrix by the first rule whose fnmatch pattern matches the GGUF tensor name,
else its default. Whatever the recipe says, the converter's exceptions hold (1-D tensors, the routers and the conv
taps stay F32), and a matrix whose rows (ne0) do not hold whole blocks of the chosen type falls back as
llama-quantize does (llama.cpp's llama_tensor_get_type): the 256-blocks of TQ1_0/TQ2_0 to Q4_0, of the other
i-quants, Q2_K and Q3_K to IQ4_NL, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0; and F16 where even that does not fit.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, OptionError
from ..model import quants as Q

RECIPE_NAMES = ("ud-q4_k_xl", "iq2_xs-mix", "q2_k-mix")
# general.file_type (llama_ftype) of a file quantized to one type (llama.cpp's LLAMA_FTYPE_MOSTLY_*)
LLAMA_FTYPE = {Q.F32: 0, Q.F16: 1, Q.Q4_0: 2, Q.Q4_1: 3, Q.Q8_0: 7, Q.Q5_0: 8, Q.Q5_1: 9, Q.Q2_K: 10,
               Q.Q3_K: 11, Q.Q4_K: 14, Q.Q5_K: 16, Q.Q6_K: 18, Q.IQ2_XXS: 19, Q.IQ2_XS: 20, Q.IQ3_XXS: 23,
               Q.IQ1_S: 24, Q.IQ4_NL: 25, Q.IQ3_S: 26, Q.IQ2_S: 28, Q.IQ4_XS: 30, Q.IQ1_M: 31, Q.BF16: 32,
               Q.TQ1_0: 36, Q.TQ2_0: 37, Q.MXFP4: 38, Q.NVFP4: 39}
FILE_TYPES = {Q.TYPE_NAMES[t]: t for t in LLAMA_FTYPE}
# Kept F32 by the converter and llama-quantize whatever the output type (their quantization exceptions).
ALWAYS_F32 = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")
_TO_IQ4_NL = (Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.Q2_K, Q.Q3_K, Q.IQ4_XS)
FALLBACK = {**{t: Q.IQ4_NL for t in _TO_IQ4_NL}, Q.TQ1_0: Q.Q4_0, Q.TQ2_0: Q.Q4_0, Q.Q4_K: Q.Q5_0,
            Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


@dataclass(frozen=True)
class Recipe:
    name: str
    ftype: int  # general.file_type
    default: int  # type of a matrix no rule names
    rules: tuple[tuple[str, int], ...] = ()  # (fnmatch pattern over tensor names, GGML type), first match wins

    def wanted(self, name: str) -> int:
        for pattern, ggml_type in self.rules:
            if fnmatch.fnmatchcase(name, pattern):
                return ggml_type
        return self.default


def uniform(ggml_type: int) -> Recipe:
    return Recipe(Q.TYPE_NAMES[ggml_type], LLAMA_FTYPE[ggml_type], ggml_type)


def fit_type(ggml_type: int, ne0: int) -> int:
    """The type llama-quantize writes for rows of ne0 elements when ggml_type was asked for."""
    if Q.fits(ggml_type, ne0):
        return ggml_type
    fallback = FALLBACK.get(ggml_type)
    if fallback is not None and Q.fits(fallback, ne0):
        return fallback
    return Q.F16


def tensor_type(name: str, shape: tuple[int, ...], recipe: Recipe) -> int:
    """The GGML type of one tensor (GGML shape, ne0 first) under a recipe."""
    if len(shape) == 1 or name.endswith(ALWAYS_F32):
        return Q.F32
    wanted = recipe.wanted(name)
    return Q.F32 if wanted == Q.F32 else fit_type(wanted, shape[0])


def recipes_dir() -> Path:
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "profiles" / "recipes", here / "_profiles" / "recipes"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no profiles/recipes directory found next to {here}")


def _type_id(path: str, where: str, value) -> int:
    ggml_type = Q.TYPE_IDS.get(str(value).upper()) if isinstance(value, str) else None
    if ggml_type is None:
        raise InputError(f"{path}: {where} = {value!r}: not a type strata writes "
                         f"(one of {', '.join(Q.TYPE_NAMES.values())})")
    return ggml_type


def load_recipe(name_or_path: str) -> Recipe:
    """A recipe by name (profiles/recipes/<name>.yaml), by path, or `-`: its YAML on stdin."""
    import yaml

    from ..sysio.files import is_stdio

    stdin, path = is_stdio(name_or_path), Path(name_or_path)
    if stdin:
        path = Path("stdin")  # what the messages below call it
    elif not path.suffix and not path.exists():
        path = recipes_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            raise OptionError(f"--recipe {name_or_path}: no such recipe (built in: {', '.join(RECIPE_NAMES)}; "
                             "or give a YAML file's path)")
    from ..sysio.files import read_text

    try:
        data = yaml.safe_load(read_text("-" if stdin else path, what="recipe"))
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a recipe is a mapping with keys name, file_type, default, rules")
    unknown = set(data) - {"name", "file_type", "default", "rules"}
    if unknown:
        raise InputError(f"{path}: unknown key {sorted(unknown)[0]!r} (keys: name, file_type, default, rules)")
    if "default" not in data:
        raise InputError(f"{path}: missing key 'default' (the type of a matrix no rule names)")
    default = _type_id(str(path), "default", data["default"])
    ftype = data.get("file_type", LLAMA_FTYPE.get(default, 0))
    if isinstance(ftype, bool) or not isinstance(ftype, int) or ftype < 0:
        raise InputError(f"{path}: file_type = {ftype!r}: expected a llama_ftype number (e.g. 15 for Q4_K_M)")
    rules = []
    for i, rule in enumerate(data.get("rules") or []):
        if not isinstance(rule, dict) or set(rule) != {"match", "type"} or not isinstance(rule["match"], str):
            raise InputError(f"{path}: rules[{i}] = {rule!r}: expected {{match: <tensor name pattern>, type: <type>}}")
        rules.append((rule["match"], _type_id(str(path), f"rules[{i}].type", rule["type"])))
    return Recipe(str(data.get("name", path.stem)), ftype, default, tuple(rules))
