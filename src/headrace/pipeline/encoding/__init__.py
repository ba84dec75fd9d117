"""Bytes and types every other layer shares: the sortable row-key encoding (rowkeys), columnar
queue entries (columnar), Spark's xxhash64 (sparkhash), Arrow and Spark SQL types (types) and
Arrow IPC (ipc). Imports nothing of the pipeline but errors and names."""
