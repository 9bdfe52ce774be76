"""Real controller, worker and CLI processes (every test here is marked e2e by tests/conftest.py)."""
