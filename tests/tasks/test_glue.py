"""Every registered GLUE task yields tokenized examples of its documented text-to-text form (offline)."""
import gin
import pytest
import seqio
import tensorflow_datasets as tfds

import tasks.glue as glue
from t2t.data import postprocessors
from tasks import common
from tests.tasks.task_checks import check_tokenized, offline_tasks, read

# task -> (input start, fields in order, valid targets or None for a number)
EXPECTED = {
    "glue_cola": ("cola sentence: ", ["sentence:"], {"acceptable", "unacceptable"}),
    "glue_sst2": ("sst2 sentence: ", ["sentence:"], {"positive", "negative"}),
    "glue_mrpc": ("mrpc sentence1: ", ["sentence1:", "sentence2:"], {"equivalent", "not_equivalent"}),
    "glue_qqp": ("qqp question1: ", ["question1:", "question2:"], {"duplicate", "not_duplicate"}),
    "glue_stsb": ("stsb sentence1: ", ["sentence1:", "sentence2:"], None),
    "glue_mnli": ("mnli hypothesis: ", ["hypothesis:", "premise:"], {"entailment", "neutral", "contradiction"}),
    "glue_mnli_mismatched": ("mnli hypothesis: ", ["hypothesis:", "premise:"],
                             {"entailment", "neutral", "contradiction"}),
    "glue_qnli": ("qnli question: ", ["question:", "sentence:"], {"entailment", "not_entailment"}),
    "glue_rte": ("rte sentence1: ", ["sentence1:", "sentence2:"], {"entailment", "not_entailment"}),
    "glue_wnli": ("wnli sentence1: ", ["sentence1:", "sentence2:"], {"entailment", "not_entailment"}),
    "glue_ax": ("mnli hypothesis: ", ["hypothesis:", "premise:"], {"entailment", "neutral", "contradiction"}),
}


def test_all_glue_tasks_registered_with_their_splits():
    assert {f"glue_{t.name}" for t in glue.GLUE_TASKS} == set(EXPECTED)
    assert seqio.get_mixture_or_task("glue_mnli").splits == (
        "train", "validation", "test", "validation_mismatched", "test_mismatched")
    assert seqio.get_mixture_or_task("glue_mnli_mismatched").splits == ("validation", "test")
    assert seqio.get_mixture_or_task("glue_ax").splits == ("test",)


def test_label_names_match_the_tfds_builder():
    configs = {c.name: c for c in tfds.builder_cls("glue").BUILDER_CONFIGS}
    for spec in glue.GLUE_TASKS:
        if spec.label_names is not None:
            assert list(spec.label_names) == list(configs[spec.tfds_config].label_classes), spec.name


def test_every_glue_task_yields_documented_examples_offline():
    with offline_tasks() as vocabulary:
        for name, (start, fields, labels) in EXPECTED.items():
            task = seqio.get_mixture_or_task(name)
            # One split per task keeps this fast; the split maps are checked above.
            split = "validation" if "validation" in task.splits else "test"
            for example in read(name, split, limit=1):
                inputs, targets = check_tokenized(example, vocabulary)
                assert inputs.startswith(start), (name, inputs)
                positions = [inputs.find(f" {f} ") for f in fields]
                assert -1 not in positions and positions == sorted(positions), (name, inputs)
                if split.startswith("test") and name != "glue_ax":
                    continue  # mock test labels may be anything; real ones are -1 -> "<unk>"
                if labels is None:
                    value = float(targets)
                    assert round(value * 5) == pytest.approx(value * 5), targets
                    assert len(targets.split(".")[-1]) == 1
                else:
                    assert targets in labels, (name, targets)
                    assert task.postprocess_fn(targets, example=example, is_target=True) == targets


def test_metrics_and_postprocessing_run_on_a_task():
    task = seqio.get_mixture_or_task("glue_mrpc")
    targets = ["equivalent", "not_equivalent", "equivalent"]
    predictions = [task.postprocess_fn(p) for p in ["equivalent", "equivalent", "dunno"]]
    assert predictions[2] == postprocessors.INVALID_LABEL
    results = {}
    for fn in task.metric_fns:
        results.update(fn(targets, predictions))
    # tp 1, fp 1, fn 1 -> F1 1/2; 1 of 3 right.
    assert results == {"f1": pytest.approx(50.0), "accuracy": pytest.approx(100 / 3)}
    stsb = seqio.get_mixture_or_task("glue_stsb")
    assert [stsb.postprocess_fn(s) for s in ["3.2", "x"]] == [3.2, postprocessors.INVALID_SCORE]


def test_vocabulary_is_resolved_only_when_used_and_follows_gin():
    # Registration used a deferred vocabulary; a bogus path only fails once tokens are needed.
    features = seqio.get_mixture_or_task("glue_cola").output_features
    assert isinstance(features["targets"].vocabulary, common.DeferredVocabulary)
    gin.bind_parameter("task_vocabulary.spm_path", "/nonexistent/sentencepiece.model")
    try:
        glue.register()  # still fine: nothing read
        with pytest.raises(Exception, match="nonexistent"):
            features["targets"].vocabulary.encode("hello")
    finally:
        gin.clear_config()


def test_register_with_a_fixed_vocabulary():
    from t2t.data import vocabularies
    vocabulary = vocabularies.bbc_vocabulary()
    try:
        tasks = glue.register(vocabulary=vocabulary)
        assert all(t.output_features["inputs"].vocabulary is vocabulary for t in tasks)
        assert seqio.get_mixture_or_task("glue_rte").output_features["targets"].vocabulary is vocabulary
    finally:
        glue.register()
    assert isinstance(seqio.get_mixture_or_task("glue_rte").output_features["targets"].vocabulary,
                      common.DeferredVocabulary)
