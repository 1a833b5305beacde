"""What the daemon watches of its trials beside their own reports: system metrics."""
