r"""Fine-tune on every GLUE task and print the GLUE dev score table.

  python -m bert_jax.main --config=experiments/glue_all.py --workdir=/tmp/glue \
    --config.init_checkpoint=PATH --config.data.glue_dir=GLUE_DIR

Each task runs in WORKDIR/<task> (as experiments/glue.py would); the leaderboard files are
collected in WORKDIR/submission/ (zip them for gluebenchmark.com; AX.tsv comes from MNLI), the
table goes to WORKDIR/glue.md and the console. Choose tasks with `--config.glue_tasks=rte,mrpc`;
`:seeds=N` restarts every task N times. `:quick` is the tests' few-step variant.
"""
from experiments import finetuning_defaults, glue

ALL_TASKS = "cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte,wnli"


def get_config(arg=None):
  args = finetuning_defaults.parse_arg(arg, seeds=1, quick=False)
  c = glue.get_config(",".join(f"{k}={v}" for k, v in (("seeds", args["seeds"]),
                                                         ("quick", args["quick"]))))
  c.task = "glue_all"
  c.glue_tasks = ALL_TASKS
  return c
