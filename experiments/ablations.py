r"""Ablations at small scale, in one command: the paper's Table 5 (MLM + NSP, No NSP, LTR & No
NSP) and appendix C.2 (masking mixtures 80/10/10, 100/0/0, 80/0/20, 80/20/0, 0/20/80, 0/0/100);
with `:study=modern`, what each part of the modern recipe buys added alone to BERT's.

  python -m bert_jax.main --config=experiments/ablations.py --workdir=/tmp/ablations \
    --config.glue.data.glue_dir=../shared/data/glue \
    --config.ner_probe.config.data.data_dir=../shared/data/ner/conll2003/iob1

Every variant pre-trains the demo's model on the demo corpus (experiments/pretrain_demo.py:
Python's own documentation, no download) with the same steps, batch and seed, then fine-tunes on
MRPC, RTE, STS-B (pair tasks, where NSP should matter) and SST-2 with one recipe and 3 seeds; the
C.2 variants are also probed feature-based on CoNLL-2003 NER (a BiLSTM on frozen features, the
paper's last C.2 column). `bert_jax/tasks/jobs/ablations.py` runs it; WORKDIR/ablations.md gets the
table beside the paper's numbers after every variant, and the same command resumes an
interrupted study. Choose variants with `--config.variants=mlm_nsp,no_nsp`; skip the NER probe
with `--config.ner_probe.enabled=False`.
Training sets are cut to their first 8,000 examples (SST-2 is the only one that is longer) so a
2-core CPU can fine-tune 8 variants x 4 tasks x 3 seeds.
`:quick` runs two variants for a few steps on the test fixtures' data (the tests use it).

`:study=modern` (`python -m bert_jax.main --config=experiments/ablations.py:study=modern
--workdir=DIR --config.glue.data.glue_dir=../shared/data/glue`): BERT's demo recipe (the baseline,
`mlm_nsp`) and each part of the modern recipe added alone at the same steps, batch and seed
(`MODERN_PARTS`; bert_jax/tasks/jobs/ablations.py `VARIANTS`): 30% masking; StableAdamW;
warmup-stable-decay; no NSP on contiguous text; the ModernBERT block of the same size (pre-norm,
GeGLU with the MLP's weights, rotary positions, local/global attention, no biases; it has no
NSP head, so it trains on contiguous text and compares with the no-NSP row), the block with
BERT's MLP, the block with every layer global; then all parts together. Pre-norm and rotary
positions are parts of the block, not separable from it here. Every final model is scored on
BERT's 15% held-out masking in both forms (the held-out documents as NSP pairs and as
contiguous text: the same positions for every row), and fine-tuned on SST-2 and STS-B (the two
tasks with signal at this scale; MRPC and RTE carry none) with 3 seeds. Every row trains at the
demo's peak rate, 2e-3, already the high rate a pre-norm model takes (the demo's modern twin uses
it too). `:study=modern,quick` is its test run.

Measured (benchmarks/RESULTS.md, "The paper's ablations at small scale"): ~20 minutes per variant
alone on a 2-core CPU. At the demo's peak learning rate (2e-3) the mixtures that keep no token
unchanged (100/0/0, 80/0/20, 0/0/100) stay on the unigram plateau; at
`--config.pretraining.learning_rate=5e-4` (a fresh workdir) all six C.2 mixtures learn, so the C.2
rows are read from that run.
"""
import ml_collections

from experiments import finetuning_defaults, glue_all, ner_feature_based, pretrain_demo

TABLE5 = "mlm_nsp,no_nsp,ltr_no_nsp"
C2 = "mask_100_0_0,mask_80_0_20,mask_80_20_0,mask_0_20_80,mask_0_0_100"
# The modern recipe's parts, each alone on BERT's recipe, then all together (study=modern).
MODERN_PARTS = ("mlm_nsp,mask_30,stable_adamw,wsd,no_nsp_text,modern_block,modern_block_no_glu,"
                "modern_block_global,modern_recipe")


def get_config(arg=None):
  args = finetuning_defaults.parse_arg(arg, quick=False, study="paper")
  if args["study"] not in ("paper", "modern"):
    raise ValueError(f"study={args['study']!r}: expected paper or modern")
  c = ml_collections.ConfigDict()
  c.task = "ablations"
  c.prng_impl = ""                     # for every piece of the study (common_defaults.py)
  c.variants = f"{TABLE5},{C2}"        # names of bert_jax/tasks/jobs/ablations.py VARIANTS
  # The held-out sets every MLM variant's final model is also scored on, the same positions for
  # all (ablations.py COMMON_EVALS): all_mask (every target [MASK]), pairs, text (BERT's 15% on
  # the held-out documents as NSP pairs / as contiguous text).
  c.common_evals = "all_mask"
  c.pretraining = pretrain_demo.get_config("quick" if args["quick"] else None)
  c.pretraining.eval_steps = 0         # the whole held-out set at the end

  c.glue = glue_all.get_config("seeds=3" + (",quick" if args["quick"] else ""))
  c.glue.glue_tasks = "mrpc,rte,stsb,sst2"
  c.glue.data.max_train_examples = 8000
  c.glue.learning_rate = 1e-4          # a small model from a short pre-training
  c.glue.do_predict = False            # dev scores are the result

  c.ner_probe = ml_collections.ConfigDict()
  c.ner_probe.enabled = True
  c.ner_probe.config = ner_feature_based.get_config("quick" if args["quick"] else None)
  # The paper's C.2 probe concatenates the last four of 12 layers; the demo model has 2.
  c.ner_probe.config.layer_choices = ("weighted_sum_all",)
  c.ner_probe.config.lstm_units = 8 if args["quick"] else 128
  if args["study"] == "modern":
    c.variants = MODERN_PARTS
    c.common_evals = "pairs,text"
    c.glue.glue_tasks = "sst2,stsb"
    c.ner_probe.enabled = False
  if args["quick"] and args["study"] == "modern":
    c.variants = "mlm_nsp,modern_recipe"
    c.glue.glue_tasks = "mrpc"
    c.glue.seeds = 1
    c.pretraining.num_train_steps = 4
  elif args["quick"]:
    c.variants = "mlm_nsp,ltr_no_nsp"
    c.glue.glue_tasks = "mrpc"
    c.glue.seeds = 2
    c.pretraining.num_train_steps = 4
  return c
