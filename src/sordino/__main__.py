"""``python -m sordino`` runs the ``sordino`` command."""

from sordino.cli.main import main

main()
