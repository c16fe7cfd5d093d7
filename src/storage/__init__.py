"""Storage backends behind the store actors (in-memory now; a durable one can replace it)."""
