"""t2t: text-to-text transfer learning in JAX/Flax."""
from t2t import deferred_imports as _deferred_imports
from t2t import keras_imports as _keras_imports

__version__ = "0.1.0"

# Before anything imports TensorFlow (and with it Keras): ~1.4 s off every process's start.
_keras_imports.hide_optional_imports_from_keras()
# Before anything imports seqio: PyGlove, which t2t never calls, runs on first use (~0.25 s).
_deferred_imports.defer_unused_imports()
