"""The kernel side of fine_tune and predict: load, check and encode the data, then plan the
run, before any fork."""
