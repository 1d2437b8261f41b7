"""The feature-based approach (paper section 5.3, Table 7): a frozen BERT feeds a BiLSTM tagger.

1. `extract`: the encoder runs ONCE (`runtime.inference`) over every sentence of a split (NER rows
   from `bert_jax.tasks.datasets.ner`, optionally with document context) and the hidden states of every layer (embeddings + L
   layers) at each word's first WordPiece are cached on disk as float16
   (`CACHE_DIR/<split>.npz`, keyed by checkpoint, data and settings). The encoder gets no
   gradient, so recomputing it every step (the loop's `freeze_encoder`) would only cost time.
2. For each layer choice (`LAYER_CHOICES`), a randomly initialised 2-layer BiLSTM (Flax `nn.RNN`
   over `nn.OptimizedLSTMCell`, `nn.Bidirectional`) plus a linear classifier is trained on the
   cached word vectors with the fine-tuning loop's own pure `train_step` / `predict_step` and
   AdamW, then scored with entity F1 on dev.
3. `run` prints the Table-7-style table and writes `WORKDIR/results.json`.
`job` is one choice's tagger as the job of `config.task=ner_feature_based` (`tasks.registry.job`):
on the cached features with a workdir, on zero features of the same shapes without (what
`--compile_for` compiles; the encoder is not run).

The BiLSTM runs over words (each word's first-piece vector), the unit the labels and the metric
use; the other pieces carry no label in the fine-tuning approach either.

Shape letters: B sentences, W words, M layers used by a choice, H hidden, K labels.
"""
import dataclasses
import functools
import hashlib
import json
import time
from typing import Dict, List, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import parallel
from bert_jax.io import checkpoints, filesystem
from bert_jax.tasks.framework import finetuning
from bert_jax.model import heads
from bert_jax.tasks.datasets import ner
from bert_jax.model.kernels import select as select_kernels
from bert_jax.runtime import inference, optim, outputs
from bert_jax.runtime import job as jobs
from bert_jax.runtime.job import Batches, Job
from bert_jax.runtime.loop import LoopSettings
from bert_jax.runtime.metric_writers import read_metrics
from bert_jax.runtime.state import TrainState
from bert_jax.model.heads import IGNORE_LABEL

# choice -> (layers used: indices into [embeddings, layer 1, ..., layer L], how to combine).
# Written for L layers; "weighted_sum_all" is over the L Transformer layers (the paper's 12).
LAYER_CHOICES = ("embeddings", "second_to_last", "last", "weighted_sum_last_four",
                 "sum_last_four", "concat_last_four", "weighted_sum_all")
# The paper's CoNLL-2003 dev F1 with BERT-base (Table 7), for the printed comparison.
PAPER_DEV_F1 = {"embeddings": 91.0, "second_to_last": 95.6, "last": 94.9,
                "weighted_sum_last_four": 95.9, "concat_last_four": 96.1,
                "weighted_sum_all": 95.5}


def layer_indices(choice: str, num_layers: int) -> Tuple[int, ...]:
  """Indices into hidden_states [L+1] (0 = embeddings) that `choice` reads."""
  last = num_layers
  table = {"embeddings": (0,), "last": (last,), "second_to_last": (last - 1,),
           "sum_last_four": tuple(range(last - 3, last + 1)),
           "weighted_sum_last_four": tuple(range(last - 3, last + 1)),
           "concat_last_four": tuple(range(last - 3, last + 1)),
           "weighted_sum_all": tuple(range(1, last + 1))}
  if choice not in table:
    raise ValueError(f"Unknown layer choice {choice!r}; expected one of {LAYER_CHOICES}")
  if min(table[choice]) < 0:
    raise ValueError(f"Layer choice {choice!r} needs 4 layers; the encoder has {num_layers}")
  return table[choice]


# ------------------------------------------------------------------------------------ model


class ScalarMix(nn.Module):
  """gamma * sum_j softmax(w)_j * x_j over the layer axis (the learned "weighted sum")."""

  @nn.compact
  def __call__(self, x):                                            # [B, W, M, H]
    weights = self.param("weights", nn.initializers.zeros_init(), (x.shape[-2],))
    gamma = self.param("gamma", nn.initializers.ones_init(), ())
    return gamma * jnp.einsum("bwmh,m->bwh", x, jax.nn.softmax(weights))   # [B, W, H]


