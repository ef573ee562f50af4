"""python -m vit_fast: the vit-fast command line."""

import sys

from .cli import main

sys.exit(main())
