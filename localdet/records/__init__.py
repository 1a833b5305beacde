"""The SQLite database and the one state machine over what it records (experiment and trial
states, pause/resume/kill requests and process exits)."""
