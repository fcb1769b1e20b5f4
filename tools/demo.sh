#!/usr/bin/env bash
# The README's demo: pre-train a small T5 on BBC span corruption, fine-tune it on bbc_topic,
# and print validation accuracy. Offline; about 7 minutes on a 2-core CPU (README, Quickstart).
#   bash tools/demo.sh [WORKDIR]        (default: runs/bbc_demo; rerunning resumes)
# Extra arguments after WORKDIR are passed to every step, e.g. --gin.SEED=1.
set -euo pipefail
WORKDIR=${1:-runs/bbc_demo}
shift || true
export TF_CPP_MIN_LOG_LEVEL=3
run() { echo "+ $*"; "$@"; }
start=$(date +%s)

echo "== 1/3 pre-train: span corruption on BBC articles"
run python -m t2t.train --gin_file=experiments/bbc_demo/pretrain.gin \
  --gin.MODEL_DIR="$WORKDIR/pretrain" "$@"

echo "== 2/3 fine-tune: bbc_topic from the pre-trained checkpoint"
run python -m t2t.train --gin_file=experiments/bbc_demo/finetune.gin \
  --gin.MODEL_DIR="$WORKDIR/finetune" --gin.INITIAL_CHECKPOINT_PATH="$WORKDIR/pretrain" "$@"

echo "== 3/3 evaluate: bbc_topic validation split"
run python -m t2t.eval --gin_file=experiments/bbc_demo/eval.gin \
  --gin.CHECKPOINT_PATH="$WORKDIR/finetune" --gin.EVAL_OUTPUT_DIR="$WORKDIR/eval" "$@"

echo "== done in $(( $(date +%s) - start ))s; metrics: $WORKDIR/eval/metrics.json," \
  "predictions: $WORKDIR/eval/bbc_topic.validation.predictions.jsonl"
