"""Issue 41, item 7's smaller holes, each shown on the real parts:

* a vocabulary of the checkpoint's size but other tokens, passed with a checkpoint (fine-tuning,
  continued pre-training), is an error naming both files and the first differing token;
* a name in best.json that is not a file of best/ (`../x`, an absolute path) is refused, never
  read or hashed;
* a `gs://` path whose bucket name Cloud Storage rejects is an error at start, naming the rule
  (the rule agrees with TensorStore's, which is what fails at the first checkpoint otherwise);
* `--allow_pickle`, which the pickle refusal names, exists on the programs it names and works;
* `STORAGE_EMULATOR_HOST` is said once on stderr, never reaches Google's own hosts with the
  emulator's token, and a child process started without it drops its parent's emulator settings.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax.io import checkpoints, file_digests, filesystem, remote_storage
from bert_jax.tasks.framework import best_model
from bert_jax.tasks import registry
from experiments import continue_pretraining, glue
from tests import finetuning_fixtures as fx
from tests import test_best_directory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(**extra):
  env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
  return dict(env, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **extra)


# ------------------------------------------------------------ a vocabulary of the same size


def _swapped_vocab(path) -> str:
  """VOCAB with two words swapped: the checkpoint's size, other tokens at two ids."""
  words = list(fx.VOCAB)
  i, j = words.index("cat"), words.index("dog")
  words[i], words[j] = words[j], words[i]
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(words) + "\n")
  return str(path)


def test_fine_tuning_refuses_a_vocabulary_of_the_checkpoints_size_but_other_tokens(tmp_path):
  from bert_jax import tasks
  checkpoint = fx.write_checkpoint(str(tmp_path / "ckpt"))
  other = _swapped_vocab(tmp_path / "other_vocab.txt")
  config = glue.get_config("task=mrpc,quick")
  config.data.glue_dir = fx.write_glue_dir(str(tmp_path / "glue_data"))
  config.init_checkpoint = checkpoint
  config.tokenizer.vocab_file = other
  cat = fx.VOCAB.index("cat")
  with pytest.raises(ValueError) as error:
    tasks.run(config, str(tmp_path / "run"))
  message = str(error.value)
  assert other in message and os.path.join(checkpoint, "vocab.txt") in message
  assert f"token id {cat}, line {cat + 1}: 'dog' in {other}" in message
  assert not os.path.exists(tmp_path / "run" / "checkpoints")   # stopped before training


def test_a_copy_of_the_checkpoints_vocabulary_is_accepted(tmp_path):
  from bert_jax.tasks.framework import finetuning
  checkpoint = fx.write_checkpoint(str(tmp_path / "ckpt"))
  copy = shutil.copy(os.path.join(checkpoint, "vocab.txt"), tmp_path / "copy.txt")
  config = glue.get_config("task=mrpc,quick")
  config.init_checkpoint = checkpoint
  config.tokenizer.vocab_file = str(copy)
  tokenizer = finetuning.create_tokenizer(config, fx.tiny_bert_config())
  assert tokenizer.vocab_file == str(copy)


