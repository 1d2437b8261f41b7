r"""SQuAD as a retrieval task: questions -> their paragraph, split by article.

  python -m data_pipelines.squad_retrieval --squad_file=dev-v1.1.json --output_dir=DIR \
    [--test_fraction=0.5 --seed=0]

The articles are shuffled (`--seed`) and the first `--test_fraction` of them (rounded, at least
one on each side) become the test side, the rest the training side, so no article, and no
paragraph, is on both. Written:

    DIR/test/corpus.jsonl       {"_id": "<article>-<paragraph>", "title": article title (its
                                underscores as spaces), "text": paragraph}: every paragraph of
                                the test articles
    DIR/test/queries.jsonl      {"_id": SQuAD question id, "text": question}
    DIR/test/qrels/test.tsv     query-id, corpus-id, score (1): each question's own paragraph
    DIR/train_pairs.jsonl       {"query": question, "positive": paragraph} of the training
                                articles (what the embedding training job reads)

`DIR/test` is a BEIR folder (`python -m bert_jax.evaluate_retrieval --beir_dir=DIR/test`). A
SQuAD v2.0 question without an answer (`is_impossible`) has no paragraph that answers it and is
left out (counted). The counts are printed as one JSON line. A file that is not SQuAD's layout is
an error naming the file and the entry (`data[3].paragraphs[0].qas[2]`).
"""
import json
import random
from typing import Dict, List, Tuple

from absl import app, flags

from bert_jax.io import filesystem

Paragraph = Tuple[str, str, List[Tuple[str, str]]]   # (corpus id, text, [(question id, question)])


def _field(entry, key: str, kind: type, where: str, path: str):
  value = entry.get(key) if isinstance(entry, dict) else None
  if not isinstance(value, kind):
    raise ValueError(f"{path}: {where} has no {key} ({kind.__name__}): not SQuAD's layout")
  return value


def read_articles(path: str) -> Tuple[List[Tuple[str, List[Paragraph]]], int]:
  """([(title, paragraphs)] in file order, unanswerable questions left out) of a SQuAD file."""
  if not filesystem.exists(path):
    raise FileNotFoundError(f"SQuAD file not found: {path}")
  try:
    data = json.loads(filesystem.read_text(path))
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from e
  articles, impossible = [], 0
  for a, article in enumerate(_field(data, "data", list, "the top level", path)):
    where = f"data[{a}]"
    title = _field(article, "title", str, where, path)
    paragraphs = []
    for p, paragraph in enumerate(_field(article, "paragraphs", list, where, path)):
      here = f"{where}.paragraphs[{p}]"
      context = _field(paragraph, "context", str, here, path)
      questions = []
      for q, qa in enumerate(_field(paragraph, "qas", list, here, path)):
        if isinstance(qa, dict) and qa.get("is_impossible"):
          impossible += 1
          continue
        there = f"{here}.qas[{q}]"
        questions.append((_field(qa, "id", str, there, path),
                          _field(qa, "question", str, there, path).strip()))
      paragraphs.append((f"{a}-{p}", context, questions))
    articles.append((title, paragraphs))
  return articles, impossible


def split_articles(count: int, test_fraction: float, seed: int) -> Tuple[List[int], List[int]]:
  """(training, test) article indices, each sorted: a seeded shuffle, the first
  round(test_fraction * count) for test (at least one on each side)."""
  if not 0 < test_fraction < 1:
    raise ValueError(f"--test_fraction={test_fraction}: must be between 0 and 1")
  if count < 2:
    raise ValueError(f"{count} article(s): the split needs at least 2")
  order = list(range(count))
  random.Random(seed).shuffle(order)
  cut = min(max(round(test_fraction * count), 1), count - 1)
  return sorted(order[cut:]), sorted(order[:cut])


def _jsonl(records) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def convert(squad_file: str, output_dir: str, test_fraction: float = 0.5,
            seed: int = 0) -> Dict[str, int]:
  """Writes the test BEIR folder and the training pairs (see the module docstring); returns
  the counts."""
  articles, impossible = read_articles(squad_file)
  train, test = split_articles(len(articles), test_fraction, seed)
  corpus, queries, qrels = [], [], []
  for index in test:
    title, paragraphs = articles[index]
    for corpus_id, context, questions in paragraphs:
      corpus.append({"_id": corpus_id, "title": title.replace("_", " "), "text": context})
      queries.extend({"_id": qid, "text": question} for qid, question in questions)
      qrels.extend(f"{qid}\t{corpus_id}\t1\n" for qid, _ in questions)
  pairs = [{"query": question, "positive": context}
           for index in train for _, context, questions in articles[index][1]
           for _, question in questions]
  test_dir = filesystem.join(output_dir, "test")
  filesystem.makedirs(filesystem.join(test_dir, "qrels"))
  filesystem.write_text(filesystem.join(test_dir, "corpus.jsonl"), _jsonl(corpus))
  filesystem.write_text(filesystem.join(test_dir, "queries.jsonl"), _jsonl(queries))
  filesystem.write_text(filesystem.join(test_dir, "qrels", "test.tsv"),
                        "query-id\tcorpus-id\tscore\n" + "".join(qrels))
  filesystem.write_text(filesystem.join(output_dir, "train_pairs.jsonl"), _jsonl(pairs))
  return {"articles": len(articles), "train_articles": len(train), "test_articles": len(test),
          "test_documents": len(corpus), "test_queries": len(queries),
          "train_pairs": len(pairs), "unanswerable_left_out": impossible}


_SQUAD_FILE = flags.DEFINE_string("squad_file", None, "SQuAD JSON (v1.1 or v2.0).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where test/ and train_pairs.jsonl go.")
_TEST_FRACTION = flags.DEFINE_float("test_fraction", 0.5, "Share of the articles for test/.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the article shuffle.")


def main(argv):
  del argv
  counts = convert(_SQUAD_FILE.value, _OUTPUT_DIR.value, _TEST_FRACTION.value, _SEED.value)
  print(json.dumps(counts), flush=True)


if __name__ == "__main__":
  flags.mark_flags_as_required(["squad_file", "output_dir"])
  app.run(main)
