"""benchmarks/time_to_quality end to end at toy scale: prepare, the four sides, fine-tune, report.

The real benchmark pre-trains BERT-mini (and a ModernBERT-family model of its size) for an hour
per side on ../shared/data; here a few generated documents (written to tmp_path: the shared data
is not on a user's machine), BERT-tiny's shape at seq 32, and one GLUE task of the fixtures with
one seed check that every stage's outputs exist and fit together: every side leaves a held-out
curve on both fixed sets and a checkpoint that bert_jax loads and fine-tunes, and the table and
plot are written, naming the sides not run. BERT's two sides run a fixed few steps (no
calibration, the fast tier); the modern sides run on a budget of seconds with their calibration,
and resume exactly from a checkpoint on the batch ramp (the slow tier). The pieces with logic of
their own (documents from the two text formats, the step count from a calibration, the modern
plan through the ramp, the ramp's batches, the per-task subsets) are checked directly.
"""
import argparse
import importlib.util
import json
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("torch", reason="the transformers side of the benchmark needs torch")
pytest.importorskip("transformers", reason="the transformers side needs transformers")
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")

from benchmarks.time_to_quality import (cli, clocks, common, corpus, finetune,  # noqa: E402
                                        hf_side, modern, prepared, report, schedule)
from bert_jax.io import checkpoints  # noqa: E402
from bert_jax.families.modernbert import config as modern_config  # noqa: E402
from tests import finetuning_fixtures  # noqa: E402

WORDS = finetuning_fixtures.WORDS[:-3]


def _sentence(rng) -> str:
  return " ".join(rng.choice(WORDS, size=int(rng.integers(4, 10)))) + " ."


def _write_texts(root) -> str:
  """Two files in the corpus's formats: one sentence per line (with a heading and a bracketed
  note, as the Gutenberg books), and raw paragraphs with speaker lines (as tinyshakespeare)."""
  rng = np.random.default_rng(0)
  os.makedirs(root / "gutenberg")
  lines = ["[ A Book by Someone 1900 ]"]
  for chapter in range(1, 13):
    lines.append(f"Chapter {chapter}")
    lines += [_sentence(rng) for _ in range(12)]
  (root / "gutenberg" / "book.txt").write_text("\n".join(lines) + "\n")
  speeches = []
  for i in range(60):
    speeches.append(f"Speaker {'AB'[i % 2]}:\n" + "\n".join(
        _sentence(rng).capitalize() for _ in range(2)))
  (root / "play.txt").write_text("\n\n".join(speeches) + "\n")
  return str(root)


def test_documents_from_both_formats(tmp_path):
  text_dir = _write_texts(tmp_path / "text")
  docs = list(corpus.text_documents(text_dir, sentences_per_document=8))
  book = [d for d in docs if not d[0][0].isupper()]
  play = [d for d in docs if d[0][0].isupper()]
  # 12 chapters of 12 sentences: each chapter heading ends a document (8 + 4 sentences).
  assert sorted({len(d) for d in book}) == [4, 8] and len(book) == 24
  assert not any(s.startswith("[") or s.startswith("Chapter") for d in docs for s in d)
  assert not any(s.startswith("Speaker") for d in play for s in d)   # speaker lines dropped
  assert sum(len(d) for d in play) == 120


def test_calibration_sets_the_steps_that_fill_the_budget():
  calibration = schedule.Calibration.from_windows([(10, 25.0), (10, 20.0), (10, 20.0)])
  assert calibration.steps_per_sec == pytest.approx(0.5)
  assert calibration.startup_seconds == pytest.approx(5.0)
  assert calibration.steps_for(3600.0) == int((3600 - 5) * 0.5)
  assert schedule.every(180.0, 0.5, multiple=20) == 80 and schedule.every(1.0, 0.5, multiple=20) == 20
  assert finetune.parse_subsets("sst2=20000,cola=0") == {"sst2": 20000, "cola": 0}


def test_clock_stops_and_restarts():
  clock = clocks.Clock(10.0)
  clock.start()
  first = clock.stop()
  assert first >= 10.0 and clock.stop() == first       # stopped: no time passes
  clock.start()
  assert clock.read() >= first


