"""``python -m sordino`` runs the ``sordino`` command."""

from sordino.cli.entry import main

main()
