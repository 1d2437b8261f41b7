"""RoBERTa's masked LM (Liu et al. 2019): the shared post-LN encoder (`bert_jax.model.post_ln`)
with positions from `pad_token_id + 1` and no token types, and its LM head (dense, activation,
LayerNorm, tied decoder + bias: the same modules as BERT's `cls/predictions`), no NSP."""
from bert_jax.model.masked_lm import MaskedLM
from bert_jax.model.post_ln import BertModel, BertPredictions


def encoder(config, add_pooling_layer: bool = True, name=None) -> BertModel:
  """RoBERTa's encoder: the post-LN encoder numbering positions from `pad_token_id + 1`, a pair's
  segment ids ignored (one token type)."""
  return BertModel(config, add_pooling_layer=add_pooling_layer,
                   position_offset=config.position_offset, token_types=False, name=name)


def masked_lm(config, use_nsp: bool = False) -> MaskedLM:
  """Encoder + LM head (`bert_jax.model.masked_lm`), transformers' RobertaForMaskedLM."""
  return MaskedLM(config, encoder=encoder, head=BertPredictions, use_nsp=use_nsp)
