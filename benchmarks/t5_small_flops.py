"""Reference formula (from the shared bench, kept verbatim): model FLOPs for T5 v1.0 small, B=8, Le=512, Ld=114 (train) / 64 greedy steps (decode).

Counts matmul FLOPs only (2 per multiply-add); layer norms, softmax, relu,
relative-position bias, dropout, loss and optimizer are not counted (<2%).
Attention score/value matmuls are counted at full (unmasked) size, since both
peers compute the full masked matrices. Training = 3 x forward (backward = 2 x fwd).
"""
import json

B, LE, LD, GEN = 8, 512, 114, 64
D, INNER, F, V, NE, ND = 512, 8 * 64, 2048, 32128, 6, 6


def proj(tokens, n_in, n_out):
  return 2 * tokens * n_in * n_out


def forward(le=LE, ld=LD):
  te, td = B * le, B * ld
  enc_layer = (proj(te, D, INNER) * 4              # q,k,v,o
               + 2 * 2 * B * le * le * INNER          # QK^T and AV
               + proj(te, D, F) + proj(te, F, D))     # relu FFN
  dec_layer = (proj(td, D, INNER) * 4                 # self-attn q,k,v,o
               + 2 * 2 * B * ld * ld * INNER          # self-attn QK^T, AV
               + proj(td, D, INNER) * 2               # cross-attn q,o
               + proj(te, D, INNER) * 2               # cross-attn k,v on encoder tokens
               + 2 * 2 * B * ld * le * INNER          # cross-attn QK^T, AV
               + proj(td, D, F) + proj(td, F, D))
  head = proj(td, D, V)                               # tied-embedding logits
  return dict(encoder=NE * enc_layer, decoder=ND * dec_layer, lm_head=head,
              total=NE * enc_layer + ND * dec_layer + head)


def decode_flops(gen=GEN):
  """Ideal greedy decode: encoder once, cross-attn K/V once, then per step 1 token
  per sequence with cached self-attn K/V (attention over `gen` cache slots, as t5x's
  fixed-size cache; HF's growing cache is ~half that, negligible)."""
  te = B * LE
  enc = forward()["encoder"]
  cross_kv = ND * proj(te, D, INNER) * 2
  per_step_layer = (proj(B, D, INNER) * 4 + 2 * 2 * B * gen * INNER
                    + proj(B, D, INNER) * 2 + 2 * 2 * B * LE * INNER
                    + proj(B, D, F) + proj(B, F, D))
  per_step = ND * per_step_layer + proj(B, D, V)
  return dict(encoder=enc, cross_kv_once=cross_kv, per_step=per_step,
              total=enc + cross_kv + gen * per_step,
              t5x_if_cross_kv_recomputed_each_step=enc + gen * (cross_kv + per_step))


def six_n_d():
  """Crude 6*N*D: non-embedding params applied to the tokens they touch + LM head."""
  enc_p = NE * (4 * D * INNER + 2 * D * F)
  dec_p_dec_tokens = ND * (4 * D * INNER + 2 * D * INNER + 2 * D * F)
  dec_p_enc_tokens = ND * (2 * D * INNER)   # cross-attn k,v
  return 6 * ((enc_p + dec_p_enc_tokens) * B * LE + (dec_p_dec_tokens + V * D) * B * LD)


if __name__ == "__main__":
  fw = forward()
  out = dict(forward=fw, train_step=3 * fw["total"], six_n_d_no_attention=six_n_d(),
             decode=decode_flops(), tokens_per_train_step=B * (LE + LD))
  print(json.dumps(out, indent=1))
