"""Every registered SuperGLUE task yields tokenized examples of its documented form (offline)."""
import numpy as np
import pytest
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds

import tasks.superglue as superglue
from t2t.data import metrics, postprocessors
from tests.tasks.task_checks import check_tokenized, offline_tasks, read

BOOL = {"False", "True"}
RTE = {"entailment", "not_entailment"}
# task -> (input start, later field names in order, valid targets or None for free text)
EXPECTED = {
    "super_glue_boolq": ("boolq passage: ", ["question:"], BOOL),
    "super_glue_cb": ("cb hypothesis: ", ["premise:"], {"entailment", "contradiction", "neutral"}),
    "super_glue_copa": ("copa choice1: ", ["choice2:", "premise:", "question:"], BOOL),
    "super_glue_multirc": ("multirc question: ", ["answer:", "paragraph:"], BOOL),
    "super_glue_record": ("record query: ", ["entities:", "passage:"], None),
    "super_glue_rte": ("rte hypothesis: ", ["premise:"], RTE),
    "super_glue_wic": ("wic sentence1: ", ["sentence2:", "word:"], BOOL),
    "super_glue_wsc": ("wsc: ", [], None),
    "super_glue_axb": ("rte sentence1: ", ["sentence2:"], RTE),
    "super_glue_axg": ("rte hypothesis: ", ["premise:"], RTE),
}


def test_label_names_match_the_tfds_builder():
    configs = {c.name: c for c in tfds.builder_cls("super_glue").BUILDER_CONFIGS}
    assert list(superglue.CB_LABELS) == list(configs["cb"].label_classes)
    assert list(superglue.RTE_LABELS) == list(configs["rte"].label_classes)
    for name in ("boolq", "multirc", "wic", "wsc.fixed"):
        assert list(superglue.BOOLEAN_LABELS) == list(configs[name].label_classes), name


def test_every_superglue_task_yields_documented_examples_offline():
    assert {f"super_glue_{t.name}" for t in superglue.SUPER_GLUE_TASKS} == set(EXPECTED)
    with offline_tasks() as vocabulary:
        for name, (start, fields, labels) in EXPECTED.items():
            task = seqio.get_mixture_or_task(name)
            split = "validation" if "validation" in task.splits else "test"
            for example in read(name, split, limit=1):
                inputs, targets = check_tokenized(example, vocabulary)
                assert inputs.startswith(start), (name, inputs)
                positions = [inputs.find(f" {f} ") for f in fields]
                assert -1 not in positions and positions == sorted(positions), (name, inputs)
                if labels is not None:
                    assert targets in labels, (name, targets)
            if name == "super_glue_multirc":
                target = task.postprocess_fn(targets, example=example, is_target=True)
                assert target == {"group": (int(example["idx/paragraph"]), int(example["idx/question"])),
                                  "value": targets}
            if name == "super_glue_wsc":
                assert inputs.count("*") == 2
                assert targets == example["targets_pretokenized"].decode()
                assert task.postprocess_fn(targets, example=example) == "True"


def test_wsc_and_record_training_splits_are_transformed_offline():
    with offline_tasks(num_examples=8):
        wsc_train = read("super_glue_wsc", "train", limit=8)
        wsc_validation = read("super_glue_wsc", "validation", limit=8)
        assert all(e["label"] == 1 for e in wsc_train)
        assert len(wsc_train) < len(wsc_validation)  # the mock split has label-0 examples too
        for example in read("super_glue_record", "train", limit=8):
            assert list(example["answers"]) == [example["targets_pretokenized"]]
        validation = read("super_glue_record", "validation", limit=2)
        assert all(example["targets_pretokenized"] == example["answers"][0] for example in validation)


def test_keep_referent_examples_on_hand_written_data():
    data = tf.data.Dataset.from_tensor_slices({"label": np.array([1, 0, 1, -1]), "idx": np.arange(4)})
    assert [int(x["idx"]) for x in superglue.keep_referent_examples(data)] == [0, 2]


def test_cb_and_wsc_metrics_through_the_task():
    cb = seqio.get_mixture_or_task("super_glue_cb")
    predictions = [cb.postprocess_fn(p) for p in ["entailment", "neutral", "maybe"]]
    targets = ["entailment", "contradiction", "neutral"]
    results = {}
    for fn in cb.metric_fns:
        results.update(fn(targets, predictions))
    # entailment F1 1; contradiction 0 (fn 1); neutral tp 0 fp 1 fn 1 -> 0. Macro 1/3; accuracy 1/3.
    assert results == {"macro_f1": pytest.approx(100 / 3), "accuracy": pytest.approx(100 / 3)}
    wsc = seqio.get_mixture_or_task("super_glue_wsc")
    examples = [{"label": 1, "targets_pretokenized": b"the stable"},
                {"label": 0, "targets_pretokenized": b"the yard"}]
    outputs = ["stable", "stable"]
    targets = [wsc.postprocess_fn("", example=e, is_target=True) for e in examples]
    predictions = [wsc.postprocess_fn(o, example=e) for o, e in zip(outputs, examples)]
    assert targets == ["True", "False"] and predictions == ["True", "False"]
    assert metrics.accuracy(targets, predictions) == {"accuracy": 100.0}
    assert postprocessors.INVALID_LABEL not in predictions
