"""Jobs as users write them, read into specs: CLI v2 YAML, SDK v2 and v1 objects, v1 -> v2 conversion, the code snapshot."""
