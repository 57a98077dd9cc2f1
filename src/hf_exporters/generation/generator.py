"""The generator: run ``generate()`` from a generation folder alone, in the backend's runtime.

:class:`ExportedGenerator` loads the parts a folder's ``export.json`` lists (:func:`read_manifest`),
runs the prefill (and encoder) part once, then the decode part once per new token, feeding each
step's cache tensors to the next, and picks tokens with transformers' logits processors as eager
``generate()`` does.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import torch

from .. import checkpoints
from ..errors import ArtifactRunError, HfExportersError, InputError, ManifestError
from ..exporters._common import first_line
from ..folders import MANIFEST_NAME
from ..pipeline import make_exporter
from ..pytree import register_model_pytrees
from ..runtime.cpp_runner import CppExecutorchRunner
from .manifest import read_manifest

#: names of generation-config keys the CLI and :meth:`ExportedGenerator.generate` accept as overrides
_SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "num_beams")


@functools.cache
def _generation_settings() -> frozenset[str]:
    """The fields of transformers' ``GenerationConfig`` (``min_new_tokens``, ``eos_token_id``, ...): keyword
    arguments of :meth:`ExportedGenerator.generate` so named override the folder's generation config, as
    transformers' ``generate(**kwargs)`` does; the others are model inputs."""
    import transformers

    return frozenset(name for name in vars(transformers.GenerationConfig()) if not name.startswith("_"))


def load_part_runners(root: Path, manifest: dict[str, Any], exporter: Any, runtime: str = "python") -> dict[str, Any]:
    """``{part name: runner}`` for every part of a generation folder's ``manifest`` (as :func:`read_manifest`
    returns it); the parts that are methods of one program share the loaded program.

    Args:
        root: the folder (the parts' ``file`` entries are relative to it).
        exporter: the backend's exporter (its ``load_runner``).
        runtime: ``"python"`` or ``"cpp"`` (the C++ runner's ExecuTorch runtime).

    Raises:
        ManifestError: a part's file cannot be loaded (corrupt or truncated) or has no such method.
        CppRunnerError: ``runtime="cpp"`` and the C++ runner refuses a part's file.
    """
    register_model_pytrees(None)
    runners = {}
    loaded: dict[str, Any] = {}  # file -> the runner that loaded it (the parts of one program share it)
    for name, part in manifest["parts"].items():
        try:
            method = part.get("method")
            if runtime == "python" and method and hasattr(loaded.get(part["file"]), "for_method"):
                runners[name] = loaded[part["file"]].for_method(method)
            elif runtime == "python":
                runners[name] = exporter.load_runner(root / part["file"], method) if method else exporter.load_runner(root / part["file"])
                loaded[part["file"]] = runners[name]
            else:
                runners[name] = CppExecutorchRunner(root / part["file"], method or "forward")
        except HfExportersError:
            raise
        except ValueError as error:
            if "has no method" not in str(error):
                raise ManifestError(
                    f"{root / part['file']}: part {name!r} cannot be loaded by the {manifest.get('backend')} runtime "
                    f"(corrupt or truncated file?{_also_read(part)}): {first_line(error)}"
                ) from error
            raise ManifestError(f"{root / part['file']}: part {name!r}: {str(error).splitlines()[0]}") from error
        except Exception as error:  # noqa: BLE001 - the runtime refused the file
            raise ManifestError(
                f"{root / part['file']}: part {name!r} cannot be loaded by the {manifest.get('backend')} runtime "
                f"(corrupt or truncated file?{_also_read(part)}): {first_line(error)}"
            ) from error
    return runners


def _also_read(part: dict[str, Any]) -> str:
    """``"; it also reads model.onnx.data"``: the part's other files (external weights), for a load error."""
    others = [f for f in part.get("files") or () if f != part["file"]]
    return f"; it also reads {', '.join(others)}" if others else ""


