"""Writing and checking casts: pick a run's winners, confirm them in a fresh process, check the whole
model, package them (`export_run`), and read one back for `audit`. Needs the engine; loading a cast
(`engine.cast`) does not need this package."""
