"""The analytic training FLOPs of a BERT step: what MFU is measured against.

Forward + backward = 3 x forward, 2 FLOPs per multiply-add: 6 x (encoder weights) per token,
12 x layers x hidden per (query, key) pair of attention (q k^T and probs v, both directions), the
masked-LM head only at the masked positions (transform + tied decoder), and the pooler + NSP
classifier per sequence pair.
"""


def training_flops(layers: int, hidden: int, intermediate: int, vocab: int, *, tokens: float,
                   attention_pairs: float, predictions: float, pairs: float) -> float:
  """FLOPs of one training step over `tokens` positions (padding counted if the step computes
  it), `attention_pairs` (sum of S^2 over rows, or over packed pairs), `predictions` masked-LM
  slots and `pairs` NSP sequences."""
  encoder_weights = layers * (4 * hidden * hidden + 2 * hidden * intermediate)
  return (6 * encoder_weights * tokens + 12 * layers * hidden * attention_pairs
          + 6 * predictions * (hidden * hidden + hidden * vocab)
          + 6 * pairs * (hidden * hidden + 2 * hidden))


def kernel_training_flops(bert_config, rows: int, seq_len: int) -> float:
  """The training FLOPs a step spends inside the splash-attention kernels when it is compiled for
  a TPU (0 where attention is not splash there): XLA's cost analysis counts a custom call as
  almost nothing (a BERT-base forward and backward compiled for v5e: 1.6 MFLOP), so reports add
  this analytic count."""
  # Imported here: the model modules bring in Flax; the FLOP formulas above need nothing.
  from bert_jax.model import kernels, modeling, splash
  with kernels.compiling_for("tpu"):
    kind = modeling.attention_kind(bert_config, deterministic=False, seq_len=seq_len)
  if kind != "splash":
    return 0.0
  return bert_config.num_hidden_layers * splash.attention_flops(
      rows, bert_config.num_attention_heads, seq_len, bert_config.head_dim,
      bert_config.causal_attention)