def test_continued_pretraining_refuses_a_vocabulary_of_the_checkpoints_size_but_other_tokens(
    tmp_path):
  checkpoint = fx.write_checkpoint(str(tmp_path / "ckpt"))
  other = _swapped_vocab(tmp_path / "other_vocab.txt")
  config = continue_pretraining.get_config("quick")
  config.init_checkpoint = checkpoint
  config.tokenizer.vocab_file = other
  with pytest.raises(ValueError, match=re.escape(
      f"Vocabulary {other} is not the one beside the checkpoint {checkpoint} "
      f"({os.path.join(checkpoint, 'vocab.txt')})")):
    registry.run_job(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")   # refused before the workdir was made


# ------------------------------------------------------------ best.json names confined to best/


@pytest.fixture(scope="module")
def best(tmp_path_factory):
  """A saved best/ (read-only for the tests: each copies it)."""
  root = tmp_path_factory.mktemp("best")
  model = test_best_directory.tiny_model(str(root / "encoder"))
  test_best_directory.save(model, str(root / "best"), 1)
  return str(root / "best")


@pytest.mark.parametrize("kind", ["parent", "absolute", "nested"])
def test_a_best_json_name_outside_best_is_refused_not_hashed(best, tmp_path, kind):
  directory = shutil.copytree(best, tmp_path / "workdir" / "best")
  # A file outside best/ whose recorded digest is right: today it would be read, hashed and
  # taken for part of the model.
  outside = tmp_path / "outside.bin"
  outside.write_bytes(b"not part of the model")
  name = {"parent": "../../outside.bin", "absolute": str(outside),
          "nested": "sub/../../../outside.bin"}[kind]
  info_path = directory / best_model.BEST_INFO
  info = json.loads(info_path.read_text())
  info["file_digests"][name] = file_digests.digest(str(outside))
  info_path.write_text(json.dumps(info))
  with pytest.raises(filesystem.UnsafeNameError) as error:   # the one rule (test_confined_names)
    best_model.check_best(str(directory))
  assert str(info_path) in str(error.value) and repr(name) in str(error.value)
  # Not complete either, so a reader never takes it over an intact sibling.
  assert best_model.best_location(str(directory)) == str(directory)
  from bert_jax.tasks.tools import fine_tuned
  with pytest.raises(filesystem.UnsafeNameError, match=re.escape(repr(name))):
    fine_tuned.load(str(tmp_path / "workdir"))


# ------------------------------------------------------------ bucket names


# (bucket, the words of the rule it breaks, or None) for a bucket the command reads.
BUCKETS = [
    ("bert-jax-test", None), ("abc", None), ("a" * 63, None), ("a.b", None),
    ("my_bucket.example.com", None), ("1ab", None),
    (".".join(["a" * 63] * 3) + "." + "a" * 30, None),                 # 222 with dots
    ("google-code-archive", None),       # Google's own, read: the rules for new names not applied
    ("bk", "has 2 characters"), ("", "has 0 characters"), ("a" * 64, "has 64 characters"),
    (".".join(["a" * 63] * 3) + "." + "a" * 31, "has 223 characters"),
    ("My-Bucket", "has 'M'"), ("ab$c", "has '$'"), ("ab c", "has ' '"),
    ("-abc", "start and end with a letter or a digit"),
    ("abc_", "start and end with a letter or a digit"),
    ("a..b", "dot-separated part ''"), ("a-.b", "dot-separated part 'a-'"),
    ("a.-b", "dot-separated part '-b'"), ("a" * 50 + "." + "b" * 64, "dot-separated part"),
]


@pytest.mark.parametrize("bucket,rule", BUCKETS)
def test_bucket_names_are_checked_by_cloud_storages_rules(bucket, rule):
  problem = remote_storage.bucket_name_problem(bucket)
  if rule is None:
    assert problem is None
  else:
    assert rule in problem
    with pytest.raises(remote_storage.BadBucketNameError,
                       match=re.escape(f"--workdir=gs://{bucket}/run: the bucket name")):
      remote_storage.check_path(f"gs://{bucket}/run", "--workdir")


@pytest.mark.parametrize("bucket,rule", [
    ("192.168.5.4", "IP address"), ("goog-bucket", "starts with \"goog\""),
    ("my-google-bucket", "contains \"google\""), ("google-code-archive", "starts with \"goog\""),
])
def test_a_written_bucket_meets_the_rules_for_names_a_user_can_create(bucket, rule):
  assert remote_storage.bucket_name_problem(bucket) is None    # read: any existing bucket
  assert rule in remote_storage.bucket_name_problem(bucket, written=True)


def test_the_rule_accepts_no_name_tensorstore_refuses():
  """TensorStore (Orbax's arrays) checks names when the first checkpoint opens them: a name the
  start-up rule passes must never fail there (and every name it refuses, the rule refuses)."""
  ts = pytest.importorskip("tensorstore")
  for bucket, _ in BUCKETS:
    try:
      ts.KvStore.open({"driver": "gcs", "bucket": bucket}).result()
      tensorstore_ok = True
    except ValueError as e:
      assert "Invalid GCS bucket name" in str(e)
      tensorstore_ok = False
    assert tensorstore_ok == (remote_storage.bucket_name_problem(bucket) is None), bucket


def _run_cli(module, *args, timeout=180, **env):
  start = time.monotonic()
  # A short storage budget: without the check, a command would spend it on the real store.
  result = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                          env=_env(BERT_JAX_STORAGE_TIMEOUT_SECS="2", BERT_JAX_STORAGE_RETRIES="0",
                                   NO_GCE_CHECK="true", **env),
                          capture_output=True, text=True, timeout=timeout)
  return result, time.monotonic() - start


