"""The embedding job (`config.task=embeddings`): the loss is sentence-transformers'
MultipleNegativesRankingLoss (and its symmetric form), 8 devices gathering their negatives equal
one device with the whole batch, gradient caching equals the plain step, the `:quick` run
through the loop resumes exactly and keeps the best model with `embedding.json`, and a bad line
of the pairs file is named by file and line."""
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import tasks
from bert_jax.io import checkpoints
from bert_jax.model import ranking_loss
from bert_jax.runtime import step as step_core
from bert_jax.runtime.metric_writers import TIMING_FIELDS, read_metrics
from bert_jax.tasks.framework import finetuning
from bert_jax.tasks.jobs import embedding_data, embeddings
from tests import embedding_fixtures as efx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))


def _embeddings(batch=6, negatives=2, hidden=16, seed=0):
  rng = np.random.default_rng(seed)
  draw = lambda *shape: rng.normal(size=shape).astype(np.float32)
  return draw(batch, hidden), draw(batch, hidden), draw(batch, negatives, hidden)


def _ours(queries, positives, negatives, mask=None, **kwargs):
  loss = jax.value_and_grad(
      lambda q, p, n: jnp.mean(ranking_loss.ranking(q, p, n, mask, **kwargs)["loss"]),
      argnums=(0, 1, 2))
  value, grads = loss(queries, positives, negatives)
  return float(value), [np.asarray(g) for g in grads]


