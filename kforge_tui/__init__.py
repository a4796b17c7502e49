"""Kernel Forge's Textual TUI. Importing this package does not import Textual."""
