"""The client layer: NATS and JetStream I/O (connections, the raw JetStream API, the lean protocol parser,
pipelined publishing). It never imports Spark, the option table or any other layer of the package."""
