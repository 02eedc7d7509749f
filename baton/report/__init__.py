"""`baton report`: the whole run so far, read from the store alone (any machine, nothing local needed).

The pointer's checkpoint carries metrics.jsonl (every step up to it), the ledger carries every session;
from those: report.md, report.json and PNG plots of loss, throughput and billed hours.
"""

from __future__ import annotations

from .gather import gather
from .write import write_report

__all__ = ["gather", "write_report"]
