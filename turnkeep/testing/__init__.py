"""What you test your own agents with: a fake model API to script, and the pieces turnkeep's own
tests use."""
