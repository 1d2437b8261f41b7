"""RoBERTa (byte-level BPE) and XLM-RoBERTa (SentencePiece unigram, fairseq ids) tokenizers as
`transformers` saves them, read through `create_tokenizer(tokenizer_file=...)`: ids, special
tokens and the two-separator pair layout `<s> A </s></s> B </s>` equal to transformers' own
(tests/family_fixtures.py writes the checkpoints). BERT's one-separator layout is unchanged."""
import json
import os

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")
pytest.importorskip("sentencepiece")

import transformers  # noqa: E402

from bert_jax.text import pairs, tokenization  # noqa: E402
from tests import family_fixtures  # noqa: E402

TEXTS = ["Hello world, it's 2024!", "  leading spaces and trailing ",
         "The café serves crème brûlée.", "ﬁ ① Ü ß", "a <mask> b", "", "tabs\tand\nnewlines",
         "UPPER lower MiXeD case",
         "emoji 😀 and 中文 text", "3.14159, $3.50 and 1,000,000 (approx.)", "unseenwordxyzzy"]
TEXTS_A = ["a text", "The quick brown fox jumps over the lazy dog while the farmer watches.",
           "short", "Numbers like 3.14159 and 2024-05-17 appear in many kinds of documents."]
TEXTS_B = ["another text", "short one",
           "The quick brown fox jumps over the lazy dog while the farmer watches, again.",
           "Numbers like 3.14159 and 2024-05-17 appear in many kinds of documents."]


@pytest.fixture(scope="module", params=["roberta", "xlm_roberta"])
def checkpoint(request, tmp_path_factory):
  write = getattr(family_fixtures, "write_" + request.param)
  return request.param, write(str(tmp_path_factory.mktemp(request.param)))


def _ours_and_theirs(directory):
  ours = tokenization.create_tokenizer(tokenizer_file=os.path.join(directory, "tokenizer.json"))
  theirs = transformers.AutoTokenizer.from_pretrained(directory)
  return ours, theirs


def test_ids_and_special_tokens_are_transformers(checkpoint):
  kind, directory = checkpoint
  tok, hf = _ours_and_theirs(directory)
  assert isinstance(tok, tokenization.HuggingFaceTokenizer)
  assert tok.vocab_size == len(hf) == json.load(open(os.path.join(directory, "config.json")))[
      "vocab_size"]
  ours = tok.encode_batch(TEXTS)
  assert ours == hf(TEXTS, add_special_tokens=False)["input_ids"]
  for text, ids in zip(TEXTS, ours):
    assert tok.convert_tokens_to_ids(tok.tokenize(text)) == ids, text
  # fairseq's layout: <s>=0 <pad>=1 </s>=2 <unk>=3; <mask> 4 (our BPE) or last (XLM-R).
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id) == (0, 1, 2, 3)
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (
      hf.cls_token_id, hf.pad_token_id, hf.sep_token_id, hf.unk_token_id, hf.mask_token_id)
  assert tok.mask_id == (4 if kind == "roberta" else tok.vocab_size - 1)
  assert tok.special_tokens == {"[CLS]": "<s>", "[SEP]": "</s>", "[PAD]": "<pad>",
                                "[UNK]": "<unk>", "[MASK]": "<mask>"}
  assert tok.encode_batch(["a <mask> b"])[0].count(tok.mask_id) == 1
  # Cased: no lower-casing normalizer, and do_lower_case does not apply to a tokenizer.json.
  assert tok.do_lower_case is False
  assert tok.encode_batch(["The Dog"]) != tok.encode_batch(["the dog"])
  lower = tokenization.create_tokenizer(tokenizer_file=tok.tokenizer_file, do_lower_case=True)
  assert lower.encode_batch(TEXTS) == ours
  assert tok.pair_separators == 2


def test_xlm_roberta_ids_are_sentencepiece_ids_shifted_by_fairseqs_offset(tmp_path):
  import sentencepiece as spm
  directory = family_fixtures.write_xlm_roberta(str(tmp_path))
  sp = spm.SentencePieceProcessor(model_file=os.path.join(directory,
                                                          "sentencepiece.bpe.model"))
  tok = tokenization.create_tokenizer(tokenizer_file=os.path.join(directory, "tokenizer.json"))
  assert tok.vocab_size == sp.get_piece_size() + 2   # + <pad> and <mask>
  for text, ids in zip(TEXTS, tok.encode_batch(TEXTS)):
    if "<mask>" in text:
      continue   # a special token of the tokenizer, plain text to SentencePiece
    # SentencePiece <unk>=0 is fairseq's 3; piece i >= 3 is i + 1 (<pad> inserted at 1).
    assert ids == [i + 1 if i >= 3 else 3 for i in sp.encode(text)], text
  assert tok.convert_ids_to_tokens([4, tok.vocab_size - 2]) == [sp.id_to_piece(3),
                                                                sp.id_to_piece(sp.get_piece_size()
                                                                               - 1)]


