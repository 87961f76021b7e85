"""`python -m strata_cli`, the same as the `strata` console script."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="strata")
