"""The jetstream sink: batch and streaming writers, exactly-once."""
