"""What runs around the connector: the CLI, the demo, the pipeline, monitoring, embedded servers, cluster faults."""
