"""`python -m oncurve.cli` is the `oncurve` command."""

import sys

from oncurve.cli.command import main

sys.exit(main())
