"""A checkpoint records its vocabulary; resuming, fine-tuning, eval and infer refuse another one.

Two SentencePiece models of the same size (trained here on different text, in well under a
second) have the same class, size and extra ids: only the model hash tells them apart, and every
parameter shape matches -- the case a shape check cannot catch.
"""
import io
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from t2t.data import vocabularies
from t2t.training import checkpoints, input_state, warm_start
from t2t.training.partitioning import Partitioner

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import toy  # noqa: E402  pylint: disable=g-import-not-at-top


def _sentencepiece(path, words):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  model = io.BytesIO()
  lines = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=30,
                                 model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                 minloglevel=2)
  path.write_bytes(model.getvalue())
  return seqio.SentencePieceVocabulary(str(path), extra_ids=0)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
  d = tmp_path_factory.mktemp("sp")
  a = _sentencepiece(d / "a.model", "the cat sat on a mat while dogs ran over hills far away".split())
  b = _sentencepiece(d / "b.model", "prices rose as markets fell and banks lent money to firms".split())
  return a, b, d


def _tree():
  return {"embed": jnp.arange(12, dtype=jnp.float32).reshape(3, 4), "head": jnp.ones((4,))}


def _shardings(tree):
  return jax.tree.map(lambda _: Partitioner().replicated, tree)


def _record(vocab):
  return {"inputs": vocabularies.fingerprint(vocab), "targets": vocabularies.fingerprint(vocab)}


def test_fingerprint_tells_same_sized_models_apart(two_models):
  a, b, d = two_models
  fa, fb = vocabularies.fingerprint(a), vocabularies.fingerprint(b)
  assert fa["class"] == fb["class"] == "SentencePieceVocabulary"
  assert fa["size"] == fb["size"] == 30 and fa["extra_ids"] == fb["extra_ids"] == 0
  assert fa["sentencepiece_sha256"] != fb["sentencepiece_sha256"]
  assert len(fa["sentencepiece_sha256"]) == 16
  assert vocabularies.fingerprint(seqio.SentencePieceVocabulary(str(d / "a.model"))) == fa
  with_extra = vocabularies.fingerprint(seqio.SentencePieceVocabulary(str(d / "a.model"), 5))
  assert with_extra["size"] == 35 and with_extra["extra_ids"] == 5
  assert vocabularies.fingerprint(toy.VOCAB) == {"class": "PassThroughVocabulary", "size": 64,
                                                 "extra_ids": 0}
  # The model file's own bytes are hashed (not seqio's re-serialised copy with the extra ids).
  import hashlib  # pylint: disable=g-import-not-at-top
  assert fa["sentencepiece_sha256"] == hashlib.sha256((d / "a.model").read_bytes()).hexdigest()[:16]
  forward = vocabularies.fingerprint(seqio.SentencePieceVocabulary(str(d / "a.model"), 5,
                                                                   reverse_extra_ids=False))
  assert forward == {**with_extra, "reverse_extra_ids": False}
  assert "extra ids in forward order" in vocabularies.describe(forward)


def test_run_meta_records_the_task_vocabulary_and_a_resume_checks_it(two_models):
  a, b, _ = two_models
  toy.register()
  meta = input_state.run_meta(toy.TASK, 8, toy.LENGTHS, True, False)
  assert meta["vocabulary"] == {"inputs": vocabularies.fingerprint(toy.VOCAB),
                                "targets": vocabularies.fingerprint(toy.VOCAB)}
  assert "vocabulary" not in input_state.run_meta("not_registered", 8, toy.LENGTHS, True, False)
  saved = input_state.run_meta("t", 8, toy.LENGTHS, True, False, vocabulary=_record(a))
  input_state.check_resumable(saved, dict(saved), "dir")
  now = input_state.run_meta("t", 8, toy.LENGTHS, True, False, vocabulary=_record(b))
  fa, fb = (vocabularies.fingerprint(v)["sentencepiece_sha256"] for v in (a, b))
  with pytest.raises(input_state.ResumeMismatchError, match=(
      rf"Cannot resume the run in dir: .*the vocabulary changed \(inputs: SentencePieceVocabulary "
      rf"\(30 ids, 0 extra ids, sentencepiece sha256 {fa}\) in the checkpoint, "
      rf"SentencePieceVocabulary \(30 ids, 0 extra ids, sentencepiece sha256 {fb}\) now; "
      r"targets: ")):
    input_state.check_resumable(saved, now, "dir")


