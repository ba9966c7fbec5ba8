"""The emulated cluster: the state store, node allocation and autoscale, faults, GPUs."""
