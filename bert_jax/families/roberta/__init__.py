"""RoBERTa and XLM-RoBERTa (Liu et al. 2019; Conneau et al. 2020): BERT's post-LN encoder with
positions from `pad_token_id + 1`, one token type, the masked LM alone (dynamic masking, full
sentences across documents), pairs as `<s> A </s></s> B </s>`; byte-level BPE or SentencePiece
vocabularies; transformers' `Roberta*` and `XLMRoberta*` classes in and out."""
from typing import Optional

import numpy as np

from bert_jax.families import base
from bert_jax.families.roberta import convert
from bert_jax.families.roberta.config import RobertaConfig
from bert_jax.model import flops

# transformers' class of each head, after the prefix of the model type ("Roberta"/"XLMRoberta").
_CLASSES = {"encoder": "Model", "masked_lm": "ForMaskedLM",
            "sequence_classification": "ForSequenceClassification",
            "multiple_choice": "ForMultipleChoice",
            "token_classification": "ForTokenClassification",
            "question_answering": "ForQuestionAnswering"}
_PREFIXES = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta"}


class RobertaFamily(base.Family):
  name = "roberta"
  huggingface_model_types = ("roberta", "xlm-roberta")
  objectives = ("mlm",)
  token_types = False
  optional_parameters = (r"bert/pooler/",)   # the masked LM has no pooler
  pretraining_heads = ("cls/predictions",)
  special_token_ids = (("pad_token_id", "pad_id"), ("bos_token_id", "cls_id"),
                       ("eos_token_id", "sep_id"))

  def encoder(self, config, add_pooling_layer: bool = True, name: Optional[str] = None):
    from bert_jax.families.roberta import model
    return model.encoder(config, add_pooling_layer=add_pooling_layer, name=name)

  def pretraining_model(self, config, use_nsp: bool):
    from bert_jax.families.roberta.model import masked_lm
    return masked_lm(config, use_nsp=use_nsp)

  def max_positions(self, config: RobertaConfig) -> Optional[int]:
    return config.max_position_embeddings - config.position_offset

  def training_flops(self, config, *, rows, seq_len, predictions, pairs):
    # BERT's encoder and LM head; a fine-tuned classifier's pooler per sequence, no NSP.
    return flops.post_ln_training_flops(config, rows=rows, seq_len=seq_len,
                                        predictions=predictions, pairs=pairs)

  def config_from_huggingface(self, values, source):
    return convert.config_from_huggingface(values, source)

  def huggingface_config(self, config, architecture):
    return convert.huggingface_config(config, architecture)

  def huggingface_classes_of(self, config: RobertaConfig):
    prefix = _PREFIXES[config.huggingface_type]
    return {head: prefix + suffix for head, suffix in _CLASSES.items()}

  def flat_from_huggingface(self, state, source=""):
    base.check_tied(state, "lm_head.decoder.weight",
                    ("roberta.embeddings.word_embeddings.weight",), source)
    return convert.flat_from_huggingface(state)

  def huggingface_state(self, flat):
    return convert.huggingface_state(flat)

  def huggingface_task_state(self, head, bert, output):
    """The encoder under `roberta.`; a sequence classifier's head is transformers'
    RobertaClassificationHead: dense + tanh on `<s>` (our pooler) as `classifier.dense`, the
    output layer as `classifier.out_proj`."""
    pooler = {k: v for k, v in bert.items() if k.startswith("bert/pooler/")}
    keep_pooler = head == "multiple_choice"   # RobertaForMultipleChoice reads the pooler
    encoder = {k: v for k, v in bert.items() if keep_pooler or k not in pooler}
    state = {f"roberta.{k}": v for k, v in convert.huggingface_state(encoder).items()}
    name = {"question_answering": "qa_outputs",
            "sequence_classification": "classifier.out_proj"}.get(head, "classifier")
    if head == "sequence_classification":
      state["classifier.dense.weight"] = base.linear_weight(pooler["bert/pooler/dense/kernel"])
      state["classifier.dense.bias"] = np.asarray(pooler["bert/pooler/dense/bias"], np.float32)
    state[f"{name}.weight"] = base.linear_weight(output["kernel"])
    state[f"{name}.bias"] = np.asarray(output["bias"], np.float32)
    return state


FAMILY = RobertaFamily()
