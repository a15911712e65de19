"""`python -m cadencerl.cli`: the command line."""

from cadencerl.cli.main import main

main()
