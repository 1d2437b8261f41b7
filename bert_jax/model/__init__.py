"""What every family shares and no family owns: `config` (BertConfig), `layers` (dense and norm
layers, attention paths, sharding annotations), `post_ln` (the 2018 encoder BERT and RoBERTa are
built on), `local_attention`, `splash`, `kernels` and `ops` (building blocks per backend), `heads`
(fine-tuning heads and losses), `flops`, `growth`. The families themselves: `bert_jax.families`."""