def test_main_refuses_a_bad_bucket_at_start_naming_the_rule(tmp_path):
  result, seconds = _run_cli("bert_jax.main", "--config=experiments/pretrain_demo.py:quick",
                             "--workdir=gs://bk/run")
  assert result.returncode != 0
  assert ("--workdir=gs://bk/run: the bucket name 'bk' has 2 characters: a bucket name has 3 "
          "to 63") in result.stderr
  assert "Building pre-training records" not in result.stdout + result.stderr
  assert result.stderr.count("Traceback") <= 1 and seconds < 120
  # A config field's path too (here one the run reads).
  result, _ = _run_cli("bert_jax.main", "--config=experiments/continue_pretraining.py:quick",
                       f"--workdir={tmp_path / 'run'}",
                       "--config.init_checkpoint=gs://Checkpoints/bert")
  assert result.returncode != 0
  assert ("--config.init_checkpoint=gs://Checkpoints/bert: the bucket name 'Checkpoints' has "
          "'C'") in result.stderr
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("module,args,named", [
    ("bert_jax.predict", ["--model=gs://ab/best", "--input=in.txt", "--output=out.jsonl"],
     "--model=gs://ab/best: the bucket name 'ab' has 2 characters"),
    ("bert_jax.export", ["--model=/no/model", "--output=gs://goog-exports/sm"],
     "--output=gs://goog-exports/sm: the bucket name 'goog-exports' starts with \"goog\""),
    ("bert_jax.extract_features", ["--input_file=in.txt", "--output_file=gs://a_/f.jsonl",
                                   "--init_checkpoint=/no/ckpt"],
     "--output_file=gs://a_/f.jsonl: the bucket name 'a_' has 2 characters"),
])
def test_every_program_checks_its_gs_paths_at_start(module, args, named):
  result, _ = _run_cli(module, *args)
  assert result.returncode != 0 and named in result.stderr, result.stderr[-3000:]


# ------------------------------------------------------------ --allow_pickle


def test_the_pickle_refusal_names_flags_that_exist(tmp_path):
  checkpoints.write_config(fx.tiny_bert_config(), str(tmp_path / "config.json"))
  (tmp_path / "pytorch_model.bin").write_bytes(b"never unpickled")
  with pytest.raises(ValueError, match="--allow_pickle") as error:
    checkpoints.load_pretrained(str(tmp_path))
  message = str(error.value)
  programs = re.findall(r"bert_jax\.(\w+)", message)
  assert sorted(programs) == ["export", "extract_features", "main"]
  for program in programs:
    result = subprocess.run([sys.executable, "-m", f"bert_jax.{program}", "--helpfull"],
                            cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert "--[no]allow_pickle" in result.stdout + result.stderr, program


def _pickle_twins(root):
  """(safetensors directory, pickle directory) of one tiny encoder, each with its vocab.txt."""
  torch = pytest.importorskip("torch")
  checkpoint = fx.write_checkpoint(str(root / "ckpt"))
  config, params = checkpoints.load_pretrained(checkpoint)
  safe, pickled = str(root / "safetensors"), str(root / "pickle")
  checkpoints.export_huggingface(config, params, safe)
  shutil.copytree(safe, pickled)
  os.remove(os.path.join(pickled, "model.safetensors"))
  state = checkpoints.huggingface_state(config, params)
  torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()},
             os.path.join(pickled, "pytorch_model.bin"))
  for directory in (safe, pickled):
    shutil.copy(os.path.join(checkpoint, "vocab.txt"), directory)
  return safe, pickled


def test_allow_pickle_loads_a_pytorch_checkpoint_as_its_safetensors_twin(tmp_path):
  from bert_jax import extract_features
  from bert_jax.text import tokenization
  safe, pickled = _pickle_twins(tmp_path)
  text = tmp_path / "in.txt"
  text.write_text("the cat sat on the mat .\nwho ran ? ||| a dog .\n", encoding="utf-8")
  with pytest.raises(ValueError, match="--allow_pickle"):
    checkpoints.load_pretrained(pickled)
  tokenizer = tokenization.FullTokenizer(os.path.join(safe, "vocab.txt"))
  extract_features.extract(str(text), str(tmp_path / "safe.jsonl"), safe, tokenizer,
                           layers=[-1, -2], max_seq_length=16)
  result, _ = _run_cli("bert_jax.extract_features", f"--input_file={text}",
                       f"--output_file={tmp_path / 'pickle.jsonl'}",
                       f"--init_checkpoint={pickled}", "--layers=-1,-2", "--max_seq_length=16",
                       "--allow_pickle")
  assert result.returncode == 0, result.stderr[-3000:]
  assert ((tmp_path / "pickle.jsonl").read_text().splitlines()
          == (tmp_path / "safe.jsonl").read_text().splitlines())