def combine_layers(choice: str, x):
  """[B, W, M, H] of the chosen layers -> the BiLSTM input [B, W, H or 4H]."""
  if choice.startswith("weighted_sum"):
    return ScalarMix(name="scalar_mix")(x)
  if choice == "sum_last_four":
    return x.sum(axis=-2)
  if choice == "concat_last_four":
    return x.reshape(x.shape[:-2] + (-1,))                          # [B, W, 4H]
  return x[..., 0, :]                                               # one layer: [B, W, H]


class BiLSTMTagger(nn.Module):
  """Layer combination -> `num_layers` BiLSTM layers (units per direction) -> linear labels."""
  choice: str
  num_labels: int
  units: int = 768
  num_layers: int = 2
  dropout_rate: float = 0.1
  kernels: str = "auto"       # config.model.kernels: its dropout and output layer, as the encoder's

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    blocks = select_kernels(self.kernels)
    x = combine_layers(self.choice, batch["features"].astype(jnp.float32))   # [B, W, D]
    lengths = batch["lengths"]                                             # [B]
    for i in range(self.num_layers):
      x = blocks.Dropout(self.dropout_rate)(x, deterministic=deterministic)
      # Padding words are outside seq_lengths: the backward direction starts at the last word.
      x = nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(self.units)),
                           nn.RNN(nn.OptimizedLSTMCell(self.units)),
                           name=f"bilstm_{i}")(x, seq_lengths=lengths)     # [B, W, 2U]
    x = blocks.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    return {"logits": nn.Dense(self.num_labels, name="classifier",
                               dot_general=blocks.dense_dot_general)(x)}    # [B, W, K]


# ------------------------------------------------------------------------------------ features


@dataclasses.dataclass
class WordFeatures:
  """Every word's vectors from every layer, sentences back to back.

  vectors [num_words, L+1, H] float16; offsets [num_sentences + 1]: sentence i is
  vectors[offsets[i]:offsets[i+1]]; label_ids [num_words] (IGNORE_LABEL where unknown)."""
  vectors: np.ndarray
  offsets: np.ndarray
  label_ids: np.ndarray


def extract(bert_config, encoder_params, tokenizer, sentences: Sequence[ner.Sentence],
            labels: Sequence[str], max_seq_length: int, document_context: bool,
            batch_size: int = 32) -> WordFeatures:
  """Runs the frozen encoder once and keeps each word's first-piece vector of every layer."""
  arrays, example_index, word_index = ner.convert_to_features(
      sentences, tokenizer, labels, max_seq_length, document_context)
  encoder = inference.BatchedInference(
      inference.encoder_hidden_states(bert_config, jnp.float16), batch_size)
  offsets = np.concatenate([[0], np.cumsum([len(s.words) for s in sentences])])
  num_layers = bert_config.num_hidden_layers + 1
  vectors = np.zeros((offsets[-1], num_layers, bert_config.hidden_size), np.float16)
  model_inputs = {k: arrays[k] for k in inference.MODEL_INPUTS}
  n = len(example_index)
  for start in range(0, n, batch_size):
    rows = np.arange(start, min(start + batch_size, n))
    hidden = encoder.batch(encoder_params, model_inputs, rows,
                           max_seq_length)["hidden_states"]                  # [b, L+1, S, H]
    r, p = np.nonzero(word_index[rows] >= 0)
    words = offsets[example_index[rows][r]] + word_index[rows][r, p]
    vectors[words] = hidden[r, :, p]                                          # [words, L+1, H]
  label_to_id = {label: i for i, label in enumerate(labels)}
  label_ids = np.array([label_to_id.get(t, IGNORE_LABEL) for s in sentences for t in s.labels],
                       np.int32)
  return WordFeatures(vectors, offsets.astype(np.int64), label_ids)


