"""compositor package."""