@pytest.mark.slow
def test_main_fine_tunes_from_a_pickle_only_with_allow_pickle(tmp_path):
  _, pickled = _pickle_twins(tmp_path)
  glue_dir = fx.write_glue_dir(str(tmp_path / "glue_data"))
  args = ["--config=experiments/glue.py:task=mrpc,quick", "--config.max_seq_length=16",
          f"--config.init_checkpoint={pickled}", f"--config.data.glue_dir={glue_dir}"]
  refused, _ = _run_cli("bert_jax.main", *args, f"--workdir={tmp_path / 'refused'}", timeout=600)
  assert refused.returncode != 0 and "--allow_pickle" in refused.stderr
  assert not os.path.exists(tmp_path / "refused" / "best")
  allowed, _ = _run_cli("bert_jax.main", *args, f"--workdir={tmp_path / 'allowed'}",
                        "--allow_pickle", timeout=600)
  assert allowed.returncode == 0, allowed.stderr[-3000:]
  assert os.path.exists(tmp_path / "allowed" / "best" / best_model.BEST_INFO)


# ------------------------------------------------------------ STORAGE_EMULATOR_HOST


def _python(code, **env):
  return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(**env),
                        capture_output=True, text=True, timeout=120)


_EMULATOR_SETTINGS = ("GOOGLE_AUTH_TOKEN_FOR_TESTING", "TENSORSTORE_GCS_HTTP_URL", "https_proxy",
                      "CURL_CA_BUNDLE")
_SHOW = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
         f"{_EMULATOR_SETTINGS!r}}}))")


def _without_emulator():
  """The settings as this machine has them without an emulator (CURL_CA_BUNDLE may be set)."""
  return {k: _env().get(k) for k in _EMULATOR_SETTINGS}


def test_an_emulator_is_said_once_naming_the_variable_and_the_host():
  pytest.importorskip("cryptography")
  result = _python("from bert_jax.io import remote_storage, filesystem\n"
                   "remote_storage.configure(); remote_storage.configure()\n" + _SHOW,
                   STORAGE_EMULATOR_HOST="127.0.0.1:9")
  assert result.returncode == 0, result.stderr[-3000:]
  said = [line for line in result.stderr.splitlines() if "STORAGE_EMULATOR_HOST" in line]
  assert len(said) == 1, result.stderr
  assert "STORAGE_EMULATOR_HOST=127.0.0.1:9 is set" in said[0]
  assert "http://127.0.0.1:9" in said[0] and "not to Cloud Storage" in said[0]
  assert json.loads(result.stdout.splitlines()[-1])["TENSORSTORE_GCS_HTTP_URL"] == (
      "http://127.0.0.1:9")


@pytest.mark.parametrize("host", ["https://storage.googleapis.com", "www.googleapis.com:443"])
def test_the_emulators_token_never_goes_to_googles_own_hosts(host):
  result = _python("from bert_jax.io import storage_emulator\n"
                   "try:\n  storage_emulator.configure()\n"
                   "except ValueError as e:\n  print('refused:', e)\n" + _SHOW,
                   STORAGE_EMULATOR_HOST=host)
  assert result.returncode == 0, result.stderr[-3000:]
  refused, shown = result.stdout.splitlines()[-2:]
  assert refused.startswith(f"refused: STORAGE_EMULATOR_HOST={host} names Google's own host")
  assert json.loads(shown) == _without_emulator()


def test_a_child_started_without_the_variable_drops_its_parents_emulator_settings():
  pytest.importorskip("cryptography")
  child = ("import os, subprocess, sys\n"
           "from bert_jax.io import storage_emulator\n"
           "storage_emulator.configure()\n"
           "assert os.environ['GOOGLE_AUTH_TOKEN_FOR_TESTING'] == 'emulator'\n"
           "env = dict(os.environ); del env['STORAGE_EMULATOR_HOST']\n"
           "code = 'from bert_jax.io import filesystem\\n' + sys.argv[1]\n"
           "sys.exit(subprocess.run([sys.executable, '-c', code], env=env).returncode)\n")
  result = subprocess.run([sys.executable, "-c", child, _SHOW], cwd=ROOT,
                          env=_env(STORAGE_EMULATOR_HOST="http://127.0.0.1:9"),
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.splitlines()[-1]) == _without_emulator()
