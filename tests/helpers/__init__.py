"""Helpers that several test modules share, imported as `helpers.<module>` (tests/ is on sys.path)."""