def test_load_and_restore_refuse_another_vocabulary(two_models, tmp_path):
  a, b, _ = two_models
  ckpt = checkpoints.Checkpointer(str(tmp_path / "run"))
  ckpt.save(3, _tree(), {}, {"vocabulary": _record(a)})
  ckpt.close()
  old = checkpoints.Checkpointer(str(tmp_path / "old"))  # written before t2t recorded it
  old.save(1, _tree(), {}, {"batches_consumed": 1})
  old.close()
  tree, shardings = _tree(), _shardings(_tree())
  where = f"{tmp_path}/run/checkpoint_3"
  params, step = checkpoints.load_params(str(tmp_path / "run"), tree, shardings, _record(a))
  assert step == 3
  np.testing.assert_array_equal(params["embed"], tree["embed"])
  checkpoints.load_params(str(tmp_path / "run"), tree, shardings)  # no vocabulary: unchecked
  checkpoints.load_params(str(tmp_path / "old"), tree, shardings, _record(b))  # no record
  message = (rf"The checkpoint at {where} was trained with another vocabulary: inputs: "
             r"SentencePieceVocabulary .* in the checkpoint, SentencePieceVocabulary .* now")
  with pytest.raises(checkpoints.VocabularyMismatchError, match=message):
    checkpoints.load_params(str(tmp_path / "run"), tree, shardings, _record(b))
  with pytest.raises(checkpoints.VocabularyMismatchError, match=message):
    warm_start.restore_params(str(tmp_path / "run"), tree, shardings, _tree, vocabulary=_record(b))
  # A partial restore with a new head still loads the embedding: still refused.
  with pytest.raises(checkpoints.VocabularyMismatchError, match=message):
    warm_start.restore_params(str(tmp_path / "run"), tree, shardings, _tree, partial=True,
                               reinitialize=["head"], vocabulary=_record(b))
  params, _, plan = warm_start.restore_params(str(tmp_path / "run"), tree, shardings, _tree,
                                               partial=True, reinitialize=["head"],
                                               vocabulary=_record(a))
  assert plan.loaded == ("embed",)


def test_eval_refuses_a_checkpoint_of_another_vocabulary(two_models, tmp_path):
  from t2t import eval as eval_lib  # pylint: disable=g-import-not-at-top
  a, _, _ = two_models
  toy.register()
  ckpt = checkpoints.Checkpointer(str(tmp_path / "run"))
  ckpt.save(5, _tree(), {}, {"vocabulary": _record(a)})  # checked before any parameter shape
  ckpt.close()
  with pytest.raises(checkpoints.VocabularyMismatchError, match=(
      r"checkpoint_5 was trained with another vocabulary: inputs: SentencePieceVocabulary "
      r"\(30 ids, .*\) in the checkpoint, PassThroughVocabulary \(64 ids, 0 extra ids\) now")):
    eval_lib.evaluate(model=toy.model(), mixture_or_task_name=toy.TASK,
                      checkpoint_path=str(tmp_path / "run"), output_dir=str(tmp_path / "eval"),
                      task_feature_lengths=toy.LENGTHS, num_examples=4, batch_size=4)


def test_infer_refuses_a_checkpoint_of_another_vocabulary(two_models, tmp_path):
  from t2t import infer  # pylint: disable=g-import-not-at-top
  _, b, _ = two_models
  ckpt = checkpoints.Checkpointer(str(tmp_path / "run"))
  ckpt.save(2, _tree(), {}, {"vocabulary": _record(b)})
  ckpt.close()
  (tmp_path / "inputs.txt").write_text("5 6 7\n8 9\n")
  with pytest.raises(checkpoints.VocabularyMismatchError, match=(
      r"checkpoint_2 was trained with another vocabulary: inputs: SentencePieceVocabulary "
      r"\(30 ids, .*\) in the checkpoint, PassThroughVocabulary \(64 ids, 0 extra ids\) now")):
    infer.infer(model=toy.model(), checkpoint_path=str(tmp_path / "run"),
                output_dir=str(tmp_path / "out"), task_feature_lengths=toy.LENGTHS,
                input_file=str(tmp_path / "inputs.txt"), batch_size=2)
  assert not (tmp_path / "out" / "inputs.jsonl").exists()


def test_a_mixture_of_tasks_with_other_vocabularies_is_refused(two_models, tmp_path):
  # seqio's Mixture.output_features are its first task's: eval once scored the second task's
  # predictions, read with the wrong ids, without a word (found by an audit).
  from t2t import eval as eval_lib  # pylint: disable=g-import-not-at-top
  a, b, _ = two_models
  toy.register()
  source = seqio.get_mixture_or_task(toy.TASK).source
  names = ("vocab_mix_a", "vocab_mix_b", "vocab_mix")
  for name, vocab in zip(names, (a, b)):
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(name, source=source, preprocessors=[],
                           output_features={k: seqio.Feature(vocab) for k in ("inputs", "targets")},
                           metric_fns=[lambda targets, predictions: {"n": len(targets)}])
  seqio.MixtureRegistry.remove(names[2])
  seqio.MixtureRegistry.add(names[2], [(names[0], 1.0), (names[1], 1.0)])
  try:
    message = (r"Mixture 'vocab_mix' mixes vocabularies: the 'inputs' feature of task "
               r"'vocab_mix_a' is SentencePieceVocabulary \(30 ids, .*\), of task 'vocab_mix_b' "
               r"SentencePieceVocabulary \(30 ids, .*\)\. A model reads one vocabulary")
    with pytest.raises(ValueError, match=message):
      vocabularies.task_record(seqio.get_mixture_or_task(names[2]))
    ckpt = checkpoints.Checkpointer(str(tmp_path / "run"))
    ckpt.save(5, _tree(), {}, {"vocabulary": _record(a)})
    ckpt.close()
    with pytest.raises(ValueError, match=message):
      eval_lib.evaluate(model=toy.model(), mixture_or_task_name=names[2],
                        checkpoint_path=str(tmp_path / "run"), output_dir=str(tmp_path / "eval"),
                        task_feature_lengths=toy.LENGTHS, num_examples=4, batch_size=4)
    assert vocabularies.task_record(seqio.get_mixture_or_task(names[0]))["inputs"] == \
        vocabularies.fingerprint(a)
  finally:
    seqio.MixtureRegistry.remove(names[2])
    for name in names[:2]:
      seqio.TaskRegistry.remove(name)
