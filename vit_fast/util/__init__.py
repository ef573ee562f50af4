"""What every layer above may use: dtypes, batch lists, files (the one writer), progress, numerics, the
environment, interrupts, limits, child processes, lazy package names, the version. Nothing in it imports a model."""
