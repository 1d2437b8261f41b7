"""Speed and quality benchmarks, side by side with the peers; results in benchmarks/RESULTS.md.

Each is a module run from the repository root, e.g. `python -m benchmarks.pretrain_step_throughput`
(the root is then on the import path, so `bert_jax`, `data_pipelines`, `experiments` and the
shared `benchmarks.bench_util` import as they do in the tests).
"""
