"""`python -m qtool` runs the command line."""

from .launch import main

main()
