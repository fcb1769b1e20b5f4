"""Models: the T5 Transformer, its layers, decoding strategies and the model API the trainer uses."""
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import T5Config, Transformer

__all__ = ['EncoderDecoderModel', 'T5Config', 'Transformer']