def _check_token_ids(name: str, ids: Any, vocab_size: int | None) -> None:
    """Refuse ``ids`` that are not a ``(B, T)`` integer tensor of ids in ``[0, vocab_size)`` (None: passes).

    ExecuTorch's quantized embedding kernel aborts the process on an id past its table, and other
    kernels read out of bounds: the ids are checked before any part runs.

    Raises:
        InputError: "input_ids must be a (B, T) tensor of token ids, got ..." or "token id N in input_ids
            is outside the vocabulary (0 to V-1)".
    """
    if ids is None:
        return
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.is_complex():
        got = f"a {ids.dim()}-D {ids.dtype} tensor" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise InputError(f"{name} must be a (B, T) tensor of integer token ids, got {got}")
    if ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        bad = low if low < 0 else high
        span = f"0 to {vocab_size - 1}" if vocab_size is not None else "ids are >= 0"
        raise InputError(f"token id {bad} in {name} is outside the vocabulary ({span})")


class _ProcessorShim:
    """The two things ``GenerationMixin._get_logits_processor`` / ``_prepare_special_tokens`` read from a model."""

    def __init__(self, config: Any):
        from transformers.generation.utils import GenerationMixin

        self.config = config
        self.device = torch.device("cpu")
        self._merge_criteria_processor_list = GenerationMixin._merge_criteria_processor_list.__get__(self)


