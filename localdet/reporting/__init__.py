"""The daemon side of the `TrialReporter` seam (`determined.core._reporting`): trials report
into SQLite directly or over HTTP to the daemon report server."""
