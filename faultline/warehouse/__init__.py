"""The warehouse: partitioned Parquet tables and a DuckDB catalog of views over them."""
