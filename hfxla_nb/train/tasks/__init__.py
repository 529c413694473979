"""The fine-tuning tasks, one plug-in module each (see docs/tasks.md)."""
