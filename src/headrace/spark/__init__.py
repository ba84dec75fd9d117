"""PySpark integration: data sources (headrace.queue, headrace.shard) and the pipeline."""
