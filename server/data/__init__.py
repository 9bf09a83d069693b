"""Offline tools over a data directory: ``dreamrt replay`` (regenerate a recorded chunk) and
``dreamrt export`` (the dataset as Parquet)."""
