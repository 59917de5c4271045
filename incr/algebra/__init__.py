"""The algebra: monoids, their inverses, and their SQL forms."""
