"""What users write: experiment configs (validated, then typed; every default in the schema),
hyperparameter ranges, and what is chosen from them once at submission (the engine, the Keras
line)."""
