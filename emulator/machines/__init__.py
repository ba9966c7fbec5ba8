"""Machines: the Docker engines a home may place nodes on (issue 31, past one machine).

- address.py: an engine's address as Docker names it (unix://, ssh://user@host, tcp:// with TLS),
  checked; pure.
- registry.py: `Machine` (pure data) and the home's machines in its state database; `local` (this
  machine's engine) is always there, never stored, never removed.
- engines.py: connecting to a machine's engine and reading its cores, memory and GPUs.
- placement.py: which machine each node of a cluster goes on (spread or pack); pure.
- swarm.py: the swarm (network only) and one attachable overlay network per cluster that spans
  machines; the cleanup of both as Actions (plan_reap). docs/swarm.md.
- rig.py, rigproc.py: the test rig, a second Docker engine on this machine in its own network
  namespace, reached over a veth link (`python -m amlemu.machines.rig up|down|status|check`).

Layered between the clusters (which place their nodes) and the backends (which make them).
"""
