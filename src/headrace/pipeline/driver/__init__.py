"""What runs on the Spark driver: ``BatchDriver`` (a pipeline's settings, position and the
steps of one micro-batch) and the ways a batch runs — the streaming query (trigger), a restart
(restart), a history batch (history), a rescale (rescale), the static plan (static_plan), the
direct job (direct_job) — plus the per-batch Spark job's plan (job), Spark's checkpoint
(sparklog) and read_stream ingest (streams). Imports exec and the layers below."""
