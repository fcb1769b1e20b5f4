"""Shared checks for the TFDS-backed task tests: read registered tasks offline under mock data."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import gin
import seqio
import tensorflow_datasets as tfds

from t2t.data import vocabularies

SEQUENCE_LENGTH = {"inputs": 64, "targets": 16}


@contextlib.contextmanager
def offline_tasks(num_examples: int = 3) -> Iterator[seqio.Vocabulary]:
    """TFDS serves random examples of each dataset's real feature spec (nothing is downloaded) and
    the tasks' deferred vocabulary resolves to the local BBC SentencePiece model."""
    vocabulary = vocabularies.bbc_vocabulary()
    gin.bind_parameter("task_vocabulary.vocabulary", vocabulary)
    try:
        with tfds.testing.mock_data(num_examples=num_examples, policy=tfds.testing.MockPolicy.USE_CODE):
            yield vocabulary
    finally:
        gin.clear_config()


def read(task_name: str, split: str, limit: int = 2) -> list[dict]:
    """The first ``limit`` tokenized examples of a registered task's split (pretokenized copies kept)."""
    task = seqio.get_mixture_or_task(task_name)
    # try_in_mem_cache=False: mock data has no split sizes for seqio to look at.
    dataset = task.get_dataset(SEQUENCE_LENGTH, split=split, shuffle=False, seed=0, try_in_mem_cache=False)
    examples = list(dataset.take(limit).as_numpy_iterator())
    assert examples, f"{task_name}/{split} yielded no examples"
    return examples


def check_tokenized(example: dict, vocabulary: seqio.Vocabulary) -> tuple[str, str]:
    """Asserts the token features decode back to (a prefix of) the text; returns (inputs, targets)."""
    inputs = example["inputs_pretokenized"].decode()
    targets = example["targets_pretokenized"].decode()
    assert example["targets"][-1] == vocabulary.eos_id or len(example["targets"]) == SEQUENCE_LENGTH["targets"]
    decoded = vocabulary.decode([int(t) for t in example["inputs"] if t != vocabulary.eos_id])
    assert " ".join(inputs.split())[:20] == " ".join(decoded.split())[:20]
    return inputs, targets
