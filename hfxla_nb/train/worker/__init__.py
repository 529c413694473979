"""The worker side of fine_tune and predict: the training loop, evaluation, checkpoints and
saving. It runs in the launched processes, never in the kernel."""
