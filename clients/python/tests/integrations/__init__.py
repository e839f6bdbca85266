"""Tests of the framework integrations (a package, so that its conftest and helpers do not shadow
those of the tests above)."""
