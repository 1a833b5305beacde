"""What people see and type: the `localdet` command line, its views, logs, metrics and the
web dashboard."""
