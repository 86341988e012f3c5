"""turnkeep: durable agent turns on Temporal."""
