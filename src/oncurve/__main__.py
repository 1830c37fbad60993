"""`python -m oncurve` is the `oncurve` command (torchrun launches it this way)."""

import sys

from oncurve.cli import main

sys.exit(main())
