"""experiments/continue_pretraining.py: the architecture, vocabulary and casing come from the
checkpoint; records are built from the user's text with that vocabulary; heads the checkpoint has
are loaded, those it lacks are initialised and named; held-out metrics at step 0 and after."""
import json
import os

import jax
import numpy as np
import pytest

from bert_jax.io import checkpoints
from bert_jax.model import layers
from bert_jax.families.bert import model as bert_model
from bert_jax.runtime.metric_writers import read_metrics
from bert_jax.tasks.jobs import pretraining
from bert_jax.tasks import registry
from experiments import continue_pretraining
from tests import finetuning_fixtures as fx


def _config(checkpoint, vocab_file="", **data):
  c = continue_pretraining.get_config("quick")
  c.init_checkpoint = checkpoint
  c.tokenizer.vocab_file = vocab_file
  c.data.update(data)
  return c


def _write_text(path, documents):
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n\n".join("\n".join(doc) for doc in documents) + "\n")
  return path


def test_quick_run_takes_everything_from_the_checkpoint(tmp_path, capsys):
  checkpoint = fx.write_checkpoint(str(tmp_path / "ckpt"))   # encoder + MLM + NSP heads
  rng = np.random.default_rng(0)
  docs = [[fx.sentence(rng) + " ." for _ in range(6)] for _ in range(25)]
  text = _write_text(str(tmp_path / "corpus.txt"), docs)
  workdir = str(tmp_path / "run")
  result = registry.run_job(_config(checkpoint, text_files=text), workdir)
  out = capsys.readouterr().out
  assert f"Continuing {checkpoint}: L=2, H=32, A=2" in out
  assert "initialised from scratch" not in out        # both heads came from the checkpoint
  # Records with the checkpoint's vocabulary, from the user's documents (every 20th held out).
  assert open(tmp_path / "run" / "data" / "train.txt").read().count("\n\n") == 23
  saved = checkpoints.read_config(str(tmp_path / "run" / "bert_config.json"))
  assert (saved.hidden_size, saved.vocab_size) == (32, len(fx.VOCAB))
  evals = [m for m in read_metrics(workdir) if m.get("split") == "eval"]
  assert [m["step"] for m in evals] == [0, 4]
  assert np.isfinite(result["eval_loss"])


@pytest.mark.slow
def test_heads_missing_from_the_checkpoint_are_named(tmp_path, capsys):
  config = fx.tiny_bert_config()
  encoder = layers.init_params(bert_model.BertForPreTraining(config), jax.random.PRNGKey(1))
  checkpoint = str(tmp_path / "hf")
  checkpoints.export_huggingface(config, {"bert": encoder["bert"]}, checkpoint)  # BertModel
  with open(os.path.join(checkpoint, "vocab.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(fx.VOCAB) + "\n")
  with open(os.path.join(checkpoint, "tokenizer_config.json"), "w") as f:
    json.dump({"do_lower_case": False}, f)
  c = _config(checkpoint)
  c.num_train_steps = 2
  registry.run_job(c, str(tmp_path / "run"))
  out = capsys.readouterr().out
  assert "has no cls/predictions, cls/seq_relationship: initialised from scratch" in out
  assert "cased)" in out                                         # tokenizer_config.json's casing
  # The casing is derived for the run; the config given is left as it was.
  assert pretraining.adopt_checkpoint(c)["tokenizer.do_lower_case"] is False
  assert c.tokenizer.do_lower_case is True and c.model.hidden_size == 768


def test_a_longer_sequence_than_the_position_table_is_a_clear_error(tmp_path):
  checkpoint = fx.write_checkpoint(str(tmp_path / "ckpt"))   # max_position_embeddings=64
  c = _config(checkpoint)
  c.max_seq_length = 128
  with pytest.raises(ValueError, match=r"max_seq_length=128 exceeds the position table.*"
                                       r"max_position_embeddings=64"):
    registry.run_job(c, str(tmp_path / "run"))


def test_a_vocabulary_of_another_size_is_a_clear_error(tmp_path):
  checkpoint = fx.write_checkpoint(str(tmp_path / "ckpt"))
  other = tmp_path / "other_vocab.txt"
  other.write_text("\n".join(fx.VOCAB[:-1]) + "\n")
  c = _config(checkpoint, vocab_file=str(other))
  with pytest.raises(ValueError, match=f"has {len(fx.VOCAB) - 1} entries but .* vocab_size="
                                       f"{len(fx.VOCAB)}"):
    pretraining.adopt_checkpoint(c)
