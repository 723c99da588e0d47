"""`python -m supervisor.cli`."""

import sys

from . import main

sys.exit(main())