FLAGS = ["--size=tiny", "--seq=32", "--batch=8", "--max_predictions=5", "--log_every=2"]
FINETUNE = ["--tasks=rte", "--seeds=1", "--ft_max_seq=32", "--ft_batch=4", "--ft_epochs=1",
            "--ft_length_bucket=0"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
  """OUT/data prepared once at toy scale (both parts), and a GLUE folder of the fixtures; each
  test copies the data into an OUT of its own."""
  # Python's documentation as the third source: its first documents only. The package's
  # `documents(max_documents)` reads every standard-library docstring before counting (~7 s).
  from data_pipelines import demo_corpus
  root = tmp_path_factory.mktemp("ttq_data")
  rng = np.random.default_rng(1)
  out = str(root / "out")
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(demo_corpus, "documents", lambda max_documents=0: iter(
        [[_sentence(rng) for _ in range(6)] for _ in range(max_documents or 5)]))
    cli.main(FLAGS + [f"--out={out}", "--prepare", f"--text_dir={_write_texts(root / 'text')}",
                      "--demo_documents=3", "--sentences_per_document=8", "--holdout_every=5",
                      "--vocab_size=300", "--dupe_factor=2", "--eval_sequences=64",
                      "--data_workers=1"])
  glue_dir = finetuning_fixtures.write_glue_dir(str(root / "glue"), dict(train=16, dev=8, test=2))
  return dict(data=os.path.join(out, "data"), glue_dir=glue_dir)


def _out_with_data(tiny_data, tmp_path) -> str:
  out = str(tmp_path / "out")
  shutil.copytree(tiny_data["data"], os.path.join(out, "data"))
  return out


def _torch_scores_alike(out: str, side: str, check: dict, tmp_path) -> None:
  """The jax side's checkpoint, exported to transformers' class of its family and scored by the
  transformers sides' scorer, scores as the jax sides' scorer scored it: every side is scored
  alike."""
  import transformers
  config, params = checkpoints.load_params_from_workdir(os.path.join(out, side, "workdir"))
  directory = str(tmp_path / f"{side}_exported")
  checkpoints.export_huggingface(config, params, directory)
  family = (transformers.ModernBertForMaskedLM if config.architecture == "modernbert"
            else transformers.BertForPreTraining)
  scores = hf_side.score_sets(family.from_pretrained(directory), prepared.load_eval_sets(out))
  assert set(scores) == set(check), side
  for name, value in check.items():
    assert scores[name] == pytest.approx(value, rel=1e-4, abs=1e-5), (side, name)


@pytest.mark.slow
def test_end_to_end_tiny(tiny_data, tmp_path):
  out = _out_with_data(tiny_data, tmp_path)
  plot = str(tmp_path / "curve.png")
  flags = FLAGS + [f"--out={out}", f"--plot={plot}"]
  info = prepared.read_data_info(out)
  assert info["instances"]["train"] > 8 and info["eval_batches"] == 1
  assert info["documents"]["train"].get("python_docs", 0) + info["documents"]["eval"].get(
      "python_docs", 0) == 3
  arrays = np.load(prepared.data_paths(out)["train_instances.npz"])
  assert len(arrays["lengths"]) == info["instances"]["train"]
  # The contiguous-text part: the same documents as full rows, no NSP labels, the held-out rows
  # masked at 15% as the pairs are.
  part = info["contiguous"]
  rows = np.load(prepared.data_paths(out)["train_contiguous_instances.npz"])
  assert sorted(rows.files) == ["input_ids", "lengths"]
  assert len(rows["lengths"]) == part["instances"]["train"] and part["eval_batches"] >= 1
  assert np.mean(rows["lengths"] == 32) > 0.8                  # full rows but each pass's last
  sets = prepared.load_eval_sets(out)
  assert "next_sentence_labels" not in sets["text"][0]
  masked = sum(b["masked_lm_weights"].sum() for b in sets["text"])
  assert masked / sum(b["input_mask"].sum() for b in sets["text"]) == pytest.approx(0.15, abs=0.04)

  # A fixed few steps per side (1 step/s assumed): checkpoints every 2 steps, evaluations every
  # 2 steps (bert_jax: a multiple of --log_every) or after every step (transformers: its clock).
  pretrain = flags + ["--max_steps=4", "--eval_every_minutes=0.0001",
                      "--checkpoint_every_minutes=0.034"]
  done = cli.main(pretrain + ["--side=bert_jax", "--side=transformers"])
  for side in ("bert_jax", "transformers"):
    curve = common.read_jsonl(os.path.join(out, side, "curve.jsonl"))
    assert [r["step"] for r in curve][-1] == 4, side
    for eval_set in common.EVAL_SETS:   # every side is scored on both fixed sets
      assert all(np.isfinite(common.metric(r, eval_set, "mlm_loss")) for r in curve), side
    assert all(0 <= r["pairs_nsp_accuracy"] <= 1 and "text_nsp_accuracy" not in r
               for r in curve), side
    assert all(r["seconds"] > 0 for r in curve), side
    assert [r["seconds"] for r in curve] == sorted(r["seconds"] for r in curve), side
    config, params = checkpoints.load_pretrained(finetune.checkpoint_of(cli.parse_args(
        ["--report", f"--out={out}"]), side))
    assert config.vocab_size == info["vocab_size"] and "cls" in params, side
  # The loop's evaluation of the state and the saved checkpoint (what fine-tuning reads) score
  # alike on the fixed batches.
  jax_summary = done["bert_jax"]
  for name in ("pairs_mlm_loss", "text_mlm_loss"):
    assert jax_summary["checkpoint_check"][name] == pytest.approx(jax_summary["final"][name],
                                                                  rel=1e-5)
  assert len(common.read_jsonl(os.path.join(out, "transformers", "curve.jsonl"))) >= 2
  _torch_scores_alike(out, "bert_jax", jax_summary["checkpoint_check"], tmp_path)

  done = cli.main(flags + ["--finetune", f"--glue_dir={tiny_data['glue_dir']}"] + FINETUNE)
  result = done["report"]
  assert set(result["finetune"]) == {"bert_jax", "transformers"}   # the modern sides: not run
  assert set(result["average"]) == {"bert_jax", "transformers"}
  with open(os.path.join(out, "time_to_quality.md")) as f:
    table = f.read()
  assert "| RTE | accuracy |" in table and "**average**" in table
  for side in ("bert_jax_modern", "hf_modern"):
    assert f"| {side} | modern | not run |" in table
  assert "Not fine-tuned yet: bert_jax_modern, hf_modern." in table
  assert "not yet measured" in table
  with open(os.path.join(out, "time_to_quality.json")) as f:
    assert json.load(f)["pretraining"]["transformers"]["steps"] == 4
  if importlib.util.find_spec("matplotlib") is not None:
    assert os.path.getsize(plot) > 0


MODERN = ["--batch_warmup_start=2", "--batch_warmup_fraction=0.25", "--local_attention=16",
          "--modern_lr=2e-3"]


@pytest.mark.slow
def test_modern_sides_on_a_budget_of_seconds(tiny_data, tmp_path):
  """Both modern sides as the benchmark runs them (calibration, plan, training on the ramp,
  evaluation on both sets, the final checkpoint), then fine-tuned, then the report of all four."""
  pytest.importorskip("optimi", reason="the hf_modern side's StableAdamW is torch-optimi's")
  out = _out_with_data(tiny_data, tmp_path)
  plot = str(tmp_path / "curve.png")
  flags = FLAGS + MODERN + [f"--out={out}", f"--plot={plot}"]
  done = cli.main(flags + ["--side=bert_jax_modern", "--side=hf_modern", "--budget_minutes=0.4",
                           "--calibration_steps=2", "--eval_every_minutes=0.05",
                           "--checkpoint_every_minutes=0.1"])
  info = prepared.read_data_info(out)
  for side in ("bert_jax_modern", "hf_modern"):
    summary = done[side]
    plan = schedule.Plan.from_json(summary["plan"])
    assert plan.calibration.steps_per_sec > 0 and len(plan.calibration.windows) == 3, side
    assert plan.batch_warmup_start == 2 and plan.decay_steps >= 0, side
    curve = common.read_jsonl(os.path.join(out, side, "curve.jsonl"))
    assert curve[-1]["step"] == plan.num_train_steps == summary["steps"], side
    assert summary["sequences"] == plan.sequences() <= 8 * plan.num_train_steps, side
    for eval_set in common.EVAL_SETS:
      assert all(np.isfinite(common.metric(r, eval_set, "mlm_loss")) for r in curve), side
    assert not any("pairs_nsp_accuracy" in r for r in curve), side   # no NSP head
    config, params = checkpoints.load_pretrained(finetune.checkpoint_of(cli.parse_args(
        ["--report", f"--out={out}"]), side))
    assert config.architecture == "modernbert" and config.vocab_size == info["vocab_size"], side
    # BERT-tiny's I: 512
    assert config.intermediate_size == modern_config.glu_width(512) == 320, side
    assert config.local_attention == 16 and config.classifier_pooling == "mean", side
  check, final = done["bert_jax_modern"]["checkpoint_check"], done["bert_jax_modern"]["final"]
  assert check["text_mlm_loss"] == pytest.approx(final["text_mlm_loss"], rel=1e-5)
  _torch_scores_alike(out, "bert_jax_modern", check, tmp_path)
  hf_config = json.load(open(os.path.join(out, "hf_modern", "final", "config.json")))
  assert hf_config["model_type"] == "modernbert" and hf_config["sparse_prediction"]

  done = cli.main(flags + ["--finetune", f"--glue_dir={tiny_data['glue_dir']}"] + FINETUNE)
  result = done["report"]
  assert set(result["average"]) == {"bert_jax_modern", "hf_modern"}
  with open(os.path.join(out, "time_to_quality.md")) as f:
    table = f.read()
  assert "| bert_jax | bert | not run |" in table and "| transformers | bert | not run |" in table
  assert "| RTE | accuracy |" in table
  assert "- bert_jax_modern at least equal to hf_modern on the GLUE average" in table
  assert "sustained)" in table   # the steps-per-hour ratio of the two modern sides
  if importlib.util.find_spec("matplotlib") is not None:
    assert os.path.getsize(plot) > 0


def _interrupted_at(out: str, side: str, step: int) -> None:
  """OUT/<side> as a run killed after its checkpoint at `step` leaves it."""
  side_dir = os.path.join(out, side)
  os.remove(os.path.join(side_dir, "summary.json"))
  if common.FRAMEWORK[side] == "torch":
    shutil.rmtree(os.path.join(side_dir, "final"))
    for name in os.listdir(os.path.join(side_dir, "trainer")):
      if int(name.split("-")[1]) > step:
        shutil.rmtree(os.path.join(side_dir, "trainer", name))
  else:
    folder = os.path.join(side_dir, "workdir", "checkpoints")
    for name in os.listdir(folder):
      if name.isdigit() and int(name) > step:
        shutil.rmtree(os.path.join(folder, name))


@pytest.mark.slow
@pytest.mark.parametrize("side", ["bert_jax_modern", "hf_modern"])
def test_modern_side_resumes_on_the_ramp(tiny_data, tmp_path, monkeypatch, side):
  """A modern side killed after its checkpoint at step 4 (ModernBERT's ramp, the batch still rising:
  2, 2, 4, 6 | 6, 8, 8, 8 rows) and run again trains steps 5-8 on the rows the uninterrupted run
  trained them on. bert_jax ends exactly as the uninterrupted run (the same held-out curve).
  transformers' Trainer restores its random state only after it has drawn the first batch of the
  resumed run (`_inner_training_loop`'s `rng_to_sync`, transformers 5.24), so the collator's masks
  differ from there on: the same rows, other masks, as on the BERT recipe's transformers side."""
  if side == "hf_modern":
    pytest.importorskip("optimi", reason="the hf_modern side's StableAdamW is torch-optimi's")
  out = _out_with_data(tiny_data, tmp_path)
  read = []   # the training rows the transformers side reads, in order
  get = hf_side.InstanceDataset.__getitem__
  monkeypatch.setattr(hf_side.InstanceDataset, "__getitem__",
                      lambda self, i: read.append(i) or get(self, i))
  command = FLAGS + MODERN + [f"--out={out}", f"--side={side}", "--max_steps=8",
                              "--eval_every_minutes=0.0001", "--checkpoint_every_minutes=0.067"]
  cli.main(command)   # 1 step/s assumed: checkpoints every 4 steps
  plan = schedule.Plan.from_json(json.load(open(os.path.join(out, side, "plan.json"))))
  assert [plan.rows(s) for s in range(8)] == [2, 2, 4, 6, 6, 8, 8, 8]
  whole, rows = common.read_jsonl(os.path.join(out, side, "curve.jsonl")), list(read)
  _interrupted_at(out, side, 4)
  read.clear()
  cli.main(command)
  resumed = common.read_jsonl(os.path.join(out, side, "curve.jsonl"))
  assert [r["step"] for r in resumed] == [r["step"] for r in whole]
  names = ("pairs_mlm_loss", "text_mlm_loss", "text_mlm_accuracy")
  for before, after in zip(whole, resumed):
    if side == "bert_jax_modern" or after["step"] <= 4:
      for name in names:
        assert after[name] == pytest.approx(before[name], rel=1e-5, abs=1e-6), (side, after)
    else:
      assert all(np.isfinite(after[name]) for name in names)
  if side == "hf_modern":
    assert len(rows) == plan.sequences() == 44 and read == rows[plan.sequences(4):]


def test_modern_plan_trains_the_budgets_tokens_through_the_ramp():
  args = argparse.Namespace(budget_minutes=60.0, max_steps=0, batch=64, batch_warmup_start=16,
                            batch_warmup_fraction=0.1, warmup_proportion=0.05,
                            decay_fraction=0.2, log_every=20, eval_every_minutes=3.0,
                            checkpoint_every_minutes=5.0)
  calibration = schedule.Calibration(0.5, 30.0, ())
  hf = schedule.make_plan(args, "hf_modern", calibration, seq=128)
  full = int((3600 - 30) * 0.5)                       # steps of 64 rows that fill the budget
  assert hf.sequences() >= full * 64 > hf.sequences(hf.num_train_steps - 1)
  ramp = hf.ramp()
  assert ramp.tokens == pytest.approx(0.1 * full * 64 * 128)
  assert [hf.rows(0), hf.rows(hf.num_train_steps - 1)] == [16, 64]
  assert hf.sequences(hf.warmup_steps) >= 0.05 * full * 64 > hf.sequences(hf.warmup_steps - 1)
  assert hf.decay_steps == round(0.2 * hf.num_train_steps)
  # 4 batch sizes on the ramp: bert_jax compiles its step 3 more times, charged the start-up.
  jax = schedule.make_plan(args, "bert_jax_modern", calibration, seq=128)
  assert jax.sequences() >= int((3600 - 4 * 30) * 0.5) * 64 > jax.sequences(
      jax.num_train_steps - 1)
  assert jax.eval_every_steps % 20 == 0 and hf.eval_every_steps > 0
  bert = schedule.make_plan(args, "bert_jax", calibration, seq=128)
  assert bert.num_train_steps == full and bert.ramp() is None and bert.decay_steps == 0
  with pytest.raises(ValueError, match="batch_warmup_start"):
    schedule.make_plan(argparse.Namespace(**dict(vars(args), batch_warmup_start=24)),
                       "hf_modern", calibration, seq=128)


def test_ramp_batch_sampler_gives_each_step_its_rows_from_seeded_permutations():
  sampler = hf_side.RampBatchSampler(10, [2, 2, 4, 8], seed=3)
  batches = list(sampler)
  assert len(sampler) == 4 and [len(b) for b in batches] == [2, 2, 4, 8]
  assert sorted(sum(batches[:3], []) + batches[3][:2]) == list(range(10))   # a whole pass first
  assert batches == list(hf_side.RampBatchSampler(10, [2, 2, 4, 8], seed=3))


def test_the_transformers_sides_mask_with_the_records_ids(tmp_path):
  """The transformers sides' tokenizer is the benchmark's vocabulary ([MASK], [CLS], [SEP] at
  their lines, as in the records), so their collator masks with the records' [MASK], draws
  random ids from the whole vocabulary and never masks [CLS] or [SEP]. (transformers 5 ignores
  `vocab_file=`: the sides trained with [MASK] = 4 of a 5-token vocabulary until 2026-11-26.)"""
  import torch
  from bert_jax.text import tokenization
  words = [w.lower() for w in WORDS]
  vocab = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]",
                                                              "[MASK]"] + sorted(set(words)))
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(vocab) + "\n")
  tokenizer = hf_side.hf_tokenizer(str(path))
  ours = tokenization.FullTokenizer(str(path), do_lower_case=True)
  text = " ".join(words[:12])
  assert tokenizer(text)["input_ids"][1:-1] == ours.convert_tokens_to_ids(ours.tokenize(text))
  cls_id, sep_id, mask_id = 101, 102, 103
  assert (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id) == (
      cls_id, sep_id, mask_id)
  rows = np.full((64, 40), sep_id)
  rows[:, 0] = cls_id
  rows[:, 1:-1] = np.random.default_rng(0).integers(104, len(vocab), size=(64, 38))
  np.savez(tmp_path / "rows.npz", input_ids=rows, lengths=np.full(64, 40))
  dataset = hf_side.InstanceDataset(str(tmp_path / "rows.npz"), tokenizer.cls_token_id,
                                    tokenizer.sep_token_id)
  torch.manual_seed(0)
  batch = hf_side.mlm_collator(tokenizer, 0.3)([dataset[i] for i in range(64)])
  inputs, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
  chosen = labels != -100
  assert not chosen[:, 0].any() and not chosen[:, -1].any()      # [CLS] and [SEP] kept
  assert 0.25 < chosen.mean() * 40 / 38 < 0.35
  assert 0.7 < (inputs[chosen] == mask_id).mean() < 0.9
  assert inputs.max() < len(vocab) and (inputs[chosen] > mask_id).mean() > 0.1


