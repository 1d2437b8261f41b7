"""Tiny random checkpoints of every family as `transformers` writes them, with tokenizers trained
here on a built-in text (nothing downloaded): `WRITERS` by family name.

`write_bert`: a random `BertForPreTraining` and a WordPiece vocab.txt (lower-cased).
`write_modernbert`: a random `ModernBertForMaskedLM` (4 layers, global every third, a 16-token
window) and a byte-level BPE tokenizer.json with ModernBERT's `[CLS] A [SEP] B [SEP]` template.

`write_roberta`: a byte-level BPE (`tokenizers`) with RoBERTa's special tokens <s>=0 <pad>=1
</s>=2 <unk>=3 <mask>=4, saved as vocab.json + merges.txt and through `RobertaTokenizer`
(tokenizer.json, tokenizer_config.json), and a random `RobertaForMaskedLM` (model.safetensors).
`write_xlm_roberta`: a SentencePiece unigram model (sentencepiece.bpe.model) in XLM-R's fairseq
layout through `XLMRobertaTokenizer` (<s>=0 <pad>=1 </s>=2 <unk>=3, SentencePiece id i >= 3 at
i + 1, <mask> last), and a random `XLMRobertaForMaskedLM`.
Every bias and LayerNorm parameter gets small random noise, so that none is zero (or one).
Needs torch, transformers, tokenizers and sentencepiece; a few seconds each.
"""
import io
import os
import random
from typing import List

ROBERTA_SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]

_PARAGRAPHS = """\
The quick brown fox jumps over the lazy dog while the farmer watches from the old wooden gate.
A small red boat drifted slowly down the river, past the mill and under the stone bridge.
Every morning the baker opens her shop at six o'clock and sells fresh bread to the neighbours.
Scientists measured 42 samples in 2019, and 17 of them showed unusual levels of copper and zinc.
"Where are you going?" asked the child. "To the market," said her mother, "and then home."
The committee will meet again on Tuesday; its members must read the report before then.
Music filled the hall as the orchestra played the final movement of the long symphony.
He paid $3.50 for a cup of coffee, which he thought was far too much for such a small cup.
Mountains rise above the valley, their peaks covered in snow for most of the year.
Reading a good book on a rainy afternoon is one of the simplest pleasures in life.
The museum's new exhibition shows paintings, drawings and photographs from the last century.
Children played football in the park until the sun went down behind the tall trees.
She wrote three letters, sealed them carefully, and walked to the post office before noon.
Engineers tested the new bridge with heavy trucks to make sure it could carry the load.
The café on the corner serves crème brûlée, croissants and a very strong espresso.
In the winter, the lake freezes and the whole village comes out to skate on the ice.
Tokenizers split words into pieces: frequent words stay whole, rare words break apart.
Numbers like 3.14159, 1,000,000 and 2024-05-17 appear in many kinds of documents.
The garden was full of roses, tulips and daisies, and the bees were busy among them.
After the storm, the streets were covered with leaves, branches and broken umbrellas.
"""

_WORDS = ("time person year way day thing man world life hand part child eye woman place work "
          "week case point government company number group problem fact be have do say get make "
          "go know take see come think look want give use find tell ask seem feel try leave call "
          "good new first last long great little own other old right big high different small "
          "large next early young important few public bad same able").split()


def corpus(seed: int = 0, sentences: int = 200) -> List[str]:
  """The built-in paragraphs plus `sentences` generated ones (deterministic for a seed)."""
  rng = random.Random(seed)
  lines = _PARAGRAPHS.strip().split("\n")
  for _ in range(sentences):
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 12))]
    words[0] = words[0].capitalize()
    lines.append(" ".join(words) + rng.choice([".", "!", "?", ",", ";"]))
  return lines


def _perturb_and_save(model, directory: str, seed: int) -> None:
  """Noise on every bias and LayerNorm parameter (deterministic for `seed`), then save."""
  import torch
  generator = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, parameter in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
        parameter.add_(0.1 * noise)
  model.save_pretrained(directory, safe_serialization=True)


