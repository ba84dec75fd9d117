"""What runs inside Spark tasks: an operator's stage over its buckets (tasks), the control rows
tasks return (control), output parts (outputs), the decoding and checking of queue entries
(decode), the headrace.queue source (queue_source), the static plan's, direct job's and
rescale's task functions, and per-worker caches (workers). Imports plan and the layers below."""
