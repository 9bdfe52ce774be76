"""Pure tests: no processes, no database."""
