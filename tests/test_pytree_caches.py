"""Pytree registration of every transformers cache and cache layer (hf_exporters.pytree).

The classes are enumerated from transformers itself: ``Cache`` and its subclasses, the subclasses of
``CacheLayerMixin`` and ``LinearAttentionCacheLayerMixin``, the layer classes of the layer-type
mappings (``DummyLayer``, the ``_layer_type`` registrations of modeling files), and the subclasses
defined in ``transformers.models.*`` (the modeling files that subclass one of them are imported).
Each is filled with tensors, round-tripped through flatten/unflatten and the saved spec, and exported
as an output (built in ``forward`` from inputs of symbolic size; static, dynamic, and dynamic with
``strict=True``, where Dynamo traces the flatten) and as an input (updated in ``forward``; static and
dynamic). Then whole tiny models with their default ``use_cache=True`` (sliding-window, hybrid
convolution, a decode step taking a sliding-window cache, ``strict=True``).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import json
import re
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree
import transformers
from transformers import cache_utils

from hf_exporters import DynamoConfig, DynamoExporter
from hf_exporters.pytree import load_context, register_model_pytrees
from hf_exporters.shapes import auto_dynamic_shapes, is_symbolic

AUTO = torch.export.Dim.AUTO
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
HEADS, HEAD_DIM, WINDOW, MAX_CACHE_LEN, CONV_KERNEL = 2, 8, 4, 8, 3


# ── enumeration ────────────────────────────────────────────────────────────


def _subclasses(cls: type) -> list[type]:
    found, stack = [], [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                stack.append(sub)
    return found


def _import_model_subclasses() -> None:
    """Import the modeling files of transformers.models that define a subclass (direct or through
    another such class) of a class of cache_utils, found by their ``class X(Base):`` lines."""
    known = {name for name, obj in vars(cache_utils).items() if inspect.isclass(obj) and obj.__module__ == cache_utils.__name__}
    pattern = re.compile(r"^class (\w+)\(([^)]*)\):", re.M)
    definitions = []
    for path in sorted((Path(transformers.__file__).parent / "models").glob("*/modeling_*.py")):
        for name, bases in pattern.findall(path.read_text(encoding="utf-8")):
            definitions.append((path, name, {b.strip().split(".")[-1] for b in bases.split(",")}))
    modules, changed = set(), True
    while changed:
        changed = False
        for path, name, bases in definitions:
            if name not in known and bases & known:
                known.add(name)
                modules.add(f"transformers.models.{path.parent.name}.{path.stem}")
                changed = True
    for module in sorted(modules):
        importlib.import_module(module)


def _enumerate() -> tuple[list[type], list[type]]:
    _import_model_subclasses()
    caches = [cache_utils.Cache, *_subclasses(cache_utils.Cache)]
    layers = [
        *_subclasses(cache_utils.CacheLayerMixin),
        *_subclasses(cache_utils.LinearAttentionCacheLayerMixin),
        *cache_utils.DYNAMIC_LAYER_TYPE_MAPPING.values(),
        *cache_utils.STATIC_LAYER_TYPE_MAPPING.values(),
    ]
    return list(dict.fromkeys(caches)), list(dict.fromkeys(layers))


CACHES, LAYERS = _enumerate()
CLASSES = CACHES + LAYERS
IDS = [cls.__qualname__ for cls in CLASSES]


def test_enumeration_reaches_every_kind_of_cache_and_layer():
    names = set(IDS)
    # cache_utils' own, the layer-type registrations and the model-specific subclasses
    assert {"DynamicCache", "StaticCache", "EncoderDecoderCache", "QuantizedCache", "MiniMaxCache"} <= names
    assert {"DynamicSlidingWindowLayer", "StaticSlidingWindowLayer", "LinearAttentionLayer", "DummyLayer"} <= names
    assert {"DeepseekV4HCACache", "DeepseekV4CSACache", "MiniMaxM3VLSparseCacheLayer", "UnlimitedOcrDynamicReferenceSlidingWindowLayer"} <= names
    registered = {*cache_utils.DYNAMIC_LAYER_TYPE_MAPPING.values(), *cache_utils.STATIC_LAYER_TYPE_MAPPING.values()}
    assert registered <= set(LAYERS)


# ── building and filling one instance ──────────────────────────────────────


# configs are built here, not in a traced forward (Dynamo cannot trace a config's constructor)
HYBRID_CONFIG = transformers.Gemma2Config(**TINY, head_dim=HEAD_DIM, sliding_window=WINDOW)  # sliding + full layers
FULL_CONFIG = transformers.LlamaConfig(**TINY)


def _model_config(cls: type):
    """The first config class of ``cls``'s modeling module that builds a layer of ``cls`` with its defaults."""
    module = inspect.getmodule(cls)
    for _, candidate in inspect.getmembers(module, inspect.isclass):
        if issubclass(candidate, transformers.PreTrainedConfig) and candidate is not transformers.PreTrainedConfig:
            try:
                config = candidate()
                cls(config=config)
            except Exception:  # noqa: BLE001 - try the next config class of the module
                continue
            return config
    raise LookupError(f"no config class in {module.__name__} builds {cls.__qualname__}")


