"""Runs: the node contract and launch (mpirun, the launch agent, the process sandbox), the supervisor, logs, data bindings, metrics."""
