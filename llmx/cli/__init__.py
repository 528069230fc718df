"""The typer CLI. Importing it never imports torch."""


def main() -> None:
    import sys

    from llmx.cli.app import main as _main

    sys.exit(_main())