def cached_extract(cache_dir: str, key: Dict, **kwargs) -> WordFeatures:
  """`extract` once per (checkpoint, data, settings): CACHE_DIR/<split>-<hash>.npz."""
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
  path = filesystem.join(cache_dir, f"{key['split']}-{digest}.npz")
  if filesystem.exists(path):
    with filesystem.open(path, "rb") as f, np.load(f) as data:
      return WordFeatures(data["vectors"], data["offsets"], data["label_ids"])
  features = extract(**kwargs)
  if outputs.is_writer():
    filesystem.makedirs(cache_dir)
    tmp = path + ".tmp"
    with filesystem.open(tmp, "wb") as f:   # renamed when whole: a reader never sees half
      np.savez(f, vectors=features.vectors, offsets=features.offsets,
               label_ids=features.label_ids)
    filesystem.rename(tmp, path)
  return features


def _bucket(length: int) -> int:
  """Padded sentence length: a power of two >= 16, so that few shapes are ever compiled."""
  return max(16, 1 << (max(length, 1) - 1).bit_length())


def make_batch(features: WordFeatures, layers: Sequence[int], sentences: np.ndarray,
               batch_size: int) -> Dict[str, np.ndarray]:
  """Sentences (indices, at most batch_size) -> padded features [B, W, M, H], lengths [B],
  label_ids [B, W] and the loop's example mask [B] (padding rows 0)."""
  lengths = features.offsets[sentences + 1] - features.offsets[sentences]
  width = _bucket(int(lengths.max()))
  m, h = len(layers), features.vectors.shape[-1]
  x = np.zeros((batch_size, width, m, h), np.float16)
  label_ids = np.full((batch_size, width), IGNORE_LABEL, np.int32)
  for b, (s, n) in enumerate(zip(sentences, lengths)):
    start = features.offsets[s]
    x[b, :n] = features.vectors[start:start + n][:, layers]
    label_ids[b, :n] = features.label_ids[start:start + n]
  full_lengths = np.zeros(batch_size, np.int32)
  full_lengths[:len(lengths)] = lengths
  mask = (np.arange(batch_size) < len(sentences)).astype(np.float32)
  return {"features": x, "lengths": full_lengths, "label_ids": label_ids,
          finetuning.EXAMPLE_MASK: mask}


# ------------------------------------------------------------------------------------ training


