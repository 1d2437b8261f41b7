"""The workdir fuzzer (benchmarks/workdir_fuzz.py) on the quick pre-training demo and on GLUE
MRPC fine-tuning: a file of a finished run damaged (cut, emptied, random bytes, JSON of wrong
types, names out of the workdir, a link outside or to /dev/zero, a directory in its place), then
the same run with more steps. Every case ends in exact recovery (final parameters bit for bit
those of an undamaged run) or a clear error naming the file; never a hang, an error naming
nothing, or a file outside the workdir read or written. The fast tier runs a sample of the
pre-training cases; the slow tier every file of both jobs with 3 damages each, taken in turn so
that every damage is used on files of every kind, a damage per test (the checkpoint's array store
by the first and the last data chunk of each folder, `workdir_fuzz.chunks`: the chunks are one
kind of file and vary in number from run to run). The whole cross product (every chunk, every
damage) is the benchmark's, `python -m benchmarks.workdir_fuzz --job=pretraining|glue`. Every run
of a fuzzer compiles through one persistent compilation cache: a case costs its tracing and its
steps, not a compile."""
import collections
import json
import os
import re

import pytest

from benchmarks import workdir_fuzz

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (file, damage): one of each kind of file a run reads back, each with a damage that reaches it.
SAMPLE = [("bert_config.json", "link to /dev/zero"),
          ("metrics.jsonl", "random bytes"),
          ("checkpoints/4/data/process_0/position.json", "names with .."),
          ("checkpoints/4/record/metadata", "JSON of wrong types"),
          ("data/DONE", "directory"),
          ("data/train.tfrecord", "link outside")]
# The slow tier's cases: every file, the data chunks by the first and last of each folder, with
# 3 damages each taken in turn.
SLOW_TIER = dict(every_chunk=False, per_file=3)


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory):
  made = workdir_fuzz.pretraining_fuzzer(str(tmp_path_factory.mktemp("fuzz")), timeout=120)
  yield made
  made.close()


@pytest.fixture(scope="module")
def glue_fuzzer(tmp_path_factory):
  made = workdir_fuzz.glue_fuzzer(str(tmp_path_factory.mktemp("fuzz_glue")), timeout=120)
  yield made
  made.close()


def _failures(cases):
  return [f"{c.file}: {c.damage}: {c.outcome}: {c.detail}" for c in cases
          if c.outcome not in workdir_fuzz.OK_OUTCOMES]


def test_a_sample_of_damaged_files_ends_in_exact_recovery_or_a_clear_error(fuzzer):
  files = set(fuzzer.files())
  assert {f for f, _ in SAMPLE} <= files, sorted(files)
  cases = [fuzzer.run_case(workdir_fuzz.Case(f, d), i) for i, (f, d) in enumerate(SAMPLE)]
  assert not _failures(cases), "\n".join(_failures(cases))


def test_the_compilation_cache_holds_what_compiles_inside_and_is_closed_after(tmp_path):
  import jax
  import jax.numpy as jnp
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  before = [getattr(jax.config, name) for name in names]
  with workdir_fuzz.compilation_cache(str(tmp_path / "cache")):
    assert jax.jit(lambda x: x * 3 + 1)(jnp.arange(3.0)).tolist() == [1.0, 4.0, 7.0]
  written = os.listdir(tmp_path / "cache")
  assert any("lambda" in name for name in written)   # compiled in well under a second
  assert [getattr(jax.config, name) for name in names] == before
  jax.jit(lambda x: x * 5 - 2)(jnp.arange(4.0))
  assert os.listdir(tmp_path / "cache") == written   # nothing more written after


def test_the_slow_tier_damages_the_first_and_last_data_chunk_of_each_folder():
  files = ["bert_config.json", "checkpoints/4/state/d/9a", "checkpoints/4/state/manifest.ocdbt",
           "checkpoints/4/state/ocdbt.process_0/d/03", "checkpoints/4/state/ocdbt.process_0/d/7f",
           "checkpoints/4/state/ocdbt.process_0/d/51", "checkpoints/4/state/ocdbt.process_0/d/a1",
           "data/train.tfrecord"]
  assert workdir_fuzz.chunks(files) == [
      "bert_config.json", "checkpoints/4/state/d/9a", "checkpoints/4/state/manifest.ocdbt",
      "checkpoints/4/state/ocdbt.process_0/d/03", "checkpoints/4/state/ocdbt.process_0/d/a1",
      "data/train.tfrecord"]


