"""Accuracy of a quantized generation folder against the eager model, over a fixed prompt set.

The reference is the eager model in the checkpoint's dtype, the dtype the parts are exported in (float32
for a float32 checkpoint; ``reference_dtype`` in the figures).

Element parity does not hold for int8 or int4 weights; what a user of a generative model keeps is which
token comes next and how sure the model is of it. For every prompt (:data:`PROMPTS`, tokenized by the
checkpoint's tokenizer, one prompt at a time) the eager model picks :data:`NEW_TOKENS` tokens
greedily (the argmax of its raw logits), and the folder is run teacher-forced on the same tokens
(:meth:`ExportedGenerator.score`), so both score the same positions: the token after the prompt and after
each of the first ``NEW_TOKENS - 1`` chosen tokens. The prefill part scores the first position and the
decode part the others, so both parts are measured. Over all positions:

- ``top1_agreement``: the fraction where the folder's most likely next token is eager's;
- ``mean_kl`` / ``max_kl``: the Kullback-Leibler divergence ``KL(p_eager || p_folder)`` of the next-token
  distributions (softmax of the logits), in nats per position: the mean and the worst position.

Thresholds (:data:`THRESHOLDS`): ``top1_agreement`` >= 0.9 and ``mean_kl`` <= 0.1 nats. Below either,
:func:`check_generation_accuracy` raises ``ParityError``, as an element parity failure does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import InputError, ParityError
from ..runtime.compare import evaluation_mode
from ..runtime.embedding_accuracy import SENTENCES
from .generator import ExportedGenerator

#: the fixed prompt set: the 40 English sentences shipped for the embedding check (varied length and topic)
PROMPTS: Sequence[str] = tuple(SENTENCES)
#: positions scored per prompt (the prefill's next token, then one per decode step)
NEW_TOKENS = 4
#: the floors (``top1_agreement``) and ceilings (``mean_kl``, nats) :func:`check_generation_accuracy` enforces
THRESHOLDS = {"top1_agreement": 0.9, "mean_kl": 0.1}


@dataclasses.dataclass
class GenerationAccuracy:
    """The figures a quantized folder is judged on (see the module docstring)."""

    top1_agreement: float
    mean_kl: float
    max_kl: float
    positions: int
    prompts: int
    new_tokens: int
    #: the eager model's dtype: the checkpoint's (float32 unless it was saved in another)
    reference_dtype: str = "float32"

    @property
    def ok(self) -> bool:
        return self.top1_agreement >= THRESHOLDS["top1_agreement"] and self.mean_kl <= THRESHOLDS["mean_kl"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": "next-token agreement and KL divergence against eager in the checkpoint's dtype (teacher-forced)",
            **{k: round(v, 6) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()},
            "thresholds": dict(THRESHOLDS),
            "ok": self.ok,
        }


def prompt_ids(tokenizer: Any, prompts: Sequence[str] = PROMPTS) -> list[torch.Tensor]:
    """Each prompt tokenized alone: ``(1, T)`` int64 ids, prompts that tokenize to nothing left out.

    Raises:
        InputError: no tokenizer, or no prompt gives a token.
    """
    if tokenizer is None:
        raise InputError("a quantized generation folder is checked on real prompts: the checkpoint needs a tokenizer")
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    ids = [tokenizer([text], return_tensors="pt")["input_ids"].long() for text in prompts]
    ids = [t for t in ids if t.shape[-1] > 0]
    if not ids:
        raise InputError("the tokenizer gives no token for any prompt of the accuracy check")
    return ids


def _eager_steps(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, start: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager's greedy continuation ``(1, n)`` of ``ids`` and its logits ``(1, n, V)`` at each step (no cache:
    the whole sequence each step). Encoder-decoder models (``start`` is the decoder start token) take
    ``ids`` as the encoder input and score the decoder sequence."""
    chosen: list[torch.Tensor] = []
    logits: list[torch.Tensor] = []
    with torch.no_grad():
        for _ in range(new_tokens):
            so_far = torch.cat(chosen, dim=1) if chosen else ids.new_zeros((1, 0))
            if start is None:
                sequence = torch.cat([ids, so_far], dim=1)
                out = model(input_ids=sequence, attention_mask=torch.ones_like(sequence), use_cache=False)
            else:
                decoder = torch.cat([ids.new_full((1, 1), start), so_far], dim=1)
                out = model(input_ids=ids, attention_mask=torch.ones_like(ids), decoder_input_ids=decoder, use_cache=False)
            step = out.logits[:, -1].float()
            logits.append(step)
            chosen.append(step.argmax(-1, keepdim=True))
    return torch.cat(chosen, dim=1), torch.stack(logits, dim=1)