def _save_roberta(config_class, model_class, tokenizer, directory: str, layers: int,
                  hidden: int, heads: int, intermediate: int, max_position_embeddings: int,
                  seed: int) -> str:
  """The tokenizer and a random masked LM of RoBERTa's layout (pad 1, <s> 0, </s> 2)."""
  import torch
  tokenizer.save_pretrained(directory)
  config = config_class(
      vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
      num_attention_heads=heads, intermediate_size=intermediate,
      max_position_embeddings=max_position_embeddings, type_vocab_size=1, layer_norm_eps=1e-5,
      pad_token_id=1, bos_token_id=0, eos_token_id=2)
  torch.manual_seed(seed)
  _perturb_and_save(model_class(config).eval(), directory, seed)
  return directory


def write_roberta(directory, *, layers: int = 4, hidden: int = 64, heads: int = 4,
                  intermediate: int = 128, vocab_size: int = 400,
                  max_position_embeddings: int = 66, seed: int = 0) -> str:
  """A random RobertaForMaskedLM and its byte-level BPE tokenizer in `directory`."""
  import transformers
  from tokenizers import ByteLevelBPETokenizer
  directory = str(directory)
  os.makedirs(directory, exist_ok=True)
  bpe = ByteLevelBPETokenizer()   # RoBERTa's: no prefix space, no lower-casing
  bpe.train_from_iterator(corpus(seed), vocab_size=vocab_size, min_frequency=2,
                          special_tokens=ROBERTA_SPECIAL, show_progress=False)
  bpe.save_model(directory)       # vocab.json + merges.txt
  # From the files (transformers 4 converts them, 5 reads them): the ids stay the trained ones.
  tokenizer = transformers.RobertaTokenizerFast.from_pretrained(directory)
  assert [tokenizer.convert_tokens_to_ids(t) for t in ROBERTA_SPECIAL] == [0, 1, 2, 3, 4]
  return _save_roberta(transformers.RobertaConfig, transformers.RobertaForMaskedLM, tokenizer,
                       directory, layers, hidden, heads, intermediate, max_position_embeddings,
                       seed)


def _precompiled_charsmap(model_proto: bytes) -> bytes:
  """ModelProto.normalizer_spec (field 3).precompiled_charsmap (field 2), read from the protobuf
  wire format by hand: sentencepiece's generated module can refuse the installed protobuf."""

  def fields(buffer: bytes):
    position = 0

    def varint():
      nonlocal position
      value = shift = 0
      while True:
        byte = buffer[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
          return value

    while position < len(buffer):
      key = varint()
      number, wire = key >> 3, key & 7
      if wire == 0:
        yield number, varint()
      elif wire == 1:
        position += 8
      elif wire == 5:
        position += 4
      elif wire == 2:
        length = varint()
        yield number, buffer[position:position + length]
        position += length
      else:
        raise ValueError(f"unexpected protobuf wire type {wire}")

  spec = next((value for number, value in fields(model_proto) if number == 3), b"")
  return next((value for number, value in fields(spec) if number == 2), b"")


def write_xlm_roberta(directory, *, layers: int = 4, hidden: int = 64, heads: int = 4,
                      intermediate: int = 128, vocab_size: int = 300,
                      max_position_embeddings: int = 66, seed: int = 0) -> str:
  """A random XLMRobertaForMaskedLM and its SentencePiece unigram tokenizer in `directory`.

  The SentencePiece model (nmt_nfkc normalisation, like XLM-R's) has `vocab_size` pieces
  (<unk>=0 <s>=1 </s>=2 first); the tokenizer has one more: fairseq's <s> <pad> </s> <unk>, the
  pieces from id 3 on shifted by one, and <mask> at the end.
  """
  import sentencepiece as spm
  import transformers
  directory = str(directory)
  os.makedirs(directory, exist_ok=True)
  model_file = os.path.join(directory, "sentencepiece.bpe.model")   # XLM-R's name (a unigram)
  proto = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(corpus(seed)), model_writer=proto, vocab_size=vocab_size,
      model_type="unigram", character_coverage=1.0, seed_sentencepiece_size=10_000,
      num_threads=1, minloglevel=2)
  proto = proto.getvalue()
  with open(model_file, "wb") as f:
    f.write(proto)
  sp = spm.SentencePieceProcessor(model_proto=proto)
  # transformers converts a .model through sentencepiece's generated protobuf module, which can
  # refuse the installed protobuf (gencode newer than the runtime): we give it the fairseq
  # vocabulary and the normaliser directly, as its XLM-R converter would have.
  vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
  vocab += [(sp.id_to_piece(i), sp.get_score(i)) for i in range(3, sp.get_piece_size())]
  vocab += [("<mask>", 0.0)]
  charsmap = _precompiled_charsmap(proto)
  if int(transformers.__version__.split(".")[0]) >= 5:
    tokenizer = transformers.XLMRobertaTokenizer(vocab=vocab, _spm_precompiled_charsmap=charsmap)
  else:  # transformers 4: its XLMRobertaConverter's pipeline, built here
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors
    engine = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    engine.normalizer = normalizers.Sequence([
        normalizers.Precompiled(charsmap), normalizers.Strip(left=False, right=True),
        normalizers.Replace(Regex(" {2,}"), "\u2581")])
    engine.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    engine.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    engine.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer = transformers.XLMRobertaTokenizerFast(tokenizer_object=engine)
  assert len(tokenizer) == sp.get_piece_size() + 2
  assert [tokenizer.convert_tokens_to_ids(t) for t in ROBERTA_SPECIAL[:4]] == [0, 1, 2, 3]
  return _save_roberta(transformers.XLMRobertaConfig, transformers.XLMRobertaForMaskedLM,
                       tokenizer, directory, layers, hidden, heads, intermediate,
                       max_position_embeddings, seed)


