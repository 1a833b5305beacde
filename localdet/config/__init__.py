"""What users submit: experiment configs (validated, typed), queue submissions, and what is
chosen from them once at submission (the engine, the Keras line)."""
