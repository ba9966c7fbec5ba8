"""`python -m amlemu`: the `amlemu` command line (what the console script runs)."""
from amlemu.cli import main

main()
