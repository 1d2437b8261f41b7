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


def post_ln_training_flops(config, *, rows: int, seq_len: int, predictions: float,
                           pairs: float) -> float:
  """`training_flops` of a step of the post-LN encoder (`bert_jax.model.post_ln`: BERT's and
  RoBERTa's) over `rows` full rows of `seq_len` tokens."""
  return training_flops(config.num_hidden_layers, config.hidden_size, config.intermediate_size,
                        config.vocab_size, tokens=rows * seq_len,
                        attention_pairs=rows * seq_len * seq_len, predictions=predictions,
                        pairs=pairs)


def attended_keys(bert_config, layer: int, seq_len: int) -> int:
  """Keys a query attends to in `layer`: all S, or a local layer's band (2w + 1, at most S;
  the band's few cut ends at the row's edges are counted whole)."""
  if bert_config.is_global_layer(layer):
    return seq_len
  return min(seq_len, 2 * bert_config.window + 1)


def modern_training_flops(bert_config, *, rows: int, seq_len: int, predictions: float) -> float:
  """FLOPs of one ModernBERT-family training step (`bert_jax.families.modernbert`): per token the
  fused
  Wqkv and Wo (4 H^2) and the GLU MLP (3 H I: Wi is [H, 2I]); attention over each layer's keys
  (all of them globally, the band locally); the MLM head at the masked positions; no NSP."""
  c = bert_config
  mlp = (3 if c.glu else 2) * c.hidden_size * c.intermediate_size
  encoder_weights = c.num_hidden_layers * (4 * c.hidden_size * c.hidden_size + mlp)
  tokens = rows * seq_len
  attention = sum(12 * c.hidden_size * tokens * attended_keys(c, layer, seq_len)
                  for layer in range(c.num_hidden_layers))
  head = 6 * predictions * (c.hidden_size * c.hidden_size + c.hidden_size * c.vocab_size)
  return 6 * encoder_weights * tokens + attention + head
