"""The model: `config` (BertConfig), `modeling` (encoder and pre-training heads), `heads`
(fine-tuning heads and losses) and `ops` (building blocks and backend-specific kernels)."""
