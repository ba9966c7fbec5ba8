"""Azure ML's data runtime, emulated: the read-only FUSE mount of a v2 `ro_mount` input, served on
the host (settings.py: its environment variables; mountfs.py: the file system; cache.py: its disk
cache; logs.py: its log files; mount.py: mounting, unmounting, cleanup's plan; serve.py: the
serving process). docs/dataruntime.md says why and what it measures."""
