"""Pre-training from a checkpoint (`config.init_checkpoint`): a released model (Hugging Face,
Google TF, `save_pretrained`) or an earlier phase's workdir.

Two parts, both with explicit arguments (the pre-training job translates its config:
`bert_jax/tasks/jobs/pretraining.py`):
  adopt_checkpoint  continued pre-training (`config.model_from_checkpoint`): the checkpoint's
                    architecture, and the vocabulary beside it with its recorded casing, as
                    changes to the run's config;
  warm_start        a fresh run's state with the checkpoint's encoder, and each pre-training head
                    the checkpoint has (the others initialised from scratch, and named); or,
                    with `config.init_optimizer_state` (a later phase of a recipe), an earlier
                    phase's parameters and optimizer state (`carry_training_state`).
"""
from typing import Any, Dict

import flax
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from bert_jax import families
from bert_jax.io import checkpoints, training_checkpoints
from bert_jax.model import growth
from bert_jax.model.config import BertConfig
from bert_jax.runtime import optim

# The fields a checkpoint's architecture must share with the run's model to be loaded into it.
_SHARED_FIELDS = ("architecture", "vocab_size", "hidden_size", "num_hidden_layers",
                  "num_attention_heads", "intermediate_size", "type_vocab_size")


def check_architecture(source: str, loaded_config: BertConfig, ours: BertConfig) -> None:
  """That the checkpoint `source` (of `loaded_config`) has the architecture of the run's model
  `ours` where its parameters depend on it: a ValueError naming the field otherwise."""
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
  check_architecture(source, loaded_config, ours)
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


def warm_start(source: str, ours: BertConfig, tx, state, par, tiling: str = "",
               optimizer_state: bool = False):
  """`Job.warm_start` of a fresh run: the state placed on the mesh by `par` with the parameters
  of `source` (`load_init_checkpoint`, grown by `tiling` when given) and a new optimizer state
  for them; with `optimizer_state` (`config.init_optimizer_state`), the parameters and the
  optimizer state of a training workdir's newest checkpoint (`carry_training_state`)."""
  if optimizer_state:
    return carry_training_state(source, ours, state, par)
  host = jax.device_get(par.checkpointable(state))
  params = load_init_checkpoint(source, host.params, ours, tiling)
  print(f"Initialised from {source}", flush=True)
  return par.place_state(host.replace(params=params, opt_state=tx.init(params)))


def carry_training_state(source: str, ours: BertConfig, state, par):
  """A later phase's start (`config.init_optimizer_state`): `state` (the run's fresh one, placed
  by `par`) with the parameters and the optimizer state saved in the newest checkpoint of the
  training workdir `source`, restored as a resumed run restores (Orbax, into this run's
  shapes and shardings, checked against the checkpoint's record and fingerprints).

  Carried: the parameters and every part of the optimizer state (Adam's moments, and the update
  count their bias correction reads: `optax.ScaleByAdamState.count`). Not carried: the count of
  every learning-rate schedule (`optax.ScaleByScheduleState`), this run's step and non-finite
  skip counters, and the input position: they are the fresh state's, 0, so this run's schedule
  starts at its own step 0 (Composer's `reset_time`, which ModernBERT's later phases set while
  keeping the optimizer's state). The optimizer's hyperparameters are this run's config's.

  A ValueError naming `config.init_optimizer_state` when `source` is not a training workdir (a
  released checkpoint holds no optimizer state) or when its state is not of this run's shapes
  (another optimizer, objective, layout such as `scan_layers`, or model size)."""
  fmt = checkpoints.detect_format(source)
  if fmt != "workdir":
    raise ValueError(
        f"config.init_optimizer_state=True carries the optimizer state of a training workdir "
        f"(a pre-training run's, with checkpoints/), but init_checkpoint {source} is a {fmt} "
        "checkpoint, which holds parameters only: set --config.init_optimizer_state=False")
  check_architecture(source, checkpoints.load_pretrained_config(source), ours)
  checkpointer = training_checkpoints.TrainingCheckpointer(source, async_save=False)
  try:
    step = checkpointer.latest_step()
    if step is None:
      raise FileNotFoundError(f"{source} has no complete checkpoint under checkpoints/")
    try:
      restored = checkpointer.restore_state(step, par.abstract_state(state))
    except training_checkpoints.CheckpointMismatchError as error:
      raise ValueError(
          f"config.init_optimizer_state=True: the state saved in {source} is not of this run's "
          "shapes, so its optimizer state cannot be carried over (another optimizer, objective, "
          "layout such as config.model.scan_layers, or model size). --config."
          f"init_optimizer_state=False loads its parameters alone. {error}") from None
  finally:
    checkpointer.close()
  carried = par.from_checkpoint(restored)
  print(f"Initialised from {source}: the parameters and optimizer state of step {step}; this "
        "run's step, learning-rate schedule and input start at 0", flush=True)
  return state.replace(params=carried.params,
                       opt_state=optim.restart_schedules(carried.opt_state, state.opt_state))


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