class ExportedGenerator:
    """Greedy or sampled generation with the exported parts of a folder, in the backend's runtime.

    The cache tensors a part returns are fed to the next decode step; logits go through transformers'
    logits processors built from ``generation_config.json`` (temperature, top-k/p, repetition
    penalty, suppressed tokens, ...); generation stops at ``max_new_tokens`` or when every row has
    produced a stop token (finished rows are padded with ``pad_token_id``), as ``generate()`` does.

    Example::

        gen = ExportedGenerator.from_pretrained("out/")
        ids = gen.generate(input_ids, attention_mask=mask, max_new_tokens=8)   # (B, T + new)
    """

    def __init__(self, directory: Path, manifest: dict[str, Any], runners: dict[str, Any], config: Any, generation_config: Any, preprocessor: Any = None):
        self.directory = directory
        self.manifest = manifest
        self.runners = runners
        self.config = config
        self.generation_config = generation_config
        self.preprocessor = preprocessor
        self.roles = {part["role"]: name for name, part in manifest["parts"].items()}
        self.is_encoder_decoder = bool(manifest.get("is_encoder_decoder"))
        decode = manifest["parts"][self.roles["decode"]]
        self.cache = decode.get("cache") or {}
        self.decode_inputs = [i["name"] for i in decode["inputs"]]
        self.returns_decoder_prompt = bool(decode.get("extra", {}).get("returns_decoder_prompt", True))
        #: ONNX folders: each step's cache outputs stay in onnxruntime's memory (``OrtValue``) and are bound
        #: as the next step's inputs with onnxruntime's IOBinding, with no copy through numpy per step;
        #: False runs every step with ``InferenceSession.run`` (numpy in and out)
        self.io_binding = True
        #: ONNX folders laid out for onnxruntime-genai return logits as (B, 1, V)
        self.logits_as_sequence = bool((manifest.get("onnxruntime_genai") or {}).get("layout"))

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str], load_preprocessor: bool = True, runtime: str = "python") -> "ExportedGenerator":
        """Load a folder written by :meth:`GenerationArtifacts.save_pretrained`.

        Args:
            runtime: ``"python"`` (the backend's Python runtime) or ``"cpp"`` (ExecuTorch folders only:
                the C++ runner's ExecuTorch runtime through its bindings, see ``cpp/``).

        Raises:
            ManifestError: see :func:`read_manifest`; also a missing ``config.json`` or an unknown backend.
            MissingDependencyError: the backend's runtime is not installed.
            InputError: an unknown ``runtime``, or ``"cpp"`` for a folder of another backend.
            CppRunnerError: ``runtime="cpp"`` and the C++ runner is not built or refuses a part's file.
        """
        import transformers

        root = Path(directory)
        manifest = read_manifest(root)
        try:
            exporter = make_exporter(manifest.get("backend", ""))
        except InputError as error:
            raise ManifestError(f"{root / MANIFEST_NAME}: {error}") from error
        if runtime not in ("python", "cpp"):
            raise InputError(f"unknown runtime {runtime!r}: choose 'python' or 'cpp'")
        if runtime == "cpp" and manifest.get("backend") != "executorch":
            raise InputError(f"runtime 'cpp' runs ExecuTorch folders; {root} was exported with {manifest.get('backend')!r}")
        if not (root / "config.json").is_file():
            raise ManifestError(f"{root}: config.json is missing")
        try:
            config = transformers.AutoConfig.from_pretrained(root)
        except Exception as error:  # noqa: BLE001 - a corrupt or foreign file
            raise ManifestError(f"{root / 'config.json'} cannot be read: {first_line(error)}") from error
        try:
            if (root / "generation_config.json").is_file():
                generation_config = transformers.GenerationConfig.from_pretrained(root)
            else:
                generation_config = transformers.GenerationConfig.from_model_config(config)
        except Exception as error:  # noqa: BLE001
            raise ManifestError(f"{root / 'generation_config.json'} cannot be read: {first_line(error)}") from error
        runners = load_part_runners(root, manifest, exporter, runtime)
        preprocessor = checkpoints.load_preprocessor(root) if load_preprocessor else None
        return cls(root, manifest, runners, config, generation_config, preprocessor)

    # ── the loop ──

    def _max_size(self, role: str, input_name: str, axis: int) -> int | None:
        """The largest size the part's runtime accepts on ``input_name[axis]``, when it tells (ExecuTorch
        plans memory for the largest size of each input)."""
        name = self.roles.get(role)
        limits = getattr(self.runners.get(name), "input_max_sizes", None) if name else None
        if not limits:
            return None
        names = [i["name"] for i in self.manifest["parts"][name]["inputs"]]
        if input_name not in names or names.index(input_name) >= len(limits):
            return None
        sizes = limits[names.index(input_name)]
        return int(sizes[axis]) if sizes is not None and len(sizes) > axis else None

    def _check_lengths(self, prompt: int, new_tokens: int) -> None:
        """Refuse a prompt (or prompt plus new tokens) longer than the folder's programs take.

        Raises:
            InputError: "prompt of N tokens: this folder was exported for at most M ...".
        """
        hint = "re-export with a larger --max-seq-len" if self.manifest.get("backend") == "executorch" else "re-export"
        longest_prompt = self._max_size("prefill", "input_ids", 1)
        if longest_prompt is not None and prompt > longest_prompt:
            raise InputError(f"prompt of {prompt} tokens: this folder was exported for at most {longest_prompt} ({hint})")
        longest = self._max_size("decode", "attention_mask", 1)
        if longest is not None and prompt + new_tokens - 1 > longest:
            raise InputError(
                f"prompt of {prompt} tokens plus {new_tokens} new tokens needs {prompt + new_tokens - 1} positions: "
                f"this folder was exported for at most {longest} ({hint}, or ask for at most {max(longest - prompt + 1, 0)} new tokens)"
            )

    def _run(self, role: str, inputs: dict[str, Any]) -> list[Any]:
        """Run the part playing ``role``: its first output (logits, or the encoder's states) as a tensor,
        the others (the cache) as tensors, or as ``onnxruntime.OrtValue`` bound to the next step where the
        runtime takes them back as they are (:attr:`io_binding`).

        Raises:
            ArtifactRunError: the runtime failed on the part (a truncated weights file, a kernel error).
        """
        name = self.roles[role]
        runner = self.runners[name]
        bound = self.io_binding and hasattr(runner, "run_bound")
        try:
            if bound:
                # onnxruntime's IOBinding: the cache stays in onnxruntime's memory from step to step
                outputs = runner.run_bound(inputs)
                return [torch.from_numpy(outputs[0].numpy()), *outputs[1:]]
            outputs = runner(inputs)
        except HfExportersError:
            raise
        except Exception as error:  # noqa: BLE001 - the runtime's own failure, named by part and file
            raise ArtifactRunError(
                f"part {name!r} ({self.directory / self.manifest['parts'][name]['file']}) failed in the "
                f"{self.manifest.get('backend')} runtime: {first_line(error)}"
            ) from error
        return [torch.as_tensor(o) for o in outputs]

    def _prepare_config(self, max_new_tokens: int | None, generation_config: Any, overrides: dict[str, Any]) -> Any:
        config = copy.deepcopy(generation_config if generation_config is not None else self.generation_config)
        if max_new_tokens is not None:
            config.max_new_tokens = max_new_tokens
        for key, value in overrides.items():
            setattr(config, key, value)
        if getattr(config, "num_beams", 1) not in (None, 1):
            raise InputError("beam search is not supported by ExportedGenerator (num_beams must be 1)")
        if config.max_new_tokens is None:
            config.max_new_tokens = 20
        if not isinstance(config.max_new_tokens, int) or config.max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be an integer of at least 1, got {config.max_new_tokens!r}")
        return config

    def generate(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int | None = None,
        generation_config: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Generate up to ``max_new_tokens`` tokens.

        Args:
            input_ids: ``(B, T)`` prompt ids (decoder-only: left-padded; encoder-decoder: encoder input).
            attention_mask: ``(B, T)``; all ones when None.
            max_new_tokens: overrides the generation config's.
            generation_config: a ``GenerationConfig`` replacing the folder's.
            **kwargs: overrides of the generation config's fields (``do_sample``, ``temperature``, ``top_k``,
                ``top_p``, ``repetition_penalty``, ``min_new_tokens``, ``eos_token_id``, ...), and other encoder inputs (``input_features (B, F, N)`` for speech models, ``pixel_values
                (B, C, H, W)`` for a vision-language model, whose ``input_ids`` then hold its image tokens).

        Returns:
            ``(B, T + n)`` ids for decoder-only models (prompt then new tokens), ``(B, 1 + n)`` decoder ids
            (start token then new tokens) for encoder-decoder models, as ``generate()`` returns (``(B, n)``
            for models whose ``generate()`` drops the start token, such as Whisper).

        Raises:
            InputError: no input given, an encoder input missing or an unknown one given, beam search
                asked for, or a static cache too short for the request.
        """
        overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in _SAMPLING_KEYS or k in _generation_settings()}
        config = self._prepare_config(max_new_tokens, generation_config, overrides)
        return self._loop(input_ids, attention_mask, config, kwargs)

    def score(self, input_ids: torch.Tensor, continuation: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        """Teacher-forced next-token logits: run the folder's parts as :meth:`generate` does, but feed
        ``continuation``'s tokens instead of the chosen ones, and return the raw logits of every step
        (before any logits processor).

        Args:
            input_ids: ``(B, T)`` prompt ids (decoder-only: left-padded; encoder-decoder: encoder input).
            continuation: ``(B, n)`` the tokens fed after the prompt (decoder-only) or after the decoder
                start token (encoder-decoder), one per step.
            attention_mask: ``(B, T)``; all ones when None.
            **kwargs: other encoder inputs, as :meth:`generate` takes them.

        Returns:
            ``(B, n, V)`` float32 logits; row ``t`` scores the token that follows the prompt and
            ``continuation[:, :t]``. Every step runs: end-of-sequence tokens do not stop it.

        Raises:
            InputError: as :meth:`generate`; ``continuation`` is not ``(B, n)`` with ``n >= 1``.
        """
        _check_token_ids("input_ids", input_ids, self.manifest.get("vocab_size"))
        # an encoder-decoder's vocab_size is its encoder table's; the decoder's may differ (Marian, EncoderDecoderModel)
        _check_token_ids("continuation", continuation, None if self.is_encoder_decoder else self.manifest.get("vocab_size"))
        batch = next((v.shape[0] for v in (input_ids, *kwargs.values()) if isinstance(v, torch.Tensor)), None)
        if continuation.dim() != 2 or continuation.shape[1] < 1 or continuation.shape[0] != batch:
            raise InputError(f"continuation must be (B, n) with B = {batch} and n >= 1, got {tuple(continuation.shape)}")
        config = self._prepare_config(int(continuation.shape[1]), None, {"do_sample": False, "num_beams": 1})
        steps: list[torch.Tensor] = []
        self._loop(input_ids, attention_mask, config, kwargs, forced=continuation.long(), logits_out=steps)
        return torch.stack(steps, dim=1)

    def _loop(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        config: Any,
        kwargs: dict[str, Any],
        forced: torch.Tensor | None = None,
        logits_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The generation loop of :meth:`generate`; with ``forced`` (``(B, n)``), step ``t`` takes
        ``forced[:, t]`` as its token and runs every step; each step's raw logits are appended to ``logits_out``."""
        from transformers.generation.utils import GenerationMixin

        _check_token_ids("input_ids", input_ids, self.manifest.get("vocab_size"))
        if input_ids is not None and input_ids.shape[1] == 0:
            raise InputError("input_ids has no token: the prompt is empty")
        if attention_mask is not None and input_ids is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise InputError(f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}")
        shim = _ProcessorShim(self.config)
        if self.is_encoder_decoder:
            if attention_mask is None and input_ids is not None:  # as documented: all ones
                attention_mask = torch.ones_like(input_ids)
            encoder_inputs = {k: v for k, v in {"input_ids": input_ids, "attention_mask": attention_mask, **kwargs}.items() if v is not None}
            if not encoder_inputs:
                raise InputError("generate() needs the encoder inputs (input_ids or input_features)")
            batch = next(iter(encoder_inputs.values())).shape[0]
        else:
            if input_ids is None:
                raise InputError("generate() needs input_ids (B, T)")
            batch = input_ids.shape[0]
            if "encoder" in self.roles:  # multimodal: the encoder's features go to the prefill step
                prefill_extra = {"features": self._encode(kwargs)}
            elif kwargs:
                raise InputError(f"unexpected inputs {sorted(kwargs)}: this folder's model takes input_ids and attention_mask")
        GenerationMixin._prepare_special_tokens(shim, config, attention_mask is not None, device="cpu", batch_size=batch)
        eos = config._eos_token_tensor
        pad = config._pad_token_tensor

        with torch.no_grad():
            if self.is_encoder_decoder:
                hidden = self._encode(encoder_inputs)
                sequences = torch.full((batch, 1), int(config._decoder_start_token_tensor), dtype=torch.long)
                step_inputs: dict[str, Any] = {"decoder_input_ids": sequences, "encoder_hidden_states": hidden}
                if "attention_mask" in self.decode_inputs and attention_mask is not None:
                    step_inputs["attention_mask"] = attention_mask
                encoder_ids = encoder_inputs.get("input_ids")
            else:
                sequences = input_ids.long()
                mask = attention_mask.long() if attention_mask is not None else torch.ones_like(sequences)
                encoder_ids = None
            # as generate() does: the length limit that length-aware processors read (forced EOS at the end)
            config.max_length = sequences.shape[1] + config.max_new_tokens
            processors = GenerationMixin._get_logits_processor(
                shim,
                config,
                input_ids_seq_length=sequences.shape[1],
                encoder_input_ids=encoder_ids,
                device="cpu",
                model_kwargs={},
            )
            unfinished = torch.ones(batch, dtype=torch.long)
            cache: list[torch.Tensor] = []
            static = self.cache.get("kind") == "static"
            in_program = self.cache.get("kind") == "program"
            if in_program:
                self._check_program_request(sequences, mask, config.max_new_tokens)
            elif not self.is_encoder_decoder and not static:
                self._check_lengths(sequences.shape[1], config.max_new_tokens)
            if static:
                max_len = int(self.cache["max_cache_len"])
                if sequences.shape[1] + config.max_new_tokens - 1 > max_len:
                    raise InputError(
                        f"the static cache holds {max_len} positions; a {sequences.shape[1]}-token prompt with "
                        f"max_new_tokens={config.max_new_tokens} needs {sequences.shape[1] + config.max_new_tokens - 1}"
                    )
            for step in range(config.max_new_tokens):
                if self.is_encoder_decoder:
                    outputs = self._run("prefill" if step == 0 else "decode", {**step_inputs, **({"past_key_values": cache} if step else {})})
                elif static:
                    outputs, static_state = self._static_step(sequences, mask, step, cache)
                elif in_program:
                    # the program holds the cache: the prompt at positions 0..T-1, then each new token at the next one
                    current = sequences if step == 0 else sequences[:, -1:]
                    start = sequences.shape[1] - current.shape[1]
                    outputs = self._run("decode", {"input_ids": current, "cache_position": torch.arange(start, sequences.shape[1])})
                    outputs[0] = outputs[0][:, -1]  # (1, q, V) -> the last position's logits
                else:
                    current = sequences if step == 0 else sequences[:, -1:]
                    feed = {"input_ids": current, "attention_mask": mask}
                    if step:
                        feed["past_key_values"] = cache
                    elif "encoder" in self.roles:
                        feed.update(prefill_extra)
                    outputs = self._run("prefill" if step == 0 else "decode", feed)
                logits, cache = outputs[0].float(), outputs[1:]
                if self.logits_as_sequence:  # (B, 1, V): an ONNX part laid out for onnxruntime-genai
                    logits = logits[:, -1]
                if logits_out is not None:
                    logits_out.append(logits)
                if forced is not None:
                    next_tokens = forced[:, step]
                else:
                    scores = processors(sequences, logits)
                    if config.do_sample:
                        next_tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
                    else:
                        next_tokens = scores.argmax(dim=-1)
                if eos is not None and forced is None:
                    next_tokens = next_tokens * unfinished + pad * (1 - unfinished)
                sequences = torch.cat([sequences, next_tokens[:, None]], dim=1)
                if eos is not None and forced is None:
                    unfinished = unfinished & ~torch.isin(next_tokens, eos)
                    if int(unfinished.max()) == 0:
                        break
                if self.is_encoder_decoder:
                    step_inputs["decoder_input_ids"] = sequences[:, -1:]
                elif not static:
                    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                else:
                    mask = static_state
        if self.is_encoder_decoder and not self.returns_decoder_prompt:
            sequences = sequences[:, 1:]
        return sequences

    def _check_program_request(self, sequences: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> None:
        """Refuse what a program holding its own cache cannot run: a batch other than the one it holds,
        padding (its positions are the tokens' indices), or more positions than it holds.

        Raises:
            InputError: "prompt of N tokens plus M new tokens needs P positions: this folder's program holds
                at most L ...", or the batch or padding refused.
        """
        held = int(self.cache.get("batch_size", 1))
        if sequences.shape[0] != held:
            raise InputError(f"this folder's program holds the cache of a batch of {held}; got a batch of {sequences.shape[0]} (generate one prompt at a time)")
        if int(mask.min()) == 0:
            raise InputError("this folder's program places tokens by their index: a padded prompt (zeros in attention_mask) is not supported")
        limit = int(self.cache["max_cache_len"])
        length = sequences.shape[1]
        if length > limit:
            raise InputError(f"prompt of {length} tokens: this folder's program holds at most {limit} positions (re-export with a larger --max-seq-len)")
        if length + new_tokens - 1 > limit:
            raise InputError(
                f"prompt of {length} tokens plus {new_tokens} new tokens needs {length + new_tokens - 1} positions: this folder's program "
                f"holds at most {limit} (re-export with a larger --max-seq-len, or ask for at most {limit - length + 1} new tokens)"
            )

    def _encode(self, encoder_inputs: dict[str, Any]) -> torch.Tensor:
        part = self.manifest["parts"][self.roles["encoder"]]
        names = [i["name"] for i in part["inputs"]]
        missing = [n for n in names if n not in encoder_inputs]
        if missing:
            raise InputError(f"the encoder takes {names}; missing {missing}")
        unknown = sorted(set(encoder_inputs) - set(names) - {"input_ids", "attention_mask"})
        if unknown:
            raise InputError(f"unexpected inputs {unknown}: the encoder takes {names}")
        extra = part.get("extra", {})
        if not extra.get("per_item"):
            return self._run("encoder", {n: encoder_inputs[n] for n in names})[0]
        # a per-item encoder (a vision tower): one call per image, features concatenated in batch order
        items = encoder_inputs[extra["input"]].shape[0]
        rows = []
        for i in range(items):
            feed = {n: (encoder_inputs[n][i : i + 1] if encoder_inputs[n].dim() and encoder_inputs[n].shape[0] == items else encoder_inputs[n]) for n in names}
            rows.append(self._run("encoder", feed)[0])
        return torch.cat(rows)

    def _static_step(self, sequences: torch.Tensor, mask: torch.Tensor, step: int, cache: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """One static-cache step; ``mask`` is the ``(B, T)`` prompt mask at step 0, the ``(B, M)`` running mask after."""
        max_len = int(self.cache["max_cache_len"])
        if step == 0:
            length = sequences.shape[1]
            full = torch.zeros(sequences.shape[0], max_len, dtype=torch.long)
            full[:, :length] = mask
            shapes = [i for i in self.manifest["parts"][self.roles["decode"]]["inputs"] if i["name"].startswith("past_key_values")]
            cache = [torch.zeros([sequences.shape[0], *s["shape"][1:]], dtype=getattr(torch, s["dtype"])) for s in shapes]
            feed = {"input_ids": sequences, "attention_mask": full, "cache_position": torch.arange(length), "past_key_values": cache}
            position = length
        else:
            position = sequences.shape[1] - 1
            full = mask.clone()
            full[:, position] = 1
            feed = {"input_ids": sequences[:, -1:], "attention_mask": full, "cache_position": torch.tensor([position]), "past_key_values": cache}
            position += 1
        outputs = self._run("prefill" if step == 0 else "decode", feed)
        return outputs, full

    def generate_text(self, prompt: str, max_new_tokens: int = 20, **kwargs: Any) -> tuple[str, torch.Tensor, torch.Tensor]:
        """Tokenize ``prompt`` with the folder's tokenizer, generate, and decode the new tokens.

        Returns:
            ``(text, input_ids (1, T), output ids)``.

        Raises:
            InputError: the folder has no tokenizer.
        """
        tokenizer = getattr(self.preprocessor, "tokenizer", self.preprocessor)
        if tokenizer is None:
            raise InputError(f"{self.directory} has no tokenizer files: give token ids to ExportedGenerator.generate() in Python instead")
        encoded = tokenizer([prompt], return_tensors="pt")
        ids = self.generate(encoded["input_ids"], attention_mask=encoded.get("attention_mask"), max_new_tokens=max_new_tokens, **kwargs)
        new = ids if self.is_encoder_decoder else ids[:, encoded["input_ids"].shape[1] :]
        return tokenizer.decode(new[0], skip_special_tokens=True), encoded["input_ids"], ids
