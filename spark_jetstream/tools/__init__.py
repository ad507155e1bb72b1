"""What a user runs around the connector: the CLI, the demo, the pipeline, the lag listener."""
