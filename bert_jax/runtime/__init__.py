"""The training runtime every job uses: optimizers, metric writers, length buckets, host memory
options, and the one training loop."""
