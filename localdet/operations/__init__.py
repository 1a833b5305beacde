"""What users do to their experiments, checkpoints and registered models, each done in one
place: `localdet`, `det`, the dashboard and the Python SDK (`determined.experimental.client`,
through `sdk_backend`) are spellings over these functions, so a behaviour is fixed once.

Each function takes the state folder's `Layout` and an open `StateDB`, returns plain data
(dicts, lists, ids) and raises `OperationError` (or `records.db.NotFound`) with one sentence
saying what to fix.
"""
