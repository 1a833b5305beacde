"""What people see and type: the `localdet` command line, its views, logs, metrics, `localdet
run` (the daemon loop in the foreground) and the web dashboard."""
