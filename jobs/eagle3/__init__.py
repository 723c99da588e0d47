"""EAGLE-3 job programs: hidden-state extraction (``python -m eagle3.extract``).

This package runs under the job's own interpreter (torch, transformers and, on GPU hosts,
vLLM live there) and never imports the ``supervisor`` package. Run it from the repository
with ``PYTHONPATH=jobs``.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