MODEL_CONFIGS = {cls: _model_config(cls) for cls in LAYERS if "config" in inspect.signature(cls.__init__).parameters}


def _unavailable(cls: type) -> str | None:
    if inspect.isabstract(cls):
        return "abstract"
    if cls.__name__ in ("QuantoQuantizedLayer", "HQQQuantizedLayer"):
        package = "optimum.quanto" if cls.__name__.startswith("Quanto") else "hqq"
        if importlib.util.find_spec(package.split(".")[0]) is None:
            return f"needs {package}, not installed"
    return None


def _make_layer(cls: type):
    kwargs = {}
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name == "sliding_window":
            kwargs[name] = WINDOW
        elif name == "max_cache_len":
            kwargs[name] = MAX_CACHE_LEN
        elif name == "config":
            kwargs[name] = MODEL_CONFIGS[cls]
    return cls(**kwargs)


def _make_cache(cls: type):
    if cls is cache_utils.Cache:
        return cls(layers=[cache_utils.DynamicSlidingWindowLayer(sliding_window=WINDOW), cache_utils.DynamicLayer()])
    if issubclass(cls, cache_utils.EncoderDecoderCache):
        return cls(cache_utils.DynamicCache(config=HYBRID_CONFIG), cache_utils.DynamicCache())
    if issubclass(cls, cache_utils.QuantizedCache):
        return cls(backend="fp8", config=FULL_CONFIG)  # the one backend without an optional package
    if issubclass(cls, cache_utils.StaticCache):
        return cls(config=HYBRID_CONFIG, max_cache_len=MAX_CACHE_LEN)
    if cls.__init__ is cache_utils.DynamicCache.__init__ or "config" in inspect.signature(cls.__init__).parameters:
        return cls(config=HYBRID_CONFIG)
    return cls()


def make(cls: type):
    return _make_cache(cls) if issubclass(cls, cache_utils.Cache) else _make_layer(cls)


