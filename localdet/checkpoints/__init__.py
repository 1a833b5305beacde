"""Checkpoints: the content-addressed store of content-defined chunks (local or S3),
manifests, retention rules, garbage collection and rechunking, and the free-space reserve
every write (checkpoints, launches) keeps."""
