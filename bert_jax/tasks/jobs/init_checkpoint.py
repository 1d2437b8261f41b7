"""Pre-training from a checkpoint (`config.init_checkpoint`): a released model (Hugging Face,
Google TF, `save_pretrained`) or an earlier phase's workdir.

Two parts, both with explicit arguments (the pre-training job translates its config:
`bert_jax/tasks/jobs/pretraining.py`):
  adopt_checkpoint  continued pre-training (`config.model_from_checkpoint`): the checkpoint's
                    architecture, and the vocabulary beside it with its recorded casing, as
                    changes to the run's config;
  warm_start        a fresh run's state with the checkpoint's encoder, and each pre-training head
                    the checkpoint has (the others initialised from scratch, and named).
"""
from typing import Any, Dict

import flax
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from bert_jax import families
from bert_jax.io import checkpoints
from bert_jax.model import growth
from bert_jax.model.config import BertConfig

# The fields a checkpoint's architecture must share with the run's model to be loaded into it.
_SHARED_FIELDS = ("architecture", "vocab_size", "hidden_size", "num_hidden_layers",
                  "num_attention_heads", "intermediate_size", "type_vocab_size")


def load_init_checkpoint(source: str, params, ours: BertConfig, tiling: str = ""):
  """`params` (a fresh model's, host arrays) with the encoder of `source` and each pre-training
  head it has (MLM `cls/predictions`, NSP `cls/seq_relationship`); a head it lacks keeps its fresh
  initialisation, and the run says which. `ours`: the run's model config. `tiling` (a mode of
  `bert_jax.model.growth`): `source` is a smaller model of the same family and vocabulary, and
  every parameter is grown from it (ModernBERT-large from base)."""
  loaded_config, loaded = checkpoints.load_pretrained(source)
  if tiling:
    try:
      growth.check_growable(loaded_config, ours)
    except ValueError as e:
      raise ValueError(f"init_checkpoint {source} with config.init_tiling={tiling!r}: {e}"
                       ) from None
    fresh = checkpoints.per_layer(flax.core.unfreeze(params), ours)
    grown = growth.grow(loaded, loaded_config, fresh, ours, tiling)
    print(f"init_checkpoint {source}: every parameter grown from its "
          f"{loaded_config.num_hidden_layers} x {loaded_config.hidden_size} model by {tiling}",
          flush=True)
    return jax.tree_util.tree_map(jnp.asarray, checkpoints.to_model_layout(grown, ours))
  for field in _SHARED_FIELDS:
    if getattr(loaded_config, field) != getattr(ours, field):
      raise ValueError(f"init_checkpoint {source}: {field}="
                       f"{getattr(loaded_config, field)} but config.model.{field}="
                       f"{getattr(ours, field)} (config.model_from_checkpoint=True takes the "
                       "checkpoint's architecture; config.init_tiling grows a smaller one)")
  # Without a position table (rotary) a later phase may run longer than the one before it.
  if (families.of(ours).max_positions(ours) is not None
      and loaded_config.max_position_embeddings != ours.max_position_embeddings):
    raise ValueError(f"init_checkpoint {source}: max_position_embeddings differs")
  missing = checkpoints.missing_heads(loaded, loaded_config)
  loaded = checkpoints.to_model_layout(loaded, ours)
  merged = flax.core.unfreeze(jax.tree_util.tree_map(np.asarray, params))
  merged["bert"] = loaded["bert"]
  wanted = set(merged.get("cls", {}))              # the heads this objective trains
  for name, value in loaded.get("cls", {}).items():
    if name in wanted:
      merged["cls"][name] = value
  fresh = [h for h in missing if h.split("/")[1] in wanted]
  if fresh:
    message = f"init_checkpoint {source} has no {', '.join(fresh)}: initialised from scratch"
    logging.warning(message)
    print(message, flush=True)
  return jax.tree_util.tree_map(jnp.asarray, merged)


def warm_start(source: str, ours: BertConfig, tx, state, par, tiling: str = ""):
  """`Job.warm_start` of a fresh run: the state placed on the mesh by `par` with the parameters
  of `source` (`load_init_checkpoint`, grown by `tiling` when given) and a new optimizer state
  for them."""
  host = jax.device_get(par.checkpointable(state))
  params = load_init_checkpoint(source, host.params, ours, tiling)
  print(f"Initialised from {source}", flush=True)
  return par.place_state(host.replace(params=params, opt_state=tx.init(params)))


def adopt_checkpoint(source: str, max_seq_length: int, *, vocab_file: str = "",
                     spm_model_file: str = "", tokenizer_file: str = "",
                     do_lower_case: bool = True) -> Dict[str, Any]:
  """Continued pre-training of `source`: the changes to the run's config ({"model.<field>":
  ..., "tokenizer.<field>": ...}) that make the architecture fields of `config.model` (not the
  runtime ones: dtype, scan, remat, kernels) the checkpoint's, and the tokenizer the vocabulary
  beside it (`vocab.txt`, else `spm.model`, else `tokenizer.json`: `checkpoints.find_vocab`) with
  its recorded casing (a tokenizer.json's: its normalizer's), unless the run names a vocabulary
  (`vocab_file`, `spm_model_file`, `tokenizer_file`: then checked against the checkpoint's, token
  for token). A `max_seq_length` beyond the checkpoint's position table is an error.
  """
  loaded = checkpoints.load_pretrained_config(source)
  # Continued pre-training cannot add positions to a table.
  families.of(loaded).check_length(loaded, max_seq_length, source)
  changes = {f"model.{k}": v for k, v in loaded.to_dict(include_runtime=False).items()}
  found = not (vocab_file or spm_model_file or tokenizer_file)
  if found:
    vocab_file, spm_model_file, tokenizer_file = (p or "" for p in checkpoints.find_vocab(source))
    recorded = checkpoints.recorded_lower_case(source)
    if recorded is not None:
      do_lower_case = recorded
  from bert_jax.text import tokenization
  tokenizer = tokenization.create_tokenizer(vocab_file=vocab_file or None,
                                            spm_model_file=spm_model_file or None,
                                            tokenizer_file=tokenizer_file or None,
                                            do_lower_case=do_lower_case)
  if tokenizer_file:   # the file's normalizer is its casing
    do_lower_case = tokenizer.do_lower_case
  else:
    tokenization.validate_case_matches_checkpoint(do_lower_case, source)
  if found:
    changes.update({"tokenizer.vocab_file": vocab_file, "tokenizer.spm_model_file": spm_model_file,
                    "tokenizer.tokenizer_file": tokenizer_file,
                    "tokenizer.do_lower_case": do_lower_case})
  vocab = vocab_file or spm_model_file or tokenizer_file
  size = tokenizer.vocab_size
  if size != loaded.vocab_size:
    raise ValueError(f"Vocabulary {vocab} has {size} entries but {source} has vocab_size="
                     f"{loaded.vocab_size}: pass the vocabulary the checkpoint was trained with")
  if not found:   # one the run names: the checkpoint's own, token for token
    from bert_jax.tasks.framework import finetuning
    finetuning.check_checkpoint_vocabulary(tokenizer, vocab, source)
  print(f"Continuing {source}: L={loaded.num_hidden_layers}, H={loaded.hidden_size}, "
        f"A={loaded.num_attention_heads}, max positions {loaded.max_position_embeddings}; "
        f"vocabulary {vocab} ({size} entries, "
        f"{'uncased' if do_lower_case else 'cased'})", flush=True)
  return changes
