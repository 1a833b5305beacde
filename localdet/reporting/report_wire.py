"""The report wire: what a trial's `HTTPReporter` and the daemon's `ReportServer` agree on.

Every request goes to `{API}/{trial id}/...`, names its launch (LAUNCH_HEADER) and carries
that launch's token (TOKEN_HEADER, `Bearer <token>`). Answers are JSON; a refusal is
`{"error": "..."}` with one of the statuses below. Imports nothing: both sides share it.
"""

API = "/v1/trials"
TOKEN_HEADER = "Authorization"
LAUNCH_HEADER = "X-Localdet-Launch"
PGRP_HEADER = "X-Localdet-Pgrp"  # a local launch's process group, checked like SQLite's
CHUNKS_HEADER = "X-Localdet-Chunks"  # a chunk upload's [[sha256, size], ...], body order
# 409: this launch is not (or not yet) the trial's running one; 410: it never will be again.
NOT_RUNNING, STALE = 409, 410
MISSING_BLOBS = 422       # blobs the store lacks (or arrived changed): upload, commit again
INSUFFICIENT_STORAGE = 507
CHUNK = 1 << 20           # bytes read or written at a time when a body is streamed
