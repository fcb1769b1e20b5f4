"""Probing: what each layer of a checkpoint encodes (PAPERS.md §7; Peters et al. 2019, §5;
Tenney et al. 2019 via Pruksachatkun et al. 2020, §3-5).

- `representations`: per-layer states of any encoder-protocol module (T5's encoder, BERT, BiLSTM)
  restored from a checkpoint, pooled over non-padding tokens (mean, max, first token).
- `diagnostic`: diagnostic classifiers per layer (logistic regression on labels, ridge
  regression on scores), fitted with scikit-learn.
- `edge`: edge-probing span and span-pair heads on frozen token states (JAX/optax).
- `correlation`: Spearman correlation of probe scores with target-task scores across runs,
  Holm-Bonferroni corrected.
- `report`: JSONL rows -> per-layer probe curves (PNG) and a markdown table.
- `run`: the gin-configurable pipeline behind `python -m t2t.probing`.
"""
