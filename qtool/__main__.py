"""`python -m qtool` runs the command line."""

from .cli import main

main()
