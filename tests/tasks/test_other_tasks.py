"""SQuAD, CNN/DM, WMT and C4 tasks yield examples of their documented form (offline, TFDS mock data)."""
import pytest
import seqio

import tasks.c4 as c4
import tasks.cnn_dailymail  # noqa: F401  (registers cnn_dailymail)
import tasks.squad  # noqa: F401  (registers squad)
import tasks.wmt as wmt
from tests.tasks.task_checks import check_tokenized, offline_tasks, read

TEXT_TASKS = {
    "squad": "question: ",
    "cnn_dailymail": "summarize: ",
    "wmt_t2t_ende": "translate English to German: ",
    "wmt15_enfr": "translate English to French: ",
    "wmt16_enro": "translate English to Romanian: ",
}


def test_text_tasks_yield_documented_examples_offline():
    with offline_tasks() as vocabulary:
        for name, start in TEXT_TASKS.items():
            example = read(name, "validation", limit=1)[0]
            inputs, targets = check_tokenized(example, vocabulary)
            assert inputs.startswith(start), (name, inputs)
            assert targets, name
        squad = read("squad", "validation", limit=1)[0]
        assert " context: " in squad["inputs_pretokenized"].decode()
        assert squad["targets_pretokenized"] == squad["answers"][0]
        task = seqio.get_mixture_or_task("squad")
        assert task.postprocess_fn("x", example=squad, is_target=True) == [a.decode() for a in squad["answers"]]


def test_wmt_enfr_validates_on_newstest2014():
    splits = wmt.WMT_SPLITS["wmt15_enfr"]
    assert splits["validation"].dataset.startswith("wmt14_translate/fr-en") and splits["validation"].split == "test"
    assert splits["train"].dataset.startswith("wmt15_translate/fr-en")


def test_metrics_of_generation_tasks_run():
    cnn = seqio.get_mixture_or_task("cnn_dailymail")
    ende = seqio.get_mixture_or_task("wmt_t2t_ende")
    assert set(cnn.metric_fns[0](["the cat sat ."], [cnn.postprocess_fn(" the cat sat . ")])) == {
        "rouge1", "rouge2", "rougeL", "rougeLsum"}
    assert ende.metric_fns[0](["Das ist gut ."], ["Das ist gut ."]) == {"bleu": pytest.approx(100.0)}


def test_c4_objective_tasks_yield_token_examples_offline():
    names = [f"c4_{o}" for o in c4.available_objectives()]
    assert "c4_span_corruption" in names
    with offline_tasks(num_examples=4) as vocabulary:
        sentinel_floor = vocabulary.vocab_size - vocabulary.extra_ids
        for name in names:
            example = read(name, "train", limit=1)[0]
            assert example["targets"].size > 0, name
            assert example["targets"][-1] == vocabulary.eos_id or example["targets"].size == 16, name
            if name == "c4_span_corruption":
                assert (example["inputs"] >= sentinel_floor).any()   # spans replaced by sentinels
                assert example["targets"][0] >= sentinel_floor       # targets open with a sentinel
