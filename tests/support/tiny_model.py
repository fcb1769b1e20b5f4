"""The smallest T5 the in-process training tests use: one layer each side, d_model 32, the BBC
vocabulary (8192 ids), no dropout."""
from t2t.data import vocabularies
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import T5Config, Transformer


def tiny_t5() -> EncoderDecoderModel:
  vocab = vocabularies.bbc_vocabulary()
  config = T5Config(vocab_size=8192, d_model=32, num_heads=2, d_kv=16, d_ff=64,
                    num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0)
  return EncoderDecoderModel(module=Transformer(config), input_vocabulary=vocab,
                             output_vocabulary=vocab)
