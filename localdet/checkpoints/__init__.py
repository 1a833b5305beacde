"""Checkpoints: the content-addressed store (local or S3), manifests, retention rules and
garbage collection, and the free-space reserve every write (checkpoints, launches) keeps."""