def measure(model: torch.nn.Module, generator: ExportedGenerator, prompts: Sequence[torch.Tensor], new_tokens: int = NEW_TOKENS) -> GenerationAccuracy:
    """Score ``generator``'s folder against ``model`` (eager, the checkpoint's dtype) on ``prompts`` (each ``(1, T)`` ids).

    Raises:
        InputError: the folder's model takes other inputs than token ids (an image or audio encoder), or
            an encoder-decoder's generation config names no decoder start token.
        ArtifactRunError: the runtime failed on a part.
    """
    if "encoder" in generator.roles and not generator.is_encoder_decoder:
        raise InputError("the accuracy check runs text prompts; this folder's prefill takes an encoder's image or audio features")
    start = None
    if generator.is_encoder_decoder:
        encoder_inputs = [i["name"] for i in generator.manifest["parts"][generator.roles["encoder"]]["inputs"]]
        if "input_ids" not in encoder_inputs:
            raise InputError(f"the accuracy check runs text prompts; this folder's encoder takes {encoder_inputs}")
        # the token the generator starts the decoder with (``_prepare_special_tokens``: the start token, else BOS)
        start = generator.generation_config.decoder_start_token_id
        if start is None:
            start = generator.generation_config.bos_token_id
        if start is None:
            raise InputError("the accuracy check needs the decoder start token: the generation config has no decoder_start_token_id or bos_token_id")
        start = int(start[0] if isinstance(start, (list, tuple)) else start)
    agree = 0
    positions = 0
    kl_sum = 0.0
    kl_max = 0.0
    with evaluation_mode(model):  # eager as the artifact was traced; the caller's training flags come back
        for ids in prompts:
            chosen, expected = _eager_steps(model, ids, new_tokens, start)
            actual = generator.score(ids, chosen, attention_mask=torch.ones_like(ids)).float()
            log_p = torch.log_softmax(expected, dim=-1)
            log_q = torch.log_softmax(actual, dim=-1)
            # a token eager gives no probability adds nothing (0 * log 0 is 0, not NaN)
            kl = torch.where(torch.isfinite(log_p), log_p.exp() * (log_p - log_q), 0.0).sum(-1).clamp_min(0.0).flatten()
            agree += int((actual.argmax(-1) == expected.argmax(-1)).sum())
            positions += kl.numel()
            kl_sum += float(kl.sum())
            kl_max = max(kl_max, float(kl.max()))
    return GenerationAccuracy(
        top1_agreement=agree / positions, mean_kl=kl_sum / positions, max_kl=kl_max, positions=positions, prompts=len(prompts), new_tokens=new_tokens,
        reference_dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
    )


def check_generation_accuracy(model: torch.nn.Module, generator: ExportedGenerator, prompts: Sequence[torch.Tensor], new_tokens: int = NEW_TOKENS) -> GenerationAccuracy:
    """:func:`measure`, then enforce :data:`THRESHOLDS`.

    Raises:
        ParityError: "next-token accuracy below threshold: top-1 agreement A (floor 0.9), mean KL K nats
            (ceiling 0.1) over N positions of P prompts"; and as :func:`measure`.
    """
    accuracy = measure(model, generator, prompts, new_tokens)
    if not accuracy.ok:
        raise ParityError(
            f"next-token accuracy below threshold: top-1 agreement {accuracy.top1_agreement:.3f} (floor {THRESHOLDS['top1_agreement']}), "
            f"mean KL {accuracy.mean_kl:.4f} nats (ceiling {THRESHOLDS['mean_kl']}) over {accuracy.positions} positions of {accuracy.prompts} prompts"
        )
    return accuracy