def write_bert(directory, *, layers: int = 4, hidden: int = 64, heads: int = 4,
               intermediate: int = 128, vocab_size: int = 400, max_position_embeddings: int = 64,
               seed: int = 0) -> str:
  """A random BertForPreTraining and its WordPiece vocabulary (lower-cased) in `directory`."""
  import torch
  import transformers
  from tokenizers import BertWordPieceTokenizer
  directory = str(directory)
  os.makedirs(directory, exist_ok=True)
  wordpiece = BertWordPieceTokenizer(lowercase=True)
  wordpiece.train_from_iterator(corpus(seed), vocab_size=vocab_size, min_frequency=1,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                                show_progress=False)
  wordpiece.save_model(directory)   # vocab.txt
  tokenizer = transformers.BertTokenizerFast(os.path.join(directory, "vocab.txt"),
                                             do_lower_case=True)
  tokenizer.save_pretrained(directory)
  config = transformers.BertConfig(
      vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
      num_attention_heads=heads, intermediate_size=intermediate,
      max_position_embeddings=max_position_embeddings, pad_token_id=0)
  torch.manual_seed(seed)
  _perturb_and_save(transformers.BertForPreTraining(config).eval(), directory, seed)
  return directory


def write_modernbert(directory, *, layers: int = 4, hidden: int = 64, heads: int = 4,
                     intermediate: int = 96, vocab_size: int = 400, seed: int = 0) -> str:
  """A random ModernBertForMaskedLM and its byte-level BPE tokenizer.json in `directory`."""
  import torch
  import transformers
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  directory = str(directory)
  os.makedirs(directory, exist_ok=True)
  special = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
  engine = Tokenizer(models.BPE(unk_token="[UNK]"))
  engine.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  engine.decoder = decoders.ByteLevel()
  engine.train_from_iterator(corpus(seed), trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=special, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  ids = {token: engine.token_to_id(token) for token in special}
  engine.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
  tokenizer = transformers.PreTrainedTokenizerFast(
      tokenizer_object=engine, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
      pad_token="[PAD]", mask_token="[MASK]")
  tokenizer.save_pretrained(directory)
  config = transformers.ModernBertConfig(
      vocab_size=engine.get_vocab_size(), hidden_size=hidden, num_hidden_layers=layers,
      num_attention_heads=heads, intermediate_size=intermediate, local_attention=16,
      global_attn_every_n_layers=3, pad_token_id=ids["[PAD]"], cls_token_id=ids["[CLS]"],
      sep_token_id=ids["[SEP]"], bos_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"],
      norm_bias=True, attention_bias=True, mlp_bias=True)
  torch.manual_seed(seed)
  _perturb_and_save(transformers.ModernBertForMaskedLM(config).eval(), directory, seed)
  return directory


# Each family's writer, by its name in `bert_jax.families` ("xlm-roberta": RoBERTa's with XLM-R's
# SentencePiece vocabulary and class names).
WRITERS = {"bert": write_bert, "modernbert": write_modernbert, "roberta": write_roberta,
           "xlm-roberta": write_xlm_roberta}

