"""python -m vit_fast: the vit-fast command line."""

import sys

from vit_fast.cli import main

sys.exit(main())
