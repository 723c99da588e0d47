"""The `supervise` console script: checks that `import supervisor` is this project before using it.

vLLM depends (through model-hosting-container-standards) on supervisord, whose import
package is also named `supervisor`.  Installed into one environment, the two overwrite each
other's files; this module lives outside that package so it can say so plainly.
"""

from __future__ import annotations

import importlib
import sys


def main() -> None:
    try:
        package = importlib.import_module("supervisor")
    except ImportError as exc:
        sys.exit(f"supervise: cannot import its package 'supervisor' ({exc}); reinstall supervise")
    if getattr(package, "__distribution__", None) != "supervise":
        origin = getattr(package, "__file__", None) or "an unknown location"
        sys.exit(
            f"supervise: 'import supervisor' resolves to {origin}, which is supervisord's package "
            "(installed with vLLM), not supervise's. Install supervise in its own environment "
            "(python3 -m venv ~/.venvs/supervise && ~/.venvs/supervise/bin/pip install <repo>) and run "
            "jobs with the interpreter named by `python = ...` in the job spec."
        )
    # Shell completion runs `supervise jobs --names` on every Tab: answered from the standard library alone,
    # before the CLI and its dependencies are imported.
    from supervisor.shell_names import is_names_request
    from supervisor.shell_names import main as names_main

    if is_names_request(sys.argv[1:]):
        sys.exit(names_main(sys.argv[1:]))
    # httpcore imports trio at import time when it is installed: a quarter of a verb's CPU for an async backend the
    # synchronous client never uses (see supervisor/cli/__main__.py).
    sys.modules.setdefault("trio", None)  # type: ignore[arg-type]
    from supervisor.cli import main as cli_main

    sys.exit(cli_main())


if __name__ == "__main__":
    main()
