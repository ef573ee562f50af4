"""python -m vit_fast.cli: the vit-fast command line."""

import sys

from . import main

sys.exit(main())