def test_pairs_are_transformers_rows(checkpoint):
  _, directory = checkpoint
  tok, hf = _ours_and_theirs(directory)
  arrays = pairs.encode_pairs(tok, ["a text"], ["another text"], 32)
  theirs = hf(["a text"], ["another text"], padding="max_length", max_length=32)
  assert arrays["input_ids"].tolist() == theirs["input_ids"]
  assert arrays["input_mask"].tolist() == theirs["attention_mask"]
  a, b = tok.encode_batch(["a text", "another text"])
  row = [0] + a + [2, 2] + b + [2]
  assert arrays["input_ids"][0].tolist() == row + [1] * (32 - len(row))
  # Segment ids: 0 for <s> A </s>, 1 for </s> B </s> (RoBERTa's model decides to ignore them).
  assert arrays["segment_ids"][0].tolist() == (
      [0] * (len(a) + 2) + [1] * (len(b) + 2) + [0] * (32 - len(row)))
  # Truncation of long pairs (longest first, B on a tie) and single texts, as transformers does.
  for length in (32, 16, 12):
    arrays = pairs.encode_pairs(tok, TEXTS_A, TEXTS_B, length)
    theirs = hf(TEXTS_A, TEXTS_B, padding="max_length", truncation="longest_first",
                max_length=length)
    assert arrays["input_ids"].tolist() == theirs["input_ids"], length
    assert arrays["input_mask"].tolist() == theirs["attention_mask"], length
  arrays = pairs.encode_pairs(tok, TEXTS_A, None, 12)
  theirs = hf(TEXTS_A, padding="max_length", truncation=True, max_length=12)
  assert arrays["input_ids"].tolist() == theirs["input_ids"]


def test_checkpoints_load_in_transformers_with_nonzero_biases(checkpoint):
  import torch
  kind, directory = checkpoint
  assert os.path.exists(os.path.join(directory, "model.safetensors"))
  model = transformers.AutoModelForMaskedLM.from_pretrained(directory).eval()
  assert type(model).__name__ == ("RobertaForMaskedLM" if kind == "roberta"
                                  else "XLMRobertaForMaskedLM")
  config = model.config
  assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (1, 0, 2)
  assert config.type_vocab_size == 1 and config.max_position_embeddings == 66
  for name, parameter in model.named_parameters():
    if name.endswith("bias"):
      assert torch.count_nonzero(parameter) == parameter.numel(), name
    if "LayerNorm.weight" in name:
      assert not torch.all(parameter == 1), name
  tok = tokenization.create_tokenizer(tokenizer_file=os.path.join(directory, "tokenizer.json"))
  arrays = pairs.encode_pairs(tok, ["a text"], ["another text"], 16)
  with torch.no_grad():
    logits = model(input_ids=torch.tensor(arrays["input_ids"], dtype=torch.long),
                   attention_mask=torch.tensor(arrays["input_mask"], dtype=torch.long)).logits
  assert logits.shape == (1, 16, tok.vocab_size) and torch.isfinite(logits).all()


def _bert_style_tokenizer_json(tmp_path, processor) -> str:
  import tokenizers
  from tokenizers import models, pre_tokenizers
  vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"])}
  engine = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
  engine.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  engine.post_processor = processor
  path = str(tmp_path / "tokenizer.json")
  engine.save(path)
  return path


def test_bert_style_tokenizers_keep_one_separator_and_zero_padding(tmp_path):
  from tokenizers import processors
  bert_template = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
  for processor in (bert_template, processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))):
    tok = tokenization.HuggingFaceTokenizer(_bert_style_tokenizer_json(tmp_path, processor))
    assert tok.pair_separators == 1
    arrays = pairs.encode_pairs(tok, ["a a", "a"], ["b", None], 8)
    assert arrays["input_ids"].tolist() == [[2, 5, 5, 3, 6, 3, 0, 0], [2, 5, 3, 0, 0, 0, 0, 0]]
    assert arrays["segment_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 0, 0], [0] * 8]
    assert arrays["input_mask"].tolist() == [[1] * 6 + [0] * 2, [1] * 3 + [0] * 5]
  # A template with two separators between A and B is RoBERTa's layout.
  roberta_template = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] [SEP] $B [SEP]",
      special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
  tok = tokenization.HuggingFaceTokenizer(_bert_style_tokenizer_json(tmp_path, roberta_template))
  assert tok.pair_separators == 2
  assert tokenization.FullTokenizer.pair_separators == 1
  assert tokenization.SentencePieceTokenizer.pair_separators == 1