def test_modern_shape_matches_berts_mlp_weights():
  assert modern_config.glu_width(1024) == 704 and modern_config.glu_width(512) == 320
  assert modern.max_predictions(0.30, 128) == 40 and modern.max_predictions(0.30, 32) == 16


def test_last_within_picks_the_last_evaluation_inside_the_budget():
  curve = [dict(seconds=s, mlm_loss=10.0 - s / 100) for s in (100.0, 3500.0, 3600.0, 3700.0)]
  assert report.last_within(curve, 3600.0)["seconds"] == 3600.0
  assert report.last_within(curve, 3599.0)["seconds"] == 3500.0
  assert report.last_within(curve, 50.0) is None


def test_finetune_takes_the_sides_that_finished_pretraining(tmp_path):
  for side in ("bert_jax", "hf_modern"):
    common.write_json(str(tmp_path / side / "summary.json"), {})
  os.makedirs(tmp_path / "bert_jax_modern" / "workdir")      # started, not finished
  args = cli.parse_args(["--finetune", f"--out={tmp_path}"])
  assert finetune.pretrained_sides(args) == ["bert_jax", "hf_modern"]
  args.ft_sides = "hf_modern"
  assert finetune.pretrained_sides(args) == ["hf_modern"]
  args.ft_sides = "bert_jax_modern"
  with pytest.raises(FileNotFoundError, match="--side=bert_jax_modern"):
    finetune.pretrained_sides(args)


def test_the_plot_goes_to_out_unless_named(tmp_path):
  # A stage run on some sides must not overwrite the committed plot of all four.
  args = cli.parse_args(["--finetune", f"--out={tmp_path}"])
  assert args.plot == str(tmp_path / "time_to_quality.png")
  args = cli.parse_args(["--report", f"--out={tmp_path}", "--plot=elsewhere.png"])
  assert args.plot == "elsewhere.png"