@pytest.mark.parametrize("negatives, symmetric", [(0, False), (2, False), (0, True), (3, True)])
def test_the_loss_is_sentence_transformers_multiple_negatives_ranking_loss(negatives, symmetric):
  torch = pytest.importorskip("torch", reason="the reference loss is PyTorch's")
  st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses",
                                  reason="the reference loss is sentence-transformers'")
  queries, positives, hard = _embeddings(negatives=negatives)
  # The symmetric loss as MultipleNegativesSymmetricRankingLoss defines it (deprecated there in
  # favour of these arguments).
  options = (dict(directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction")
             if symmetric else {})
  reference = st_losses.MultipleNegativesRankingLoss(None, scale=20.0, **options)
  tensors = [torch.tensor(x, requires_grad=True)
             for x in [queries, positives] + [hard[:, k] for k in range(negatives)]]
  theirs = reference.compute_loss_from_embeddings(tensors, None)
  theirs.backward()
  ours, grads = _ours(queries, positives, hard, scale=20.0, symmetric=symmetric)
  assert ours == pytest.approx(float(theirs.detach()), rel=1e-5, abs=1e-6)
  np.testing.assert_allclose(grads[0], tensors[0].grad.numpy(), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(grads[1], tensors[1].grad.numpy(), rtol=1e-4, atol=1e-6)
  for k in range(negatives):
    np.testing.assert_allclose(grads[2][:, k], tensors[2 + k].grad.numpy(), rtol=1e-4,
                               atol=1e-6)


def test_an_empty_negative_slot_is_never_scored():
  """A row with fewer hard negatives than the step holds: its empty slots are as if absent."""
  queries, positives, hard = _embeddings(batch=4, negatives=2)
  mask = np.ones((4, 2), np.float32)
  mask[1, 1] = mask[3, 0] = 0.0
  got = np.asarray(ranking_loss.ranking(queries, positives, hard, mask)["loss"])
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  documents = np.concatenate([positives, hard[mask == 1]])          # the real candidates only
  scores = 20.0 * unit(queries) @ unit(documents).T
  expected = np.log(np.exp(scores).sum(1)) - np.diag(scores[:, :4])
  np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_a_bad_line_is_named_by_file_and_line(tmp_path):
  good = '{"query": "a", "positive": "b"}'
  cases = {"{not json": "not JSON", "[1, 2]": "expected an object",
           '{"query": "a"}': '"positive" is missing',
           '{"query": "a", "positive": "b", "postive": "c"}': "unknown key",
           '{"query": "", "positive": "b"}': '"query" must be a non-empty string',
           '{"query": "a", "positive": "b", "negative": 3}': '"negative" must be a string or '
                                                            "a list",
           '{"query": "a", "positive": "b", "negative": ["c", 4]}': '"negative" must be a '
                                                                   "non-empty string"}
  path = tmp_path / "pairs.jsonl"
  for line, why in cases.items():
    path.write_text(f"{good}\n\n{good}\n{line}\n{good}\n")
    with pytest.raises(embedding_data.BadPairsLine, match=f"{path}, line 4: {why}"):
      embedding_data.read_pairs(str(path))
  # Through the job, before anything is built.
  config = efx.quick_config(str(tmp_path / "run"))
  lines = open(config.data.train_file, encoding="utf-8").read().splitlines()
  lines[4] = '{"query": "a", "positive": 7}'
  open(config.data.train_file, "w", encoding="utf-8").write("\n".join(lines) + "\n")
  with pytest.raises(embedding_data.BadPairsLine, match=r"pairs.jsonl, line 5: \"positive\""):
    tasks.run(config, str(tmp_path / "run" / "workdir"))


def test_pairs_become_queries_documents_and_negative_slots(tmp_path):
  from tests import finetuning_fixtures as ftx
  from bert_jax.text import tokenization
  tokenizer = tokenization.FullTokenizer(ftx.write_checkpoint(str(tmp_path)) + "/vocab.txt")
  path = tmp_path / "pairs.jsonl"
  path.write_text('{"query": "the cat", "positive": "a dog", "negative": ["the mat", "a tree"]}\n'
                  '{"query": "a car", "positive": "the road", "negative": "a man"}\n'
                  '{"query": "who", "positive": "what"}\n')
  rows = embedding_data.read_pairs(str(path))
  config = efx.quick_config(str(tmp_path / "c"))
  assert embedding_data.negatives_per_row(config, rows) == 2
  arrays = embedding_data.encode(tokenizer, rows, 6, 8, 2)
  assert arrays["query_ids"].shape == (3, 6) and arrays["document_ids"].shape == (3, 3, 8)
  np.testing.assert_array_equal(arrays["negative_mask"], [[1, 1], [1, 0], [0, 0]])
  cls, sep = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
  assert list(arrays["document_ids"][1, 1, :4]) == [cls, tokenizer.vocab["a"],
                                                    tokenizer.vocab["man"], sep]
  assert embedding_data.encode(tokenizer, rows, 6, 8, 1)["negative_mask"].tolist() == [
      [1], [1], [0]]


def _objective_gradients(config, chunk: int):
  """(loss, gradients) of the job's objective on one batch of 8 pairs, on one device, plain
  (`chunk`=0) or by gradient caching with `chunk` rows at a time."""
  job = embeddings.job(config)
  state = jax.jit(job.init_state)()
  inputs = embeddings.read_inputs(config, os.path.dirname(config.data.train_file))
  batch = {k: v[:8] for k, v in inputs.arrays.items()}
  objective = embeddings.embedding_objective(job.model, config.embedding.scale,
                                             config.embedding.symmetric)

  @jax.jit
  def run(params, batch):
    totals = objective.totals(batch)
    grads, terms = step_core.gradients(params, batch, jax.random.PRNGKey(3), objective, totals,
                                       grad_cache_rows=chunk)
    return objective.loss(terms, totals), grads
  return run(state.params, batch)


@pytest.mark.parametrize("symmetric", [False, True])
def test_gradient_caching_gives_the_plain_steps_gradient(tmp_path, symmetric):
  config = efx.quick_config(str(tmp_path), **{"embedding.symmetric": symmetric})
  plain_loss, plain = _objective_gradients(config, 0)
  # Relative to the largest gradient: some are zero but for rounding (the attention keys' bias,
  # which adds the same logit to every key of a query).
  scale = max(float(np.max(np.abs(g))) for g in jax.tree_util.tree_leaves(plain))
  for chunk in (2, 4):
    loss, cached = _objective_gradients(config, chunk)
    assert float(loss) == pytest.approx(float(plain_loss), rel=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(cached),
                            jax.tree_util.tree_leaves(plain)):
      np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, rtol=0,
                                 atol=1e-5, err_msg=jax.tree_util.keystr(path))
  with pytest.raises(ValueError, match="grad_cache_chunk=3: each of the 1 data-parallel"):
    _objective_gradients(config, 3)


def test_length_buckets_cut_the_batch_and_leave_loss_and_gradient_as_they_were(tmp_path):
  # Texts of a few words, padded to 16 (queries) and 32 (documents) tokens.
  config = efx.quick_config(str(tmp_path), length_bucket=4, global_batch_size=8,
                            max_seq_length=32, **{"data.max_query_length": 16})
  inputs = embeddings.read_inputs(config, str(tmp_path))
  job = embeddings.make_job(config, inputs)
  state = jax.jit(job.init_state)()
  objective = embeddings.embedding_objective(job.model, config.embedding.scale, False)

  @jax.jit
  def loss_and_gradients(params, batch):
    totals = objective.totals(batch)
    grads, terms = step_core.gradients(params, batch, jax.random.PRNGKey(3), objective, totals)
    return objective.loss(terms, totals), grads
  next_batch = job.batches().next_batch
  order = finetuning.TrainOrder(inputs.rows, 8, config.seed)
  for step in range(2):
    cut = next_batch(step)
    full = {k: v[order.batch_index(step)] for k, v in inputs.arrays.items()}
    for kind, full_length in (("query", 16), ("document", 32)):
      longest = int(full[f"{kind}_mask"].sum(-1).max())
      assert cut[f"{kind}_ids"].shape[-1] == -(-longest // 4) * 4 < full_length
      np.testing.assert_array_equal(cut[f"{kind}_ids"],
                                    full[f"{kind}_ids"][..., :cut[f"{kind}_ids"].shape[-1]])
    loss, grads = loss_and_gradients(state.params, cut)
    full_loss, full_grads = loss_and_gradients(state.params, full)
    assert float(loss) == pytest.approx(float(full_loss), rel=1e-6)
    # Relative to the largest gradient, as above: the sums run over other lengths, and a gradient
    # near zero keeps only the rounding of the large terms it sums (seen: 1.6e-6 of 0.36 apart
    # on one CPU).
    scale = max(float(np.max(np.abs(g))) for g in jax.tree_util.tree_leaves(full_grads))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads),
                            jax.tree_util.tree_leaves(full_grads)):
      np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, rtol=0, atol=1e-5,
                                 err_msg=jax.tree_util.keystr(path))
  # 0: the full lengths.
  config.length_bucket = 0
  uncut = embeddings.make_job(config, inputs).batches().next_batch(0)
  assert uncut["query_ids"].shape[-1] == 16 and uncut["document_ids"].shape[-1] == 32


