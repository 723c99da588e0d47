"""Pieces of `docs/gen_reference.py`: each module renders one part of the reference from the code.

    source   comments and docstrings read from the package's own source (enum members, fields)
    cli      every verb and flag, from the argparse parser
    spec     every job spec field, from the pydantic models
    config   the daemon's settings and the SUPERVISE_* environment variables
    api      the HTTP API, from the OpenAPI document and the route table
    tables   exit codes, event kinds, verdicts and states, alerts, metrics
    results  pages copied from elsewhere (tests/perf/RESULTS.md, jobs/README.md), their links fixed
"""
