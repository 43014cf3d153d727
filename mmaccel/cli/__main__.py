"""`python -m mmaccel.cli ...` (what torchrun launches): the `mmaccel` console script."""

import sys

from mmaccel.cli import main

sys.exit(main())
