"""The fine-tuning tasks, one file each: `<config.task>.py` defines the task's `Task` class as
`TASK` (its data, features, head, loss, predictions, metrics and files); see `tasks.registry`."""
