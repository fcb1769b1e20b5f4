"""t2t: text-to-text transfer learning in JAX/Flax."""

__version__ = "0.1.0"
