"""python -m moebatch: the same CLI as the `moebatch` command."""
import sys

from .cli import main

sys.exit(main())
