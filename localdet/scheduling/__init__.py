"""Where and when queued trials run: the slots (this machine or a Ray cluster), placement of
waiting trials on free slots."""