def test_join_and_fit_pair_defaults_and_separators():
  assert pairs.join_pair(["a"], ["b", "c"], "C", "S") == (
      ["C", "a", "S", "b", "c", "S"], [0, 0, 0, 1, 1, 1])
  assert pairs.join_pair(["a"], ["b"], "C", "S", separators=2) == (
      ["C", "a", "S", "S", "b", "S"], [0, 0, 0, 1, 1, 1])
  assert pairs.join_pair(["a"], None, "C", "S", separators=2) == (["C", "a", "S"], [0, 0, 0])
  assert pairs.fit_pair(list("aaaa"), list("bbbb"), 8) == (list("aaa"), list("bb"))
  assert pairs.fit_pair(list("aaaa"), list("bbbb"), 8, separators=2) == (list("aa"), list("bb"))
  assert pairs.fit_pair(list("aaaaaaaa"), [], 8, separators=2) == (list("aaaaaa"), None)
  rows = pairs.encode_pairs(_Ids(), ["x"], ["y"], 6)
  np.testing.assert_array_equal(rows["input_ids"], [[7, 5, 8, 6, 8, 9]])   # padded with pad_id
  np.testing.assert_array_equal(rows["input_mask"], [[1, 1, 1, 1, 1, 0]])


class _Ids:
  """A tokenizer without `pair_separators` (the default: one) and with a pad id that is not 0."""
  cls_id, sep_id, pad_id = 7, 8, 9

  def encode_batch(self, texts):
    return [[5] if t == "x" else [6] for t in texts]


# RoBERTa as older releases and fairseq conversions ship it: vocab.json + merges.txt, no
# tokenizer.json. Read through the same HuggingFaceTokenizer (tokenizer_file=vocab.json).

@pytest.fixture(scope="module")
def roberta_bpe_files(tmp_path_factory):
  """(full fixture directory, a copy of it without tokenizer.json)."""
  import shutil
  full = family_fixtures.write_roberta(str(tmp_path_factory.mktemp("roberta_full")))
  bare = str(tmp_path_factory.mktemp("roberta_bpe_only"))
  for name in os.listdir(full):
    if name != "tokenizer.json":
      shutil.copy(os.path.join(full, name), bare)
  return full, bare


def test_vocab_json_and_merges_are_transformers_roberta(roberta_bpe_files):
  full, bare = roberta_bpe_files
  path = os.path.join(bare, "vocab.json")
  tok = tokenization.create_tokenizer(tokenizer_file=path)
  reference = tokenization.create_tokenizer(tokenizer_file=os.path.join(full, "tokenizer.json"))
  hf = transformers.AutoTokenizer.from_pretrained(full)
  assert isinstance(tok, tokenization.HuggingFaceTokenizer)
  assert tok.tokenizer_file == path
  assert tok.source_files == (path, os.path.join(bare, "merges.txt"))
  ours = tok.encode_batch(TEXTS)
  assert ours == hf(TEXTS, add_special_tokens=False)["input_ids"] == reference.encode_batch(TEXTS)
  for text, ids in zip(TEXTS, ours):
    assert tok.convert_tokens_to_ids(tok.tokenize(text)) == ids, text
    assert tok.convert_ids_to_tokens(ids) == tok.tokenize(text) == reference.tokenize(text)
    assert tok.decode(ids) == hf.decode(ids) == text, text
  assert tok.vocab_size == len(hf) == reference.vocab_size
  assert tok.vocab == reference.vocab
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (
      hf.cls_token_id, hf.pad_token_id, hf.sep_token_id, hf.unk_token_id, hf.mask_token_id)
  assert tok.special_tokens == reference.special_tokens == {
      "[CLS]": "<s>", "[SEP]": "</s>", "[PAD]": "<pad>", "[UNK]": "<unk>", "[MASK]": "<mask>"}
  assert tok.pair_separators == 2
  assert tok.do_lower_case is False
  assert tokenization.create_tokenizer(tokenizer_file=path, do_lower_case=True).encode_batch(
      TEXTS) == ours
  assert [tok.is_word_continuation(t) for t in tok.vocab] == [
      reference.is_word_continuation(t) for t in reference.vocab]
  assert tok.is_word_continuation("<s>") is False
  # Pairs: <s> A </s></s> B </s>, truncated as transformers does.
  for length in (32, 12):
    arrays = pairs.encode_pairs(tok, TEXTS_A, TEXTS_B, length)
    theirs = hf(TEXTS_A, TEXTS_B, padding="max_length", truncation="longest_first",
                max_length=length)
    assert arrays["input_ids"].tolist() == theirs["input_ids"], length
  # The built pipeline as one tokenizer.json: what transformers itself saves for these files.
  assert json.loads(tok.tokenizer_json()) == json.load(open(os.path.join(full, "tokenizer.json")))
  json_copy = os.path.join(bare, "built", "tokenizer.json")
  os.makedirs(os.path.dirname(json_copy))
  with open(json_copy, "w") as f:
    f.write(tok.tokenizer_json())
  assert tokenization.HuggingFaceTokenizer(json_copy).encode_batch(TEXTS) == ours


