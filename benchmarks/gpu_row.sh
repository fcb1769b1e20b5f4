#!/usr/bin/env bash
# Issue 9's GPU row in one `device` call: T5 v1.1 base in bf16 against Hugging Face on the same GPU
# (benchmarks/t5_gpu.py; benchmarks/README.md, "t5_gpu").
#
# The GPU image has JAX (CUDA), Flax, optax, orbax, torch and transformers, but not gin-config,
# which t2t's model and trainer import; it travels as a wheel. Here, once, in the repository root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp -d .whl gin-config==0.5.0
# Then the device call (its length on a GPU is not yet known: nothing has run there):
#   run(command="bash benchmarks/gpu_row.sh", carry=[".whl"], timeout_s=540)
# Each part (train, greedy, beam4) runs in a process of its own and writes its own JSON and log
# under $OUT as soon as it ends, so a part that fails or runs out of time loses only itself.
# PARTS="train greedy" picks parts; extra arguments go to every benchmarks.t5_gpu call (e.g.
# --batch 128). Add the row to README "Performance" from the JSONs.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/t5_gpu_out}"
mkdir -p "$out"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/t2t_site .whl/*.whl
  export PYTHONPATH="/tmp/t2t_site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
    | tee "$out/nvidia_smi.csv" || true
python3 -c 'import jax, torch; print("jax", jax.__version__, jax.devices(), "torch", torch.__version__, torch.cuda.is_available())'
status=0
for part in ${PARTS:-train greedy beam4}; do
  python3 -m benchmarks.t5_gpu --parts "$part" --out "$out/t5_gpu_$part.json" "$@" \
      2> >(tee "$out/t5_gpu_$part.log" >&2) || { status=$?; echo "t5_gpu --parts $part failed (rc $status)" >&2; }
done
exit $status
