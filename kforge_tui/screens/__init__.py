"""One module per screen of the TUI."""
