"""Accuracy of a quantized sentence-embedding artifact against the float32 eager model, on real sentences.

Element parity does not hold for an int8 model; what a user of a sentence encoder keeps is the
direction of each sentence's embedding and which sentences end up nearest to each other. For every
sentence of :data:`SENTENCES` both models give the first output (``last_hidden_state``, shape
(batch, tokens, hidden)); it is mean-pooled over the attention mask into one vector per sentence
(as sentence-transformers pools all-MiniLM-L6-v2), and:

- ``min_cosine`` / ``mean_cosine``: cosine similarity between the artifact's and eager's vector of
  each sentence (the worst one and the mean);
- ``neighbour_agreement``: the fraction of sentences whose nearest other sentence (cosine) is the same
  with the artifact's vectors as with eager's.

Thresholds (:data:`THRESHOLDS`): ``min_cosine`` >= 0.98, ``mean_cosine`` >= 0.99,
``neighbour_agreement`` >= 0.9. Below any of them :func:`check_embedding_accuracy` raises
``ParityError``, as an element parity failure does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import ParityError

#: 40 English sentences of varied length and topic, in near-pairs (paraphrases, shared topics), so
#: that nearest-neighbour retrieval over the set has right answers
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A woman is holding an infant in her arms.",
    "A man is riding a horse.",
    "A person rides a brown horse along the beach.",
    "Two children are playing football in the park.",
    "Kids kick a ball around on the grass after school.",
    "The stock market fell sharply after the interest rate announcement.",
    "Shares dropped when the central bank raised rates again.",
    "It rained all day, so the picnic was moved indoors.",
    "Heavy rain forced the outdoor party into the community hall.",
    "She is learning to play the violin.",
    "He practises the cello for an hour every evening.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Mix the flour, sugar and butter before adding the eggs.",
    "The train to Edinburgh was delayed by forty minutes.",
    "Our flight was cancelled because of the storm.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar and oxygen.",
    "Plants use light energy to make glucose from carbon dioxide.",
    "The new phone has a larger screen and a faster processor.",
    "This laptop's battery lasts more than twelve hours.",
    "Please remember to lock the door when you leave.",
    "Don't forget your keys on the way out.",
    "The museum opens at nine and closes at five on weekdays.",
    "Visitors can see the exhibition from morning until late afternoon.",
    "A cat is sleeping on the warm windowsill.",
    "The dog barked at the postman all morning.",
    "The committee approved the budget for next year's road repairs.",
    "City council voted to fund the bridge renovation.",
    "Regular exercise lowers the risk of heart disease.",
    "Walking thirty minutes a day keeps the heart healthy.",
    "The novel follows a detective searching for a missing painting in Venice.",
    "In the film, a thief plans to steal a famous diamond from a museum.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "At high altitude, water boils at a lower temperature.",
    "The software update fixed the crash on startup.",
    "After installing the patch, the application no longer freezes.",
    "Which of these two exports is faster on a small CPU?",
    "Exported models should give the same numbers as eager PyTorch.",
]

#: the floors below which :func:`check_embedding_accuracy` fails
THRESHOLDS = {"min_cosine": 0.98, "mean_cosine": 0.99, "neighbour_agreement": 0.9}


@dataclasses.dataclass
class EmbeddingAccuracy:
    """Agreement of an artifact's mean-pooled sentence embeddings with eager's over :data:`SENTENCES`."""

    sentences: int
    min_cosine: float
    mean_cosine: float
    neighbour_agreement: float
    thresholds: dict[str, float]

    @property
    def ok(self) -> bool:
        return all(getattr(self, key) >= floor for key, floor in self.thresholds.items())

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"ok": self.ok}


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(batch, tokens, hidden) and a (batch, tokens) mask -> (batch, hidden): the mean over unmasked tokens."""
    weights = mask.astype(np.float64)[..., None]
    return (hidden.astype(np.float64) * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)


def nearest_neighbours(vectors: np.ndarray) -> np.ndarray:
    """Index of each row's nearest other row by cosine similarity."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    return similarity.argmax(1)


def sentence_batches(tokenizer: Any, accepted: set[str] | None, batch: int = 8, length: int | None = None) -> list[dict[str, torch.Tensor]]:
    """:data:`SENTENCES` tokenized in batches of ``batch``, padded to the longest (or to ``length``,
    truncated, for an artifact of static shapes); only the inputs in ``accepted`` (None: all)."""
    out = []
    for start in range(0, len(SENTENCES), batch):
        chunk = SENTENCES[start : start + batch]
        chunk = chunk + [chunk[-1]] * (batch - len(chunk))
        padding: Any = "max_length" if length else True
        encoded = dict(tokenizer(chunk, padding=padding, truncation=bool(length), max_length=length, return_tensors="pt"))
        out.append({k: v for k, v in encoded.items() if accepted is None or k in accepted})
    return out


def embedding_accuracy(
    model: torch.nn.Module, run: Callable[[dict[str, Any]], Sequence[Any]], batches: Sequence[dict[str, torch.Tensor]]
) -> EmbeddingAccuracy:
    """Compare the artifact (``run(inputs) -> outputs``, first output (batch, tokens, hidden)) with the
    float32 eager ``model`` on ``batches`` (from :func:`sentence_batches`; rows past the sentences are dropped)."""
    ours, eager = [], []
    for inputs in batches:
        mask = inputs["attention_mask"].numpy() if "attention_mask" in inputs else np.ones(inputs["input_ids"].shape)
        with torch.no_grad():
            reference = model(**inputs)[0].float().numpy()
        ours.append(mean_pool(np.asarray(run(inputs)[0], dtype=np.float32), mask))
        eager.append(mean_pool(reference, mask))
    count = len(SENTENCES)
    a, b = np.concatenate(ours)[:count], np.concatenate(eager)[:count]
    cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    agreement = float((nearest_neighbours(a) == nearest_neighbours(b)).mean())
    return EmbeddingAccuracy(count, round(float(cosine.min()), 6), round(float(cosine.mean()), 6), round(agreement, 4), dict(THRESHOLDS))


def check_embedding_accuracy(model: torch.nn.Module, run: Callable[[dict[str, Any]], Sequence[Any]], batches: Sequence[dict[str, torch.Tensor]]) -> EmbeddingAccuracy:
    """:func:`embedding_accuracy`, raising when a measure is below its threshold.

    Raises:
        ParityError: a measure below :data:`THRESHOLDS` (the message gives every measure and floor).
    """
    accuracy = embedding_accuracy(model, run, batches)
    if not accuracy.ok:
        low = ", ".join(f"{k} {getattr(accuracy, k):.4f} < {v}" for k, v in THRESHOLDS.items() if getattr(accuracy, k) < v)
        raise ParityError(f"the quantized artifact's sentence embeddings differ from eager float32 over {accuracy.sentences} sentences: {low}")
    return accuracy


__all__ = ["SENTENCES", "THRESHOLDS", "EmbeddingAccuracy", "check_embedding_accuracy", "embedding_accuracy", "mean_pool", "nearest_neighbours", "sentence_batches"]
