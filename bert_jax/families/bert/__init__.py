"""BERT (Devlin et al. 2018), the family of the paper: post-LN blocks, learned positions, token
types, the masked LM with the tied decoder and next-sentence prediction; Google's TF checkpoints
and transformers' `Bert*` classes in and out."""
from typing import Any, Dict, Optional

import numpy as np

from bert_jax.families import base
from bert_jax.families.bert import convert
from bert_jax.model import flops
from bert_jax.model.config import BertConfig


class BertFamily(base.Family):
  name = "bert"
  huggingface_model_types = ("bert",)
  objectives = ("mlm_nsp", "mlm", "ltr")
  token_types = True
  optional_parameters = (r"bert/pooler/",)   # transformers' BertModel(add_pooling_layer=False)
  pretraining_heads = ("cls/predictions", "cls/seq_relationship")
  huggingface_classes = {
      "encoder": "BertModel", "masked_lm": "BertForMaskedLM", "pretraining": "BertForPreTraining",
      "sequence_classification": "BertForSequenceClassification",
      "multiple_choice": "BertForMultipleChoice",
      "token_classification": "BertForTokenClassification",
      "question_answering": "BertForQuestionAnswering"}

  def encoder(self, config: BertConfig, add_pooling_layer: bool = True,
              name: Optional[str] = None):
    from bert_jax.model.post_ln import BertModel
    return BertModel(config, add_pooling_layer=add_pooling_layer, name=name)

  def pretraining_model(self, config: BertConfig, use_nsp: bool):
    from bert_jax.families.bert.model import BertForPreTraining
    return BertForPreTraining(config, use_nsp=use_nsp)

  def training_flops(self, config, *, rows, seq_len, predictions, pairs):
    return flops.post_ln_training_flops(config, rows=rows, seq_len=seq_len,
                                        predictions=predictions, pairs=pairs)

  def config_from_huggingface(self, values: Dict[str, Any], source: str) -> BertConfig:
    return BertConfig.from_dict(values, source=source)

  def huggingface_config(self, config: BertConfig, architecture: str) -> Dict[str, Any]:
    hf_config = config.to_dict(include_runtime=False)
    if hf_config["hidden_act"] == "gelu_tanh":
      hf_config["hidden_act"] = "gelu_pytorch_tanh"  # transformers' name for the tanh form
    hf_config.update(model_type="bert", architectures=[architecture], pad_token_id=0)
    return hf_config

  def flat_from_huggingface(self, state, source=""):
    base.check_tied(state, "cls.predictions.decoder.weight",
                    ("bert.embeddings.word_embeddings.weight",), source)
    return convert.flat_from_huggingface(state)

  def huggingface_state(self, flat):
    return convert.huggingface_state(flat)

  def huggingface_task_state(self, head, bert, output):
    if head in ("token_classification", "question_answering"):   # built without a pooler
      bert = {k: v for k, v in bert.items() if not k.startswith("bert/pooler/")}
    state = {f"bert.{k}": v for k, v in convert.huggingface_state(bert).items()}
    name = "qa_outputs" if head == "question_answering" else "classifier"
    state[f"{name}.weight"] = base.linear_weight(output["kernel"])
    state[f"{name}.bias"] = np.asarray(output["bias"], np.float32)
    return state

  def flat_from_tf(self, variables):
    return convert.flat_from_tf(variables)

  def tf_from_flat(self, flat):
    return convert.tf_from_flat(flat)


FAMILY = BertFamily()