@pytest.mark.slow   # about a minute on 2 cores: 8 devices compile every variant
def test_eight_devices_gather_the_negatives_of_the_whole_batch():
  """In a subprocess with 8 CPU devices (tests/embedding_equivalence.py): the gradients and the
  loss of the jit mesh and of pmap, plain and by gradient caching, equal one device running the
  whole batch; the jit step's compiled module all-gathers the documents' embeddings."""
  out = subprocess.run([sys.executable, os.path.join(HERE, "embedding_equivalence.py")],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT))
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  for name, differences in result["runs"].items():
    assert differences["loss"] < 1e-5, (name, differences)
    assert differences["gradients"] < 1e-5, (name, differences)
  # The documents' embeddings of all 16 pairs (32 hidden, float32) gathered on every device:
  # the positives and the 2 hard negatives of each pair (and, symmetric, the queries).
  shapes = result["all_gather_shapes"]
  assert {"f32[16,1,32]", "f32[16,2,32]", "f32[16,32]"} <= set(shapes), shapes


def _untimed(workdir):
  return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_metrics(workdir)]


def _params(directory):
  return checkpoints.flatten(checkpoints.load_pretrained(directory)[1])


@pytest.mark.slow   # two quick runs: about 25 s on 2 cores
def test_the_quick_run_resumes_exactly_and_keeps_the_model(tmp_path, capsys):
  config = efx.quick_config(str(tmp_path), checkpoint_every_steps=2, keep_checkpoints=3)
  reference = str(tmp_path / "reference")
  results = tasks.run(config, reference)
  assert results["num_train_steps"] == 4 and results["best_step"] == 4
  assert "config.eval.beir_dir is empty: no retrieval evaluation" in capsys.readouterr().out
  best = os.path.join(reference, "best")
  settings = json.load(open(os.path.join(best, "embedding.json"), encoding="utf-8"))
  assert settings == {"pooling": "mean", "normalize": True, "max_seq_length": 16}
  assert not os.path.exists(os.path.join(best, "head.safetensors"))
  # Killed after the step-2 checkpoint: the same command trains steps 3 and 4 again.
  resumed = str(tmp_path / "resumed")
  shutil.copytree(reference, resumed)
  for name in ("checkpoints/4", "best", "results.json"):
    path = os.path.join(resumed, name)
    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  tasks.run(config, resumed)
  assert "Resumed from the checkpoint at step 2 " in capsys.readouterr().out
  assert _untimed(resumed) == _untimed(reference)
  ours, theirs = _params(os.path.join(resumed, "best")), _params(best)
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
  # The model embeds as the run did: unit vectors, queries and documents of their lengths.
  loaded_config, loaded = checkpoints.load_pretrained(best)
  model = embeddings.EmbeddingModel(loaded_config, "mean", True)
  ids = np.array([[2, 7, 8, 3, 0]], np.int32)
  vector = model.apply({"params": loaded}, ids, (ids > 0).astype(np.int32))
  assert vector.shape == (1, 32) and float(jnp.linalg.norm(vector)) == pytest.approx(1.0)


