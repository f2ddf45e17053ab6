"""The warehouse: partitioned Parquet tables and a DuckDB catalog of views over them."""

__all__ = ["QueryError", "SchemaMismatchError", "SchemaVersionError", "Warehouse", "WarehouseError"]


def __getattr__(name: str):  # lazy: importing the schema alone does not load DuckDB
    if name in __all__:
        from faultline.warehouse import store

        return getattr(store, name)
    raise AttributeError(name)
