"""The run and its setup: the config settled, the components assembled into a session, the run
directory, checkpoints and resume, the memory plan, out-of-memory retries, the metrics written."""
