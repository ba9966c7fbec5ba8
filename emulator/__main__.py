"""`python -m emulator`: the `amlemu` command line (what the console script runs)."""
from emulator.cli import main

main()