def test_find_vocab_finds_vocab_json_beside_merges(roberta_bpe_files, tmp_path):
  import shutil
  from bert_jax.io import checkpoints
  full, bare = roberta_bpe_files
  assert checkpoints.find_vocab(bare) == (None, None, os.path.join(bare, "vocab.json"))
  assert checkpoints.find_vocab(os.path.join(bare, "model.safetensors"))[2] == os.path.join(
      bare, "vocab.json")
  # A tokenizer.json comes first.
  assert checkpoints.find_vocab(full) == (None, None, os.path.join(full, "tokenizer.json"))
  # Under data/ too (merges.txt beside the vocab.json).
  workdir = tmp_path / "workdir"
  (workdir / "data").mkdir(parents=True)
  for name in ("vocab.json", "merges.txt"):
    shutil.copy(os.path.join(bare, name), workdir / "data" / name)
  assert checkpoints.find_vocab(str(workdir)) == (None, None,
                                                  str(workdir / "data" / "vocab.json"))
  # No vocabulary at all: the message lists vocab.json; one without merges.txt is named.
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match=r"vocab\.json \(with merges\.txt beside it\)"):
    checkpoints.find_vocab(str(empty))
  shutil.copy(os.path.join(bare, "vocab.json"), empty / "vocab.json")
  with pytest.raises(FileNotFoundError, match=r"vocab\.json is there but .*merges\.txt is missing"):
    checkpoints.find_vocab(str(empty))


def test_vocab_json_without_merges_is_a_clear_error(roberta_bpe_files, tmp_path):
  import shutil
  _, bare = roberta_bpe_files
  shutil.copy(os.path.join(bare, "vocab.json"), tmp_path / "vocab.json")
  with pytest.raises(FileNotFoundError) as error:
    tokenization.create_tokenizer(tokenizer_file=str(tmp_path / "vocab.json"))
  assert str(tmp_path) in str(error.value) and "merges.txt" in str(error.value)
  (tmp_path / "merges.txt").write_text("#version: 0.2\nĠ t\nnot a merge\n")
  with pytest.raises(ValueError, match=r"merges\.txt, line 3"):
    tokenization.HuggingFaceTokenizer(str(tmp_path / "vocab.json"))
  # A JSON file that is neither a tokenizer.json nor a vocab.json of ids.
  (tmp_path / "other.json").write_text('{"a": "b"}')
  with pytest.raises(ValueError, match="is not a Hugging Face tokenizer.json"):
    tokenization.HuggingFaceTokenizer(str(tmp_path / "other.json"))


@pytest.mark.slow
def test_a_saved_model_of_a_vocab_json_checkpoint_carries_one_tokenizer_json(roberta_bpe_files,
                                                                             tmp_path):
  """The export writes vocab.json + merges.txt as the tokenizer.json transformers saves for them,
  into assets/, through a temporary folder that is gone afterwards."""
  import glob
  import tempfile
  from bert_jax.tasks.tools import serving
  full, bare = roberta_bpe_files
  temporary = lambda: set(glob.glob(os.path.join(tempfile.gettempdir(), "bert_jax_vocab_*")))
  before = temporary()
  output = str(tmp_path / "saved_model")
  serving.export(bare, "saved_model", output)
  assert temporary() <= before
  with open(os.path.join(output, "assets", "tokenizer.json")) as f:
    assert json.load(f) == json.load(open(os.path.join(full, "tokenizer.json")))
  signature = json.load(open(os.path.join(output, "signature.json")))
  assert signature["tokenizer"]["vocab"] == "assets/tokenizer.json"
