"""Machines: the Docker engines a home may place nodes on (issue 31, past one machine).

- address.py: an engine's address as Docker names it (unix://, ssh://user@host, tcp:// with TLS),
  checked; pure.
- registry.py: `Machine` (pure data) and the home's machines in its state database; `local` (this
  machine's engine) is always there, never stored, never removed.
- engines.py: connecting to a machine's engine and reading its cores, memory and GPUs.
- placement.py: which machine each node of a cluster goes on (spread or pack); pure.

Layered between the clusters (which place their nodes) and the backends (which make them).
"""
