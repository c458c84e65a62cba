"""Where a pipeline's process groups run: local child processes (the default) or Ray actors."""
