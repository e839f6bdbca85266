"""The CrewAI integration's tests: run in a venv of their own (see conftest.py)."""
