"""`python -m supervisor.cli`."""

import sys

# The CLI's HTTP client (httpx) is synchronous, but httpcore imports trio at import time whenever it is installed
# (selenium brings it into the test environment, other tools into users'): a quarter of the CPU of every verb that
# talks to the daemon, for an async backend no verb uses.  Marked absent in this process only, before anything
# imports httpcore; the console script does the same (supervise_entry.py).
sys.modules.setdefault("trio", None)  # type: ignore[arg-type]

from supervisor.cli import main  # noqa: E402

sys.exit(main())
