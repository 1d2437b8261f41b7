r"""Fine-tune a checkpoint on CoNLL-2003 or WNUT-17 named-entity recognition (spec section 5).

  python -m bert_jax.main --config=experiments/ner.py:dataset=conll2003 --workdir=/tmp/conll \
    --config.init_checkpoint=PATH --config.data.data_dir=../shared/data/ner/conll2003/iob1
  python -m bert_jax.main --config=experiments/ner.py:dataset=conll2003,scheme=iob2 ... \
    --config.data.data_dir=../shared/data/ner/conll2003/iob2
  python -m bert_jax.main --config=experiments/ner.py:dataset=wnut17 --workdir=/tmp/wnut \
    --config.init_checkpoint=PATH --config.data.data_dir=../shared/data/ner/wnut17

Or single files: --config.data.train_file / dev_file / test_file. The label of each word sits on
its first WordPiece; `--config.document_context=true` fills each row with the neighbouring
sentences of the document (the paper's maximal document context). Metric: entity-level
precision / recall / F1 as conlleval / seqeval. Writes WORKDIR/{dev,test}_predictions.txt
(`word gold predicted`, conlleval's input) and results.json.

The paper (BERT-base, CoNLL-2003): dev F1 96.4, test 92.4 (with document context).
`:quick` trains a few steps on the tiny fixtures in experiments/fixtures (shipped with the
package; the tests run it).
"""
import os

from experiments import finetuning_defaults

# Shipped with the package (setup.cfg package_data): an installed bert_jax has no tests folder.
_FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
_QUICK_FILES = {"conll2003": ("conll2003_tiny.iob1", "iob1"), "wnut17": ("wnut17_tiny.conll",
                                                                       "iob2")}


def get_config(arg=None):
  args = finetuning_defaults.parse_arg(arg, dataset="conll2003", scheme="", seeds=1, quick=False)
  c = finetuning_defaults.get_config()
  c.task = "ner"
  c.dataset = args["dataset"]          # conll2003 | wnut17 (sets the label list)
  c.labels = ()                        # override the label list (IOB2 tags, "O" first)
  c.seeds = args["seeds"]
  c.tokenizer.do_lower_case = True
  c.max_seq_length = 128
  c.learning_rate = 5e-5
  c.global_batch_size = 32
  c.num_train_epochs = 3.0
  c.document_context = False           # fill rows with the document's neighbouring sentences
  c.data.scheme = args["scheme"] or ("iob1" if c.dataset == "conll2003" else "iob2")
  c.data.data_dir = ""                 # folder with the dataset's usual file names
  c.data.train_file = ""
  c.data.dev_file = ""
  c.data.test_file = ""
  if args["quick"]:
    finetuning_defaults.quick(c)
    name, scheme = _QUICK_FILES[c.dataset]
    c.data.scheme = scheme
    c.data.train_file = c.data.dev_file = c.data.test_file = os.path.join(_FIXTURES, name)
  return c
