"""The logical plan: nodes and their schemas and digests (nodes), event time (eventtime), how a
graph that has run may evolve (evolve), and the rows of the progress shard that commit a batch
(progress). Plain data, checked when the pipeline is defined. Imports state and below."""