def _feed_layer(layer, k: torch.Tensor, v: torch.Tensor) -> None:
    """One update of every state the layer keeps, from ``k``/``v`` of shape (batch, heads, seq, head_dim)."""
    if isinstance(layer, cache_utils.CacheLayerMixin):
        layer.update(k, v)
    if isinstance(layer, cache_utils.LinearAttentionCacheLayerMixin):
        layer.update_conv_state(k[:, 0].transpose(1, 2) * 1, conv_kernel_size=CONV_KERNEL)  # (batch, channels, seq)
        layer.update_recurrent_state(v[:, :, :1] * 1)
    if hasattr(layer, "update_indexer"):
        layer.update_indexer(k[:, 0] * 1)  # (batch, seq, index_head_dim)
    if hasattr(layer, "update_index"):
        layer.update_index(k[:, :1] * 1)  # (batch, 1, seq, head_dim)
    if hasattr(layer, "update_compressor_states"):
        for name in layer.compressed_kv:
            layer.store_compression_weights(name, k.transpose(1, 2), v.transpose(1, 2))
            layer.update_compressor_states(name, k[:, 0] * 1)  # one entry per position: entry_count grows by seq
            if hasattr(layer, "update_overlap_state"):
                layer.update_overlap_state(name, k.transpose(1, 2).unsqueeze(2), v.transpose(1, 2).unsqueeze(2), HEAD_DIM // 2)


def feed(obj, k: torch.Tensor, v: torch.Tensor) -> None:
    if not isinstance(obj, cache_utils.Cache):
        _feed_layer(obj, k, v)
        return
    subcaches = [c for c in vars(obj).values() if isinstance(c, cache_utils.Cache)]
    for cache in subcaches or [obj]:
        if not cache.layers:  # layers appended on the first update (layer_class_to_replicate)
            cache.update(k, v, 0)
            cache.update(k, v, 1)
        else:
            for layer in cache.layers:
                _feed_layer(layer, k, v)
    if hasattr(obj, "set_linear_cache"):
        obj.set_linear_cache(2, k * 1)


def _kv(batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, HEADS, seq, HEAD_DIM), torch.randn(batch, HEADS, seq, HEAD_DIM)


def _prepare(cls: type) -> None:
    reason = _unavailable(cls)
    if reason:
        pytest.skip(f"{cls.__qualname__}: {reason}")
    register_model_pytrees(None)
    assert cache_utils.Cache in pytree.SUPPORTED_NODES
    if issubclass(cls, cache_utils.Cache):
        assert cls in pytree.SUPPORTED_NODES


def _holder(obj):
    """A layer travels inside a Cache (the registered node that holds layers); a cache as itself."""
    return obj if isinstance(obj, cache_utils.Cache) else cache_utils.Cache(layers=[obj])


def _unwrap(obj, cls):
    return obj if issubclass(cls, cache_utils.Cache) else obj.layers[0]


def _state(value):
    """Everything an object holds, tensors as tensors, for an equality check."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_state(v) for v in value)
    if isinstance(value, dict):
        return {k: _state(v) for k, v in value.items()}
    if hasattr(value, "__dict__") and not callable(value) and not isinstance(value, type):
        return (type(value), {k: _state(v) for k, v in vars(value).items()})
    return value


def assert_same(actual, expected, atol: float = 0.0, path: str = "") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), path
        assert actual.shape == expected.shape and actual.dtype == expected.dtype, path
        if expected.numel():
            assert (actual.double() - expected.double()).abs().max() <= atol, path
        return
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, atol, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), path
        for key in expected:
            assert_same(actual[key], expected[key], atol, f"{path}[{key!r}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def _contexts(spec: pytree.TreeSpec) -> list:
    return [spec.context, *(c for child in spec.children() for c in _contexts(child))]


# ── per class: flatten/unflatten, saved spec ─────────────────────────────────


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_flatten_unflatten_round_trip(cls):
    _prepare(cls)
    obj = make(cls)
    feed(obj, *_kv(2, 5))
    feed(obj, *_kv(2, 2))
    tree = _holder(obj)
    leaves, spec = pytree.tree_flatten(tree)
    assert all(isinstance(leaf, torch.Tensor) for leaf in leaves)
    rebuilt = pytree.tree_unflatten(leaves, spec)
    assert_same(_state(rebuilt), _state(tree))
    assert pytree.tree_flatten(rebuilt)[1] == spec  # the rebuilt object flattens to the same spec
    for context in _contexts(spec):
        hash(context)  # a context strict tracing can take: plain, hashable values, no JSON string
        assert not isinstance(context, str)
    assert pytree.treespec_loads(pytree.treespec_dumps(spec)) == spec


def test_a_context_saved_as_json_by_the_first_version_loads():
    layer = {"t": "obj", "c": "transformers.cache_utils:DynamicLayer", "v": [["keys", {"t": "leaf"}], ["values", {"t": "leaf"}], ["is_initialized", {"t": "lit", "v": True}], ["dtype", {"t": "dtype", "v": "float32"}], ["device", {"t": "device", "v": "cpu"}]]}
    legacy = json.dumps({"c": "transformers.cache_utils:DynamicCache", "v": [["layers", {"t": "list", "v": [layer]}], ["layer_class_to_replicate", {"t": "type", "v": "transformers.cache_utils:DynamicLayer"}], ["offloading", {"t": "lit", "v": False}]]})
    register_model_pytrees(None)
    cache = cache_utils.DynamicCache()
    cache.update(*_kv(1, 3), 0)
    assert load_context(legacy) == pytree.tree_flatten(cache)[1].context


# ── per class: torch.export, as an output and as an input ────────────────────


class _Builds(torch.nn.Module):
    """Returns a new cache (or layer in a Cache) filled from inputs of symbolic size."""

    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def forward(self, k, v):
        obj = make(self.cls)
        feed(obj, k, v)
        return _holder(obj)


class _Updates(torch.nn.Module):
    """Takes a cache (or a Cache holding a layer), updates it and returns it."""

    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def forward(self, cache, k, v):
        feed(_unwrap(cache, self.cls), k, v)
        return cache


def _check_program(program, module, args_sets) -> None:
    for args in args_sets:
        expected = module(*copy.deepcopy(args))
        actual = program.module()(*copy.deepcopy(args))
        _, expected_spec = pytree.tree_flatten(expected)
        _, actual_spec = pytree.tree_flatten(actual)
        assert actual_spec == expected_spec
        assert_same(_state(actual), _state(expected), atol=1e-6)


@pytest.mark.parametrize("mode", ["static", "dynamic", "strict-dynamic"])
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_export_returning_it(cls, mode, tmp_path):
    _prepare(cls)
    module = _Builds(cls)
    dynamic = mode != "static"
    shapes = {"k": {0: AUTO, 2: AUTO}, "v": {0: AUTO, 2: AUTO}} if dynamic else None
    # strict: Dynamo traces the flatten of the returned object (no json, contexts of constants)
    program = torch.export.export(module, _kv(2, 5), dynamic_shapes=shapes, strict=mode.startswith("strict"))
    outputs = program.graph.find_nodes(op="output")[0].args[0]
    dynamic = dynamic and bool(outputs)  # a DummyLayer holds no tensor: nothing is returned, k and v are unused
    # another batch only: some layers guard the length (a window, a compression rate dividing it)
    _check_program(program, module, [_kv(2, 5), _kv(3, 5)] if dynamic else [_kv(2, 5)])
    if dynamic:  # (torch.export.save refuses a program without outputs)
        assert any(is_symbolic(d) for node in outputs for d in node.meta["val"].shape)
        path = tmp_path / "model.pt2"
        torch.export.save(program, str(path))
        _check_program(torch.export.load(str(path)), module, [_kv(3, 5)])


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_export_taking_and_returning_it(cls, dynamic):
    _prepare(cls)
    module = _Updates(cls)

    def args(batch: int):
        obj = make(cls)
        feed(obj, *_kv(batch, 3))
        return (_holder(obj), *_kv(batch, 2))

    example = args(2)
    shapes = auto_dynamic_shapes({"cache": example[0], "k": example[1], "v": example[2]}) if dynamic else None
    program = torch.export.export(module, copy.deepcopy(example), dynamic_shapes=shapes)
    _check_program(program, module, [example, args(3)] if dynamic else [example])


# ── whole models returning their cache (default use_cache=True) ──────────────


def _tiny_model(kind: str):
    if kind == "gemma2":  # sliding-window and full layers
        return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**TINY, head_dim=HEAD_DIM, sliding_window=WINDOW)).eval()
    if kind == "mistral-sliding":  # every layer a sliding-window layer
        return transformers.MistralForCausalLM(transformers.MistralConfig(**TINY, sliding_window=WINDOW)).eval()
    if kind == "lfm2":  # hybrid: a convolution layer (int-keyed state dicts) and an attention layer
        config = transformers.Lfm2Config(**TINY, layer_types=["conv", "full_attention"], conv_L_cache=CONV_KERNEL)
        return transformers.Lfm2ForCausalLM(config).eval()
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()
    raise ValueError(kind)


def _ids(batch: int, seq: int) -> dict:
    return {"input_ids": torch.randint(1, TINY["vocab_size"], (batch, seq))}


def assert_matches_eager(model, program, inputs: dict) -> None:
    """Logits and every cache tensor within 1e-4 of eager; the same cache structure and lengths."""
    with torch.no_grad():
        expected = model(**copy.deepcopy(inputs))
        actual = program.module()(**copy.deepcopy(inputs))
    assert type(actual.past_key_values) is type(expected.past_key_values)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    assert actual_spec == expected_spec
    assert len(actual_leaves) == len(expected_leaves) > 1
    for got, want in zip(actual_leaves, expected_leaves):
        assert got.shape == want.shape
        if want.numel():
            assert (got.double() - want.double()).abs().max() < 1e-4
    assert_same(_state(actual.past_key_values), _state(expected.past_key_values), atol=1e-4)


@pytest.mark.parametrize("kind", ["gemma2", "mistral-sliding", "lfm2"])
def test_model_returning_its_cache_exports_with_dynamic_shapes(kind):
    model = _tiny_model(kind)
    assert model.config.use_cache
    exporter = DynamoExporter()
    result = exporter.run(model, _ids(2, 6), DynamoConfig(dynamic=True))
    program = result.program
    assert result.static_axes == []
    for batch, seq in [(2, 6), (3, 9), (1, 5)]:
        assert_matches_eager(model, program, _ids(batch, seq))


def test_a_program_returning_a_sliding_window_cache_saves_and_loads(tmp_path):
    model = _tiny_model("gemma2")
    exporter = DynamoExporter()
    path = exporter.save(exporter.export(model, _ids(2, 6), DynamoConfig(dynamic=True)), tmp_path)
    from hf_exporters.exporters.dynamo import load_exported_program

    program = load_exported_program(path)
    assert_matches_eager(model, program, _ids(3, 7))
    assert program.module()(**_ids(1, 10)).past_key_values.layers[0].cumulative_length == 10


def test_decode_step_taking_a_sliding_window_cache_serves_later_positions():
    """A cache taken as an input: its running length is a size of the program, so one decode graph
    (window full) serves every later position."""
    model = _tiny_model("mistral-sliding")

    def step(past: int) -> dict:
        with torch.no_grad():
            cache = model(**_ids(1, past)).past_key_values
        return {**_ids(1, 1), "past_key_values": cache}

    program = DynamoExporter().export(model, step(6), DynamoConfig(dynamic=True))
    for past in (6, 9, 13):
        assert_matches_eager(model, program, step(past))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_strict_export_of_a_model_returning_a_dynamic_cache(dynamic):
    model = _tiny_model("llama")
    program = DynamoExporter().export(model, _ids(2, 5), DynamoConfig(strict=True, dynamic=dynamic))
    assert_matches_eager(model, program, _ids(2, 5))
    if dynamic:
        assert_matches_eager(model, program, _ids(3, 8))
