"""`python -m localdet` is the `localdet` command."""

from localdet.ui.cli import main

main()
