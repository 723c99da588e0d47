"""Where the built-in probe packs and jobs are on disk, in a checkout and in an installed wheel.

The repository keeps them at its top level, `probes/` and `jobs/` (docs/design.md, "The layers").
A wheel carries the same files inside the package, as `supervisor/_builtin/probes` and
`supervisor/_builtin/jobs` (pyproject.toml maps them there), because a non-editable install
copies only packages.  The packaged copy is looked for first; a checkout (editable install, or
the source tree on PYTHONPATH) has none and falls back to the top-level directories.

Both must be real directories, not just readable resources: the job programs under `jobs/` run
under the job's own interpreter, which never imports `supervisor`, with that directory as its
working directory and on its PYTHONPATH.
"""

from __future__ import annotations

from pathlib import Path

import supervisor
from supervisor.core.errors import ConfigError

_PACKAGED = "_builtin"


def probes_dir() -> Path:
    """The built-in probe packs (`*.toml`)."""
    return _builtin("probes")


def jobs_dir() -> Path:
    """The built-in job specs (`*.toml`) and the job programs they run (`eagle3/`, `data/`)."""
    return _builtin("jobs")


def _builtin(name: str) -> Path:
    # The package's own directory (what `importlib.resources.files` gives a package on disk, without
    # its zip reader's import: a tenth of `supervise probe`'s imports).
    root = Path(supervisor.__file__ or "").parent
    if not (root / "__init__.py").is_file():  # a zip import: no directory a job could run from
        raise ConfigError(f"supervise is installed as {root}, not as files; reinstall it with pip")
    packaged = root / _PACKAGED / name
    if packaged.is_dir():
        return packaged
    # A checkout: the package's parent is the repository root.  Returned even when missing,
    # so that a "not found" message names where it looked.
    return root.parent / name
