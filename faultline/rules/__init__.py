"""Rule engine: loader and validator, compiler to vectorized matchers, the phases, and the packs."""
