"""Reading logs with probes defined as data.

- ``load_packs(names=None, paths=())``: probe packs (TOML) by name and from files.
- ``ProbeEngine(packs, start_offset=0)``: ``feed(record)`` / ``feed_many(records)``,
  ``flush()`` and ``resume_offset``; see ``_engine`` for the matching rules.
- ``replay_file(path, pack_names=None, pack_paths=())``: a finished log's ``ReplayReport``.
- ``probe_command(...)``: the ``supervise probe`` command.
- ``fingerprint(exc_type, message, innermost_frame)``: a failure's stable id.
- ``root_cause(failures)``: the attempt's failure (the root cause) among failures in log order;
  ``echoes_only(failures)``: whether they only echo an earlier one (consequences alone).
- ``BarBook``, ``process_of``: which bar a progress line draws, which process wrote a line.
- ``entered_phase(current, implied, recovered=...)``: the phase rule the watchdog and the replay share.
- ``ANSI_RE``: the terminal escape codes a line's text is read without.
"""

from supervisor.probes._engine import ProbeEngine
from supervisor.probes._fingerprint import fingerprint
from supervisor.probes._identity import Bar, BarBook, BarRun, bar_of, process_of
from supervisor.probes._loading import load_packs
from supervisor.probes._pack import Pack, re2_options
from supervisor.probes._phasefold import (
           ends_attempt,
           entered_phase,
           entering_recovers,
           goes_on_serving,
           implied_phase,
           starts_new_attempt,
           survived,
)
from supervisor.probes._prefix import ANSI_RE
from supervisor.probes._replay import ReplayReport, probe_command, replay_file
from supervisor.probes._rootcause import echoes_only, root_cause

__all__ = [
           "ANSI_RE",
           "Bar",
           "BarBook",
           "BarRun",
           "Pack",
           "ProbeEngine",
           "ReplayReport",
           "bar_of",
           "echoes_only",
           "ends_attempt",
           "entered_phase",
           "entering_recovers",
           "fingerprint",
           "goes_on_serving",
           "implied_phase",
           "load_packs",
           "probe_command",
           "process_of",
           "re2_options",
           "replay_file",
           "root_cause",
           "starts_new_attempt",
           "survived",
]
