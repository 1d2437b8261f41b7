"""The fine-tuning framework: the task protocol (`task`), the one fine-tuning loop (`finetuning`)."""
