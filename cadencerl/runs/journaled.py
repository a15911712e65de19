"""A real run with a journal: the controller writes it, and a run started on a journal that holds
records resumes from them (the records and the restore: core/journal.py, core/journal_state.py).

A journal belongs to one run: the workload, batch size and eta it was written with are recorded,
and a run with others is refused rather than resumed on someone else's state.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cadencerl.config import ConfigError
from cadencerl.core.journal import Journal, JournalError
from cadencerl.core.journal_state import fingerprint, replay, restore
from cadencerl.runs.real import RealRun

log = logging.getLogger("cadencerl.journal")


def open_journal(path: str | Path) -> Journal:
    """Own the journal at `path` (ConfigError if another process does, or it cannot be written)."""
    try:
        journal = Journal.open(Path(path))
    except JournalError as exc:
        raise ConfigError(str(exc)) from None
    if journal.recovered.dropped:
        log.warning("journal %s: %s (the damaged file is kept as %s.damaged)", path, journal.recovered.dropped, path)
    return journal


def attach_journal(run: RealRun, journal: Journal, prompts: dict[int, list[int]] | None) -> dict:
    """Make `run`'s controller write `journal` and, if it holds a run, restore from it when the run
    starts. Returns the journal's report, filled in at the start (what was restored and dropped)."""
    ctl, backend = run.controller, run.backend
    fp = fingerprint(run.specs, ctl.credits.batch_size, ctl.credits.eta, prompts, backend.seed)
    state = replay(journal.recovered.records)
    if not state.empty and state.fingerprint != fp:
        raise ConfigError(f"journal: {journal.path} records another run (its workload, batch size or eta "
                          "differ); give a new path to start afresh")
    report: dict = {"path": str(journal.path), "records_read": len(journal.recovered.records),
                    "dropped": journal.recovered.dropped or None, "resumed": not state.empty}
    if state.empty:
        journal.log("run", fingerprint=fp)
        journal.flush(force=True)
    ctl.journal = journal
    backend.streams.on_tokens = journal.tokens

    def on_start() -> None:
        if not state.empty:
            report.update(restore(ctl, state, backend.seed_tokens, backend.set_version, backend.call_tool))
            log.warning("journal %s: resumed (%s)", journal.path, report)

    ctl.on_start = on_start
    return report
