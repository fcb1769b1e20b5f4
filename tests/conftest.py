"""Test-wide settings: quiet TensorFlow, and keep tf.data off the cores that JAX needs."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import tensorflow as tf  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.set_visible_devices([], "GPU")

import gin  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _clear_gin_config():
  """Each test starts and ends with an empty gin config (gin state is process-global)."""
  gin.clear_config()
  yield
  gin.clear_config()