def test_the_best_model_by_the_retrieval_evaluator_is_kept(tmp_path, capsys):
  """With an evaluator (the retrieval tool's `evaluate_beir` shape): called at step 0 and every
  eval_every_steps with an `encode(texts, kind)` of the model being trained; best/ is the best
  nDCG@10's, with embedding.json; each evaluation's scores are on its console line."""
  calls = []

  def evaluate_beir(encode, beir_dir, split):
    query, documents = encode(["the cat"], "query"), encode(["a dog", "the mat"], "document")
    assert query.shape == (1, 32) and documents.shape == (2, 32)
    np.testing.assert_allclose(np.linalg.norm(documents, axis=1), 1.0, rtol=1e-5)
    calls.append((beir_dir, split))
    return {"nDCG@10": [0.2, 0.5, 0.3][len(calls) - 1], "MRR@10": 0.1, "Recall@100": 0.9}

  config = efx.quick_config(str(tmp_path), eval_every_steps=2)
  config.eval.beir_dir = "/data/beir/scifact"
  results = embeddings.run(config, str(tmp_path / "workdir"), evaluate=evaluate_beir)
  assert calls == [("/data/beir/scifact", "test")] * 3          # steps 0, 2 and 4
  assert (results["best_step"], results["best_value"]) == (2, 0.5)
  best = json.load(open(tmp_path / "workdir" / "best" / "best.json", encoding="utf-8"))
  assert best["step"] == 2 and "embedding.json" in best["file_digests"]
  evals = read_metrics(str(tmp_path / "workdir"), "eval")
  assert [(r["step"], r["nDCG@10"]) for r in evals] == [(0, 0.2), (2, 0.5), (4, 0.3)]
  assert "[embeddings] eval step 2/4 nDCG@10=0.5 MRR@10=0.1 Recall@100=0.9\n" in \
      capsys.readouterr().out


def test_a_beir_dir_that_is_not_a_beir_folder_is_a_clear_error_before_training(tmp_path):
  config = efx.quick_config(str(tmp_path))
  config.eval.beir_dir = str(tmp_path / "no_such")
  with pytest.raises(ValueError, match=r"config.eval.beir_dir=.*no_such.* is not a BEIR folder: "
                     r".*corpus\.jsonl is missing"):
    tasks.run(config, str(tmp_path / "workdir"))
  assert not (tmp_path / "workdir" / "checkpoints").exists()


