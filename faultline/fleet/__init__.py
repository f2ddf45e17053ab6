"""Fleet mode: configuration, collect and diagnose over warehouse tables (Prefect flows call these)."""