def test_the_slow_tier_uses_every_file_and_every_damage(fuzzer):
  """Its sample of the cross product: each file 3 times, each damage on several files, JSON
  damages on JSON files only."""
  cases = fuzzer.cases(**SLOW_TIER)
  files = workdir_fuzz.chunks(fuzzer.files())
  assert sorted({c.file for c in cases}) == sorted(files)
  pairs = [(c.file, c.damage) for c in cases]
  assert len(pairs) == 3 * len(files) == len(set(pairs))
  used = collections.Counter(c.damage for c in cases)
  assert set(used) == set(workdir_fuzz.DAMAGES) and min(used.values()) >= 2, used
  assert set(pairs) <= {(c.file, c.damage) for c in fuzzer.cases()}


def test_outcomes_are_classified_by_what_the_error_names():
  assert workdir_fuzz.names_the_file("ValueError: /w/checkpoints/4/state: bad", "/w",
                                     "checkpoints/4/state/manifest.ocdbt")
  assert not workdir_fuzz.names_the_file("ValueError: /w/checkpoints: bad", "/w",
                                         "checkpoints/4/state/manifest.ocdbt")
  assert not workdir_fuzz.names_the_file("ValueError: Object must be a dict", "/w",
                                         "checkpoints/4/_CHECKPOINT_METADATA")


def _section(text: str, heading: str) -> str:
  """The text under `## heading` up to the next `## `."""
  return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_docs_workdir_names_every_file_the_quick_run_writes_and_every_metric(fuzzer):
  """docs/workdir.md against the files and metrics.jsonl of a real run (the fuzzer's reference:
  the quick demo, 4 steps, checkpoints at 2 and 4): every file is under a path the table of
  "What a workdir holds" lists (`<step>`-style placeholders match one name), and every field of
  every metrics.jsonl line is named in its section."""
  with open(os.path.join(ROOT, "docs", "workdir.md"), encoding="utf-8") as f:
    doc = f.read()
  table = _section(doc, "What a workdir holds")
  listed = [name for row in table.splitlines() if row.startswith("| `")
            for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])]
  patterns = [re.compile(re.sub(r"\\<[^>]+\\>|<[^>]+>", "[^/]+", re.escape(name))
                         + ("" if name.endswith("/") else "$")) for name in listed]
  files = []
  for directory, _, names in os.walk(fuzzer.reference):
    files += [os.path.relpath(os.path.join(directory, n), fuzzer.reference) for n in names]
  assert "metrics.jsonl" in files and any(f.startswith("checkpoints/4/") for f in files)
  unlisted = sorted(f for f in files if not any(p.match(f) for p in patterns))
  assert not unlisted, f"docs/workdir.md does not list: {unlisted} (listed: {listed})"

  metrics = _section(doc, "`metrics.jsonl`")
  with open(os.path.join(fuzzer.reference, "metrics.jsonl")) as f:
    fields = {key for line in f for key in json.loads(line)}
  unnamed = sorted(k for k in fields if not re.search(rf"[`\"]{re.escape(k)}[`\"]", metrics))
  assert not unnamed, f"docs/workdir.md's metrics.jsonl section does not name: {unnamed}"


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(workdir_fuzz.DAMAGES))
def test_every_file_with_each_damage(fuzzer, damage):
  """Every file of the run but the older checkpoint's and its middle data chunks, 3 damages each
  (`SLOW_TIER`), a damage per test."""
  cases = [case for case in fuzzer.cases(**SLOW_TIER) if case.damage == damage]
  assert cases, damage
  done = [fuzzer.run_case(case, 100 + i) for i, case in enumerate(cases)]
  print(json.dumps({"damage": damage, **workdir_fuzz.summary(done)}))   # shown by pytest -rP
  assert not _failures(done), "\n".join(_failures(done))


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(workdir_fuzz.DAMAGES))
def test_every_fine_tuning_file_with_each_damage(glue_fuzzer, damage):
  """GLUE MRPC (quick, from a tiny checkpoint): its checkpoints, best/, results.json,
  predictions and every other file, 3 damages each (`SLOW_TIER`), a damage per test."""
  cases = [case for case in glue_fuzzer.cases(**SLOW_TIER) if case.damage == damage]
  assert cases, damage
  done = [glue_fuzzer.run_case(case, 100 + i) for i, case in enumerate(cases)]
  print(json.dumps({"job": "glue", "damage": damage, **workdir_fuzz.summary(done)}))   # pytest -rP
  assert not _failures(done), "\n".join(_failures(done))
