"""Datastores: the registry, Azurite, and the blobfuse-style node cache."""
