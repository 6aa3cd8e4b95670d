"""Profile stage: load a model file, run it on its real inputs, find where its time goes."""