def make_job(choice: str, config, train: WordFeatures, dev: WordFeatures,
             dev_sentences: Sequence[ner.Sentence], labels: Sequence[str],
             num_layers: int) -> Job:
  """A fresh BiLSTM tagger on one layer choice, trained by the fine-tuning loop's own pure
  `train_step` (runtime.job); evaluated on dev after every epoch."""
  layers = layer_indices(choice, num_layers)
  model = BiLSTMTagger(choice, len(labels), config.lstm_units, config.lstm_layers,
                       config.dropout, kernels=config.model.kernels)
  batch_size = config.global_batch_size
  num_sentences = len(train.offsets) - 1
  steps_per_epoch = max(1, num_sentences // batch_size)
  num_steps = steps_per_epoch * int(config.num_train_epochs)
  tx, schedule = optim.build_optimizer(config.optimizer, config.learning_rate,
                                       int(num_steps * config.warmup_proportion), num_steps,
                                       config.schedule)
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  sample = make_batch(train, layers, np.arange(min(batch_size, num_sentences)), batch_size)
  predict_fn = functools.partial(finetuning.predict_step, model=model)

  def next_batch(step: int):
    # Epoch e's order is a pure function of (seed, e): a resumed run sees the same batches.
    epoch, index = divmod(step, steps_per_epoch)
    perm = np.random.default_rng([config.seed, epoch]).permutation(num_sentences)
    rows = perm[index * batch_size:(index + 1) * batch_size]
    return finetuning.host_slice(make_batch(train, layers, rows, batch_size), batch_size)

  def evaluator(trainer):
    compiled = jax.jit(predict_fn)

    def evaluate_epoch(state, step):
      scores = evaluate(compiled, trainer.par.checkpointable(state).params, dev, dev_sentences,
                        labels, layers, config.eval_batch_size)
      return dict(scores, epoch=step // steps_per_epoch)

    return evaluate_epoch

  return Job(
      name=f"feature-based {choice}", model=model,
      init_state=lambda: TrainState.create(
          nn.unbox(model.init({"params": init_rng}, sample)["params"]), tx),
      param_axes=None,
      train_step=functools.partial(
          finetuning.train_step, model=model, tx=tx, task_loss=heads.token_tagging_loss,
          row_weight=heads.token_tagging_weight, schedule=schedule),
      eval_step=predict_fn, example_batch=lambda rows: sample,
      example_eval_batch=lambda rows: make_batch(train, layers,
                                                 np.arange(min(rows, num_sentences)), rows),
      settings=LoopSettings.from_config(config, num_steps, keep_checkpoints=1,
                                        async_checkpointing=False,
                                        checkpoint_at_evaluations=True),
      batches=lambda: Batches(next_batch), dropout_rng=dropout_rng, evaluator=evaluator,
      eval_at=lambda step: step % steps_per_epoch == 0, console_keys=("loss", "f1"))


def train_choice(choice: str, config, inputs: "Inputs", workdir: str) -> Dict[str, float]:
  """Trains a fresh BiLSTM tagger on one layer choice (checkpoints in `workdir`, so an
  interrupted table resumes); returns dev metrics of the best epoch."""
  if jobs.run(_job_of(choice, config, inputs), workdir, parallel.create(config)).preempted:
    return {"preempted": True}
  epochs = read_metrics(workdir, "eval")
  if not epochs:
    return {}
  best = max(epochs, key=lambda r: r["f1"])
  return {k: v for k, v in best.items() if k not in ("step", "split")}


def evaluate(predict_fn, params, features: WordFeatures, sentences: Sequence[ner.Sentence],
             labels: Sequence[str], layers: Sequence[int], batch_size: int) -> Dict[str, float]:
  """Entity F1 of the tagger on every sentence of a split (the last batch padded)."""
  n = len(features.offsets) - 1
  predicted: List[List[str]] = []
  for start in range(0, n, batch_size):
    index = np.arange(start, min(start + batch_size, n))
    batch = make_batch(features, layers, index, batch_size)
    best = np.asarray(predict_fn(params, batch)["logits"]).argmax(-1)       # [B, W]
    for b, s in enumerate(index):
      predicted.append([labels[k] for k in best[b, :len(sentences[s].words)]])
  return ner.entity_scores([s.labels for s in sentences], predicted)


# ------------------------------------------------------------------------------------ the run


@dataclasses.dataclass
class Inputs:
  """What the taggers train on: every split's word features and sentences, the labels, and the
  encoder's layer count."""
  features: Dict[str, WordFeatures]
  sentences: Dict[str, List[ner.Sentence]]
  labels: List[str]
  num_layers: int


def _sentences(config, split: str) -> List[ner.Sentence]:
  limit = {"train": config.data.max_train_examples, "dev": config.data.max_eval_examples}[split]
  sentences = ner.read_split(config, split)
  return sentences[:limit] if limit else sentences


def read_inputs(config, workdir: str) -> Inputs:
  """The features of train and dev: extracted by the frozen encoder once, then read from the
  cache (`config.cache_dir`, default WORKDIR/features)."""
  loaded_config, pretrained = checkpoints.load_pretrained(config.init_checkpoint)
  bert_config = finetuning.bert_config_for(config, loaded_config)
  tokenizer = finetuning.create_tokenizer(config, bert_config)
  encoder = checkpoints.to_model_layout(pretrained, bert_config)["bert"]
  labels = ner.labels_for(config)
  cache_dir = config.cache_dir or filesystem.join(workdir, "features")
  limits = {"train": config.data.max_train_examples, "dev": config.data.max_eval_examples}
  splits, data = {}, {}
  start = time.time()
  for split in ("train", "dev"):
    sentences = _sentences(config, split)
    path = ner.split_path(config, split)
    key = {"split": split, "checkpoint": filesystem.absolute(config.init_checkpoint),
           "data": path, "size": filesystem.getsize(path), "mtime": filesystem.mtime(path),
           "limit": limits[split], "max_seq_length": config.max_seq_length,
           "document_context": config.document_context, "labels": labels,
           "do_lower_case": config.tokenizer.do_lower_case}
    data[split] = sentences
    splits[split] = cached_extract(
        cache_dir, key, bert_config=bert_config, encoder_params=encoder, tokenizer=tokenizer,
        sentences=sentences, labels=labels, max_seq_length=config.max_seq_length,
        document_context=config.document_context, batch_size=config.eval_batch_size)
  print(f"[feature-based] features of {len(data['train'])} train / {len(data['dev'])} dev "
        f"sentences in {time.time() - start:.1f}s (cache: {cache_dir})", flush=True)
  return Inputs(splits, data, labels, bert_config.num_hidden_layers)


def shape_inputs(config) -> Inputs:
  """Inputs of the right shapes without running the encoder: zero vectors (one broadcast row,
  no memory) for every word of the training sentences, no dev split. What `--compile_for`
  compiles the tagger's step on."""
  bert_config = finetuning.bert_config_for(
      config, checkpoints.load_pretrained_config(config.init_checkpoint))
  sentences = _sentences(config, "train")
  lengths = [len(s.words) for s in sentences]
  offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
  width = (bert_config.num_hidden_layers + 1, bert_config.hidden_size)
  train = WordFeatures(np.broadcast_to(np.zeros((1,) + width, np.float16), (offsets[-1],) + width),
                       offsets, np.zeros(offsets[-1], np.int32))
  dev = WordFeatures(np.zeros((0,) + width, np.float16), np.zeros(1, np.int64),
                     np.zeros(0, np.int32))
  return Inputs({"train": train, "dev": dev}, {"train": sentences, "dev": []},
                ner.labels_for(config), bert_config.num_hidden_layers)


def _job_of(choice: str, config, inputs: Inputs) -> Job:
  return make_job(choice, config, inputs.features["train"], inputs.features["dev"],
                  inputs.sentences["dev"], inputs.labels, inputs.num_layers)


def job(config, workdir: Optional[str] = None, choice: Optional[str] = None) -> Job:
  """The tagger's job of one layer choice (default: the first of `config.layer_choices`;
  `tasks.registry.job`). With `workdir`: on the features `run` trains on (`read_inputs`);
  without: on `shape_inputs` (the encoder is not run), the same step, what `--compile_for`
  compiles."""
  if choice is None:
    if not config.layer_choices:
      raise ValueError("config.layer_choices is empty: no tagger to build")
    choice = config.layer_choices[0]
  inputs = (shape_inputs(config) if workdir is None
            else read_inputs(config, filesystem.absolute(workdir)))
  return _job_of(choice, config, inputs)


def results_table(results: Dict[str, Dict[str, float]]) -> str:
  """Markdown table: layer choice, our dev F1, the paper's (BERT-base) dev F1."""
  lines = ["| layers | dev F1 | paper (BERT-base) |", "|---|---|---|"]
  for choice, scores in results.items():
    paper = PAPER_DEV_F1.get(choice)
    lines.append(f"| {choice} | {100 * scores['f1']:.2f} | "
                 f"{paper if paper is not None else '-'} |")
  return "\n".join(lines)


def run(config, workdir: str) -> Dict:
  """Extracts (or reuses) the cached features, trains one tagger per layer choice, writes
  WORKDIR/results.json and WORKDIR/table.md."""
  workdir = filesystem.absolute(workdir)
  filesystem.makedirs(workdir)
  inputs = read_inputs(config, workdir)
  data = inputs.sentences
  results = {}
  for choice in config.layer_choices:
    t = time.time()
    results[choice] = train_choice(choice, config, inputs,
                                   filesystem.join(workdir, "choices", choice))
    if results[choice].get("preempted"):
      return {"task": f"ner_feature_based_{config.dataset}", "preempted": True}
    results[choice]["seconds"] = round(time.time() - t, 1)
  table = results_table(results)
  print(table, flush=True)
  out = {"task": f"ner_feature_based_{config.dataset}", "init_checkpoint": config.init_checkpoint,
         "num_train_sentences": len(data["train"]), "num_dev_sentences": len(data["dev"]),
         "lstm_units": config.lstm_units, "dev": results, "paper_dev_f1": PAPER_DEV_F1}
  if outputs.is_writer():
    filesystem.write_text(filesystem.join(workdir, finetuning.RESULTS_FILE),
                          json.dumps(out, indent=2, sort_keys=True))
    filesystem.write_text(filesystem.join(workdir, "table.md"), table + "\n")
  return out
