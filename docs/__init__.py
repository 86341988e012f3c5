"""Documentation assets and the script that makes them (`python -m docs.screenshot`)."""