def test_the_beir_evaluation_scores_a_real_folder_during_training(tmp_path):
  """The job's own evaluator on a BEIR folder: pytrec_eval's metrics in metrics.jsonl, best/ by
  nDCG@10."""
  pytest.importorskip("pytrec_eval", reason="pytrec_eval-terrier (the retrieval extra) scores")
  beir_dir = tmp_path / "beir"
  (beir_dir / "qrels").mkdir(parents=True)
  documents = ["a cat sat on the mat", "a dog ran in the park", "the sun is hot"]
  (beir_dir / "corpus.jsonl").write_text("".join(
      json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(documents)))
  (beir_dir / "queries.jsonl").write_text(json.dumps({"_id": "q0", "text": "where is the cat"})
                                          + "\n")
  (beir_dir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
  config = efx.quick_config(str(tmp_path), eval_every_steps=2)
  config.eval.beir_dir = str(beir_dir)
  results = tasks.run(config, str(tmp_path / "workdir"))
  evals = read_metrics(str(tmp_path / "workdir"), "eval")
  assert [r["step"] for r in evals] == [0, 2, 4]
  for record in evals:
    assert 0.0 <= record["nDCG@10"] <= 1.0 and record["Recall@100"] == 1.0
  assert results["best_metric"] == "nDCG@10"


def test_config_errors_name_the_field(tmp_path):
  for overrides, message in [({"embedding.pooling": "max"}, "config.embedding.pooling='max'"),
                             ({"grad_accum_steps": 2}, "config.grad_accum_steps=2: must be 1"),
                             ({"grad_cache_chunk": 3}, "grad_cache_chunk=3: each of the 1"),
                             ({"data.num_negatives": -2}, "config.data.num_negatives=-2")]:
    config = efx.quick_config(str(tmp_path), **overrides)
    with pytest.raises(ValueError, match=message):
      embeddings.job(config, str(tmp_path / "workdir"))


@pytest.mark.slow   # a fresh interpreter: about 30 s on 2 cores
def test_the_quick_experiment_runs_from_the_command_line(tmp_path):
  config = efx.quick_config(str(tmp_path))
  workdir = str(tmp_path / "workdir")
  flags = [f"--config.init_checkpoint={config.init_checkpoint}",
           f"--config.data.train_file={config.data.train_file}",
           "--config.max_seq_length=16", "--config.data.max_query_length=8",
           "--config.grad_cache_chunk=4"]
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.main", "--config=experiments/embeddings.py:quick",
       f"--workdir={workdir}"] + flags, cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, PYTHONPATH=ROOT))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "[embeddings] train step 4/4" in result.stdout
  written = json.load(open(os.path.join(workdir, "results.json"), encoding="utf-8"))
  assert written["grad_cache_chunk"] == 4 and written["best_step"] == 4
  assert os.path.exists(os.path.join(workdir, "best", "embedding.json"))


@pytest.mark.slow   # 6 compiles by libtpu: about a minute on 2 cores
def test_the_step_compiles_for_a_tpu_slice(tmp_path):
  """`--compile_for`: the registry's job built without a workdir (nothing read but the
  checkpoint's config), compiled by libtpu with gradient caching, the negatives all-gathered."""
  pytest.importorskip("libtpu", reason="the TPU compiler comes with pip install 'jax[tpu]'")
  from bert_jax.tasks.tools import compile_report
  reports = {}
  for chunk in (0, 2):
    config = efx.quick_config(str(tmp_path), global_batch_size=16, grad_cache_chunk=chunk,
                              **{"data.num_negatives": 1})
    config.data.train_file = str(tmp_path / "absent.jsonl")   # not read
    reports[chunk] = compile_report.run(config, str(tmp_path / f"aot{chunk}"), "v5litepod-4")
    assert sorted(os.listdir(tmp_path / f"aot{chunk}")) == ["compile_report.json"]
  cached = reports[2]
  assert cached["num_devices"] == 4 and cached["fits"] and cached["eval_step"]["fits"]
  assert cached["model_flops_per_step"] == reports[0]["model_flops_per_step"] > 0
  assert cached["bytes_by_category"]["collective"] > 0 and cached["collectives"]
  # XLA counts the loop over chunks once: the report extrapolates from 1 and 2 chunks, so the
  # cached step costs the plain one plus one more forward pass of every chunk but the last
  # (here half a forward pass: 7/6 of the plain step's forward and backward).
  assert cached["cost_analysis"].startswith("loops counted once by XLA (2 chunks)")
  assert 1.1 < cached["flops_per_step"] / reports[0]["flops_per_step"] < 1.25
