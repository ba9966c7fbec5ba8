"""`python -m emulator`: the `amlemu` command line (what the console script runs)."""
from .cli import main

main()
