"""Which model classes exist: every class reachable from transformers' Auto mappings."""

from __future__ import annotations

import fnmatch
from typing import Any

#: the Auto mapping of base models (one class per model type)
BASE_MAPPING = "MODEL_MAPPING_NAMES"


def _names(value: Any) -> list[str]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def auto_mappings() -> dict[str, dict[str, Any]]:
    """``{mapping name: {model_type: class name(s)}}`` for every ``MODEL_*_MAPPING_NAMES`` of modeling_auto: the
    mappings of model classes. ``CONFIG_MAPPING_NAMES``, which modeling_auto imports too, maps to configuration
    classes and is left out."""
    from transformers.models.auto import modeling_auto

    return {
        n: getattr(modeling_auto, n)
        for n in dir(modeling_auto)
        if n.startswith("MODEL_") and n.endswith("_MAPPING_NAMES") and isinstance(getattr(modeling_auto, n), dict)
    }


def all_classes() -> dict[str, str]:
    """Every model class name reachable from an Auto mapping -> its model_type (first mapping wins)."""
    out: dict[str, str] = {}
    for mapping in auto_mappings().values():
        for model_type, value in mapping.items():
            for name in _names(value):
                out.setdefault(name, model_type)
    return out


def _own_type(class_name: str, model_types: list[str]) -> str:
    """The model type a class is named after, among the types mapping to it (``LlamaModel``: ``llama``,
    not ``internlm3``, which reuses it); the first one when none matches."""
    stem = class_name.lower()
    for suffix in ("model",):
        stem = stem.removesuffix(suffix)
    norm = {t: t.replace("_", "").replace("-", "").lower() for t in model_types}
    exact = [t for t in model_types if norm[t] == stem]
    if exact:
        return exact[0]
    prefix = sorted((t for t in model_types if stem.startswith(norm[t])), key=lambda t: -len(norm[t]))
    return prefix[0] if prefix else model_types[0]


def base_classes() -> dict[str, str]:
    """One base model class per model type: ``{class name: model_type}``. A class several model types
    reuse is listed once, under the type it is named after."""
    types: dict[str, list[str]] = {}
    for model_type, value in auto_mappings()[BASE_MAPPING].items():
        types.setdefault(_names(value)[0], []).append(model_type)
    return {name: _own_type(name, found) for name, found in types.items()}


#: Auto mappings of generative heads, in the order a model type's class is taken from them (an
#: encoder-decoder type's full model before its decoder-only ``ForCausalLM``)
GENERATIVE_MAPPINGS = (
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
)


def generative_classes() -> dict[str, str]:
    """One generative class per model type (seq2seq LM, else speech seq2seq, image-text-to-text, causal LM):
    ``{class name: model_type}``, the classes the sweep's generation mode runs. A class several model
    types reuse is listed once, under the type it is named after (as :func:`base_classes`)."""
    mappings = auto_mappings()
    chosen: dict[str, str] = {}
    for mapping_name in GENERATIVE_MAPPINGS:
        for model_type, value in mappings.get(mapping_name, {}).items():
            chosen.setdefault(model_type, _names(value)[0])
    types: dict[str, list[str]] = {}
    for model_type, name in chosen.items():
        types.setdefault(name, []).append(model_type)
    return {name: _own_type(name.split("For")[0] + "Model", found) for name, found in types.items()}


#: the seeded random sample of non-base classes the report counts as a sample (``--classes sample``)
SAMPLE_SIZE = 400
SAMPLE_SEED = 29
#: ... and of generative classes (``--classes sample --shapes generation``)
GENERATIVE_SAMPLE_SIZE = 100


def nonbase_sample(size: int = SAMPLE_SIZE, seed: int = SAMPLE_SEED) -> dict[str, str]:
    """A seeded random sample of ``size`` classes among those of :func:`all_classes` that are not base classes
    (task heads, backbones, towers): ``{class name: model_type}``. The same installed transformers, size and seed
    give the same sample."""
    import random

    every = all_classes()
    base = base_classes()
    pool = sorted(c for c in every if c not in base)
    return {c: every[c] for c in sorted(random.Random(seed).sample(pool, min(size, len(pool))))}


def generative_sample(size: int = GENERATIVE_SAMPLE_SIZE, seed: int = SAMPLE_SEED) -> dict[str, str]:
    """A seeded random sample of ``size`` of the :func:`generative_classes` (one per model type): ``{class name:
    model_type}``. The same installed transformers, size and seed give the same sample."""
    import random

    every = generative_classes()
    return {c: every[c] for c in sorted(random.Random(seed).sample(sorted(every), min(size, len(every))))}


def select(classes: dict[str, str], only: str | None = None, shard: str | None = None) -> list[str]:
    """Class names sorted, filtered by ``only`` (comma-separated fnmatch patterns on the class name or
    model type) and by ``shard`` ("i/n", 0-based: every n-th class starting at i)."""
    names = sorted(classes)
    if only:
        patterns = [p.strip() for p in only.split(",") if p.strip()]
        names = [n for n in names if any(fnmatch.fnmatchcase(n, p) or fnmatch.fnmatchcase(classes[n], p) for p in patterns)]
        if not names:
            raise ValueError(f"--only {only}: no model class or model type matches")
    if shard:
        index, _, count = shard.partition("/")
        i, n = int(index), int(count)
        if not 0 <= i < n:
            raise ValueError(f"--shard {shard}: want i/n with 0 <= i < n")
        names = names[i::n]
    return names


def resolve(class_name: str) -> type:
    """The model class object (imported lazily through the transformers top-level namespace)."""
    import transformers

    cls = getattr(transformers, class_name, None)
    if cls is None:
        raise ImportError(f"transformers has no attribute {class_name}")
    return cls
